"""LitData 0.2.76's mixing: one ``StreamingDataset`` per store (each ``optimize``d by ``litdata_peer.py``), drawn by
``CombinedStreamingDataset`` in a ``StreamingDataLoader``.

Recipe: github.com/Lightning-AI/litData README.md, "Combine datasets" (``CombinedStreamingDataset(datasets,
weights=..., iterate_over_all=False, seed=...)``: samples drawn by weight until one dataset runs out; the default
``iterate_over_all=True`` reads every dataset to its end, the weights then unused) and the class's
``batching_method`` (``stratified``, the default, mixes the datasets in each batch; ``per_stream``: each batch of
one dataset). There is no rows-per-epoch setting: an epoch ends when a dataset runs out. Ranks simulated as in
``litdata_peer.py`` (``WORLD_SIZE`` / ``GLOBAL_RANK``).
"""

import os

from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
from litdata_peer import LitData
from mix_case import Mixer, main


class LitDataMix(Mixer):
    name = "LitData"
    recipe = "github.com/Lightning-AI/litData README.md (CombinedStreamingDataset)"
    peer = LitData()
    variants = {
        "weights": "CombinedStreamingDataset(weights=w, iterate_over_all=False); batching_method='stratified'",
        "weights, per_stream": "the same with batching_method='per_stream'",
        "iterate_over_all": "CombinedStreamingDataset(iterate_over_all=True): every dataset read to its end",
    }

    def open(self, ctx, variant, *, rank, world):
        os.environ["WORLD_SIZE"], os.environ["GLOBAL_RANK"] = str(world), str(rank)
        seed = ctx.seed
        datasets = [StreamingDataset(str(s.converted), shuffle=True, drop_last=True, seed=seed) for s in ctx.sources]
        if variant == "iterate_over_all":
            combined = CombinedStreamingDataset(datasets, seed=ctx.seed, iterate_over_all=True)
        else:
            method = "per_stream" if variant.endswith("per_stream") else "stratified"
            weights = [w / sum(ctx.weights) for w in ctx.weights]
            combined = CombinedStreamingDataset(
                datasets, seed=ctx.seed, weights=weights, iterate_over_all=False, batching_method=method
            )
        return StreamingDataLoader(combined, batch_size=ctx.batch_size, num_workers=ctx.workers)

    def targets(self, ctx, variant):
        """``iterate_over_all`` asks for every store whole, whatever the weights."""
        return list(ctx.rows) if variant == "iterate_over_all" else ctx.targets()


if __name__ == "__main__":
    main(LitDataMix())
