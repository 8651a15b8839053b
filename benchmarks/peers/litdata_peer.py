"""LitData 0.2.76: ``optimize`` the store into LitData chunks once, then ``StreamingDataset`` +
``StreamingDataLoader``.

Recipe: github.com/Lightning-AI/litData README.md, "Speed up model training" (``ld.optimize(fn, inputs,
output_dir, num_workers, chunk_bytes="64MB")``, then ``StreamingDataset(dir, shuffle=True, drop_last=True,
seed=...)`` in a ``StreamingDataLoader``; resume with ``loader.state_dict()`` / ``load_state_dict()``) and
src/litdata/utilities/env.py (``_DistributedEnv.detect``: ``WORLD_SIZE`` and ``GLOBAL_RANK`` set the rank
without a process group, which is how the simulated ranks are given). ``fn`` reads one Zarr chunk per input
and yields its rows (each a dict with the row number ``idx`` and the sample ``x``), so the conversion decodes
every chunk once. An epoch is one more ``iter(loader)``: the loader counts the epochs itself.
"""

import os
import sys

import numpy as np
import zarr
from common import Ctx, LoaderStatePeer, main
from litdata import StreamingDataLoader, StreamingDataset, optimize


def chunk_rows_of(args):
    """optimize's ``fn``: one Zarr chunk in, its rows out."""
    store, start, stop = args
    group = zarr.open_group(store, mode="r")
    x, idx = group["x"][start:stop], group["idx"][start:stop]
    for i in range(stop - start):
        yield {"idx": int(idx[i]), "x": np.ascontiguousarray(x[i])}


class LitData(LoaderStatePeer):
    name = "LitData"
    recipe = "github.com/Lightning-AI/litData README.md (optimize, StreamingDataset, StreamingDataLoader)"
    converts = True

    def convert(self, ctx: Ctx) -> None:
        inputs = [(ctx.store, s, min(s + ctx.chunk_rows, ctx.rows)) for s in range(0, ctx.rows, ctx.chunk_rows)]
        optimize(
            fn=chunk_rows_of,
            inputs=inputs,
            output_dir=str(ctx.converted),
            num_workers=2,
            chunk_bytes="64MB",
            verbose=False,
        )

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        os.environ["WORLD_SIZE"], os.environ["GLOBAL_RANK"] = str(world), str(rank)
        dataset = StreamingDataset(str(ctx.converted), shuffle=True, drop_last=True, seed=ctx.seed)
        return StreamingDataLoader(dataset, batch_size=ctx.batch_size, num_workers=workers)

    def open_remote(self, ctx: Ctx, *, remote: str, cache_dir, workers: int):
        """The cache case: the chunks' bucket as the dataset's directory, ``cache_dir`` the node's cache
        (README.md, "Stream data from cloud storage")."""
        os.environ["WORLD_SIZE"], os.environ["GLOBAL_RANK"] = "1", "0"
        dataset = StreamingDataset(remote, cache_dir=str(cache_dir), shuffle=True, drop_last=True, seed=ctx.seed)
        return StreamingDataLoader(dataset, batch_size=ctx.batch_size, num_workers=workers)


class LitDataHttpAllowed(LitData):
    """The cache case only: LitData fetches chunks from S3 with obstore, built with client options of its own
    (``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``) that do not allow plain HTTP, and without them
    obstore ignores ``AWS_ALLOW_HTTP``; a stand-in on ``http://`` is then refused. This variant adds
    ``allow_http`` to those options (a patch, not the documented recipe) to see what its cache does."""

    name = "LitData, obstore allowed http (patched)"

    def open_remote(self, ctx: Ctx, *, remote: str, cache_dir, workers: int):
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
        return super().open_remote(ctx, remote=remote, cache_dir=cache_dir, workers=workers)


if __name__ == "__main__":
    patched = "--allow-http" in sys.argv
    if patched:
        sys.argv.remove("--allow-http")
    main(LitDataHttpAllowed() if patched else LitData())
