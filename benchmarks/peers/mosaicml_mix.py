"""MosaicML Streaming 0.13's mixing: one ``Stream`` per store (each converted to MDS by ``mosaicml_peer.py``), read
by one ``StreamingDataset(streams=[...])`` in a ``StreamingDataLoader``.

Recipe: github.com/mosaicml/streaming docs/source/dataset_configuration/mixing_data_sources.md (``Stream(local=...,
proportion=...)`` with ``epoch_size``: the rows of an epoch split by proportion, a stream asked for more than it
holds upsampled; ``choose``: a stream's rows per epoch as a number; ``repeat``: a multiple of its size; section
"Batching Methods": ``batching_method='random'``, the default, mixes the streams in each batch, ``'per_stream'``
makes each global batch of one stream). Ranks simulated as in ``mosaicml_peer.py``: two nodes of one rank each,
from ``RANK`` / ``WORLD_SIZE``.
"""

import os

import torch.distributed as dist
from mix_case import Mixer, main
from mosaicml_peer import Mosaic  # first: it installs the torchvision stand-ins before streaming is imported
from streaming import Stream, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory


class MosaicMix(Mixer):
    name = "MosaicML Streaming"
    recipe = "github.com/mosaicml/streaming docs/source/dataset_configuration/mixing_data_sources.md"
    peer = Mosaic()
    variants = {
        "proportion": "Stream(proportion=w), epoch_size=n; batching_method='random' (the default)",
        "proportion, per_stream": "the same with batching_method='per_stream'",
        "choose": "Stream(choose=w x n rows), no epoch_size",
    }

    def open(self, ctx, variant, *, rank, world):
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        if world > 1 and not dist.is_initialized():  # a group of this process alone, as in mosaicml_peer.py
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        clean_stale_shared_memory()
        total = sum(ctx.weights)
        if variant == "choose":
            asked = zip(ctx.sources, ctx.targets(), strict=True)
            streams = [Stream(local=str(s.converted), choose=t) for s, t in asked]
            epoch_size = None
        else:
            asked = zip(ctx.sources, ctx.weights, strict=True)
            streams = [Stream(local=str(s.converted), proportion=w / total) for s, w in asked]
            epoch_size = ctx.epoch_rows
        dataset = StreamingDataset(
            streams=streams,
            epoch_size=epoch_size,
            shuffle=True,
            shuffle_seed=ctx.seed,
            batch_size=ctx.batch_size,
            num_canonical_nodes=1,
            batching_method="per_stream" if variant.endswith("per_stream") else "random",
        )
        return StreamingDataLoader(dataset, batch_size=ctx.batch_size, num_workers=ctx.workers, drop_last=True)


if __name__ == "__main__":
    main(MosaicMix())
