"""zarrtorch's mixing: one ``ZarrDataLoader`` per store, drawn by ``MixedLoader(weights=..., epoch_rows=...)``.

Recipe: this repository, docs/mix.md (per-source batches, every rank the same source at each step; a quota above
a store's rows runs into its next own epoch). Simulated ranks through each loader's ``rank=``/``world_size=``.
"""

from mix_case import Mixer, main
from zarrtorch_peer import Zarrtorch

from zarrtorch import MixedLoader


class ZarrtorchMix(Mixer):
    name = "zarrtorch"
    recipe = "this repository: docs/mix.md (MixedLoader)"
    variants = {"weights": "MixedLoader(loaders, weights=w, epoch_rows=n): per-source batches"}

    def open(self, ctx, variant, *, rank, world):
        peer, workers = Zarrtorch(), ctx.workers
        loaders = {f"s{k}": peer.open(s, rank=rank, world=world, workers=workers) for k, s in enumerate(ctx.sources)}
        weights = {f"s{k}": w for k, w in enumerate(ctx.weights)}
        return MixedLoader(loaders, weights=weights, epoch_rows=ctx.epoch_rows, seed=ctx.seed)

    def epoch(self, loader, epoch):
        loader.set_epoch(epoch)
        return iter(loader)


if __name__ == "__main__":
    main(ZarrtorchMix())
