"""Grain 0.2.18's mixing: one ``MapDataset`` per store, shuffled, mixed by ``MapDataset.mix(datasets, weights)``.

Recipe: the ``MapDataset.mix`` docstring ("Length of the mixed dataset will be determined by the length of the
shortest input dataset. If you need an infinite dataset consider repeating the input datasets before mixing";
"shuffle the input datasets before mixing") and ``MapDataset.shuffle`` ("``shuffle`` before ``repeat``"), with
docs/tutorials/dataset_basic_tutorial.md (``batch``, then slicing the batched dataset, ``ds[rank::world]``, as
"the easiest way to shard", then ``to_iter_dataset``). Variant ``mix``: the shuffled stores mixed as they are (an
epoch ends with the first store that runs out); ``repeat, mix, slice``: each shuffled store repeated without end,
mixed, the first ``epoch_rows`` rows kept. Each store is read by ``grain_peer.py``'s ``ZarrRowSource`` (a row
decodes its chunk, kept for the next rows); a new order every epoch, from the seed and the epoch, as
``grain_peer.py`` does.
"""

import grain
from grain_peer import ZarrRowSource
from mix_case import Mixer, main


class GrainMix(Mixer):
    name = "Grain"
    recipe = "github.com/google/grain MapDataset.mix docstring, docs/tutorials/dataset_basic_tutorial.md"
    variants = {
        "mix": "MapDataset.mix([a.shuffle(), b.shuffle()], weights=w)",
        "repeat, mix, slice": "MapDataset.mix([a.shuffle().repeat(), b.shuffle().repeat()], weights=w)[:n]",
    }

    def open(self, ctx, variant, *, rank, world):
        sources = [ZarrRowSource(s.store, ctx.chunk_rows, keep=16) for s in ctx.sources]
        return {"ctx": ctx, "variant": variant, "rank": rank, "world": world, "sources": sources}

    def epoch(self, loader, epoch):
        ctx, seed = loader["ctx"], loader["ctx"].seed + 1000 * epoch
        parts = []
        for k, source in enumerate(loader["sources"]):
            part = grain.MapDataset.range(len(source)).shuffle(seed=seed + k)
            if loader["variant"] != "mix":
                part = part.repeat()
            parts.append(part.map(source.__getitem__))
        mixed = grain.MapDataset.mix(parts, weights=ctx.weights)
        if loader["variant"] != "mix":
            mixed = mixed[: ctx.epoch_rows]
        batches = mixed.batch(ctx.batch_size, drop_remainder=True)
        shard = batches[loader["rank"] :: loader["world"]]  # the tutorial's shard: a slice of the final dataset
        it = shard.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=2 * ctx.batch_size))
        if ctx.workers:
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=ctx.workers))
        return iter(it)


if __name__ == "__main__":
    main(GrainMix())
