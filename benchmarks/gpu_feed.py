"""Windows fed to a small forecaster on the GPU: windows/s trained, with 0 and 2 DataLoader workers.

    .venv/bin/python benchmarks/gpu_feed.py                     # the one-step-chunk store of windows.py
    .venv/bin/python benchmarks/gpu_feed.py --rows 400 --epochs 2   # a quick look (tests run this, on the CPU)

The store is ``windows.py``'s (time steps of 8 x 32 x 32 float32 in one-step chunks, generated once); each sample
is a window of 2 input and 4 target steps, batch 32, the loader's default settings with ``pin_memory`` and
``non_blocking`` copies on a GPU. The model (two 3x3 convolutions, inputs stacked as channels) is small on
purpose: the figure is how many windows the loader gets to a training step that costs little, which is where the
loader's threads and the training loop compete for the same process. Each epoch's rate is printed; the first
epoch includes starting the workers and CUDA's first kernels. Runs on the CPU where there is no GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from zarrtorch import ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch.windows import Windows  # noqa: E402


def trained_rates(path: Path, workers: int, epochs: int, device: torch.device) -> tuple[list[float], int]:
    """Windows/s of each epoch of training on ``device`` from a fresh loader with ``workers`` workers, and the
    windows an epoch trained on."""
    torch.manual_seed(0)
    ds = ZarrIterableDataset(path, windows=Windows(history=2, lead=4), seed=0)
    on_gpu = device.type == "cuda"
    loader = ZarrDataLoader(ds, batch_size=32, num_workers=workers, pin_memory=on_gpu, persistent_workers=workers > 0)
    channels = 8  # per time step
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2 * channels, 64, 3, padding=1),
        torch.nn.GELU(),
        torch.nn.Conv2d(64, 4 * channels, 3, padding=1),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    rates = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        n, start = 0, time.perf_counter()
        for batch in loader:
            x = batch["fields"].to(device, non_blocking=True).flatten(1, 2)  # (B, 2 x 8, 32, 32)
            y = batch["fields_target"].to(device, non_blocking=True).flatten(1, 2)  # (B, 4 x 8, 32, 32)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            n += len(x)
        if on_gpu:
            torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - start))
    return rates, n


def feed_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The store and runs a GPU feeding benchmark takes (this script's and ``pinned_feed.py``'s)."""
    from windows import DATA

    p.add_argument("--rows", type=int, default=4000, help="time steps of the generated store")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--data-dir", default=str(DATA), help="where the generated store is kept")
    return p


def main(argv: list[str] | None = None) -> dict:
    from windows import generated_store

    args = feed_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0])).parse_args(argv)
    path = generated_store(args.rows, 1, args.data_dir)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    out = {}
    for workers in args.workers:
        out[workers], windows = trained_rates(path, workers, args.epochs, device)
        rates = ", ".join(f"{r:,.0f}" for r in out[workers])
        print(f"{name}, {workers} workers: windows/s trained per epoch {rates} ({windows} windows each)", flush=True)
    return out


if __name__ == "__main__":
    main()
