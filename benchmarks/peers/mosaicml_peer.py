"""MosaicML Streaming 0.13: the store written once into MDS shards with ``MDSWriter``, read with
``StreamingDataset`` in a ``StreamingDataLoader``.

Recipe: github.com/mosaicml/streaming README.md and docs/source/preparing_datasets/basic_dataset_conversion.md
(``MDSWriter(out=..., columns={...}, compression=...)``, one ``write`` per sample), docs/source/
distributed_training/ (the rank from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``; the
simulated ranks are two nodes of one rank each, so no rank waits for a local peer) and
docs/source/distributed_training/fast_resumption.md (``StreamingDataLoader.state_dict()`` /
``load_state_dict``, elastic over ``num_canonical_nodes``). Shards uncompressed (the store's zstd gains
about 2:1 on these values; MDS compresses whole shards, which costs a shard's decode per random read). An
epoch is one more ``iter(loader)``: the dataset counts epochs. ``torchvision`` (imported by ``streaming.vision``,
unused here) is replaced by stand-ins when the registry's build does not load (``torchvision_stub.py``).
"""

import os

import numpy as np
import torch.distributed as dist
import torchvision_stub
import zarr
from common import Ctx, LoaderStatePeer, main

torchvision_stub.install()  # the registry's torchvision for torch 2.13 is a CUDA build: see the module

from streaming import MDSWriter, StreamingDataLoader, StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402


class Mosaic(LoaderStatePeer):
    name = "MosaicML Streaming"
    recipe = "github.com/mosaicml/streaming README.md, docs/source/preparing_datasets, docs/source/distributed_training"
    converts = True

    def convert(self, ctx: Ctx) -> None:
        group = zarr.open_group(ctx.store, mode="r")
        shape = ",".join(map(str, group["x"].shape[1:]))
        columns = {"idx": "int64", "x": f"ndarray:float32:{shape}"}
        with MDSWriter(out=str(ctx.converted), columns=columns, compression=None) as out:
            for s in range(0, ctx.rows, ctx.chunk_rows):
                x, idx = group["x"][s : s + ctx.chunk_rows], group["idx"][s : s + ctx.chunk_rows]
                for i in range(len(idx)):
                    out.write({"idx": np.int64(idx[i]), "x": x[i]})

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        if world > 1 and not dist.is_initialized():
            # StreamingDataset starts torch.distributed itself when WORLD_SIZE > 1 and none is running, and would
            # wait for the other rank; the ranks here run in turn in one process. It uses the group only for
            # barriers among a node's ranks (none here: one rank per node), so a group of this process alone
            # stands in; which samples a rank reads comes from RANK / WORLD_SIZE above.
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        clean_stale_shared_memory()
        dataset = StreamingDataset(
            local=str(ctx.converted),
            shuffle=True,
            shuffle_seed=ctx.seed,
            batch_size=ctx.batch_size,
            num_canonical_nodes=1,
        )
        return StreamingDataLoader(dataset, batch_size=ctx.batch_size, num_workers=workers, drop_last=True)

    def open_remote(self, ctx: Ctx, *, remote: str, cache_dir, workers: int):
        """The cache case: ``remote=`` the shards' bucket, ``local=`` the node's cache (docs/source/
        dataset_configuration/shard_retrieval.md), kept whole (no ``cache_limit``)."""
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        clean_stale_shared_memory()
        dataset = StreamingDataset(
            remote=remote,
            local=str(cache_dir),
            shuffle=True,
            shuffle_seed=ctx.seed,
            batch_size=ctx.batch_size,
            num_canonical_nodes=1,
        )
        return StreamingDataLoader(dataset, batch_size=ctx.batch_size, num_workers=workers, drop_last=True)


if __name__ == "__main__":
    main(Mosaic())
