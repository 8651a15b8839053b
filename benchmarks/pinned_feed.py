"""Batches in pinned slots on a GPU node: host-to-device GB/s, and the training step's wait for data.

    python3 benchmarks/pinned_feed.py --out results/pinned_feed.json     # on a GPU node (benchmarks/node.sh)
    python3 benchmarks/pinned_feed.py --rows 600 --epochs 1             # a quick look

Needs CUDA: without it the script says so and exits with status 2 (nothing is measured on a CPU: there is no copy
to a device to time). ``--check-on-cpu`` runs every step on the CPU instead, to find a mistake before a loan;
its figures mean nothing.

On ``windows.py``'s store of one-step chunks (time steps of 8 x 32 x 32 float32), windows of 2 + 4 steps, batch 32:

1. **copy rates**: the card's own host-to-device rate (one 256 MiB pinned tensor, ``non_blocking``); each batch
   of a ``ZarrDataLoader(pin_memory=True)`` with 0 workers, whose tensors lie in the loader's pinned slots
   (``zarrtorch/_workers/pinned.py``: checked for every batch, by ``data_ptr``), copied with
   ``.to("cuda", non_blocking=True)``; the same batches from a loader without ``pin_memory``, copied into pinned
   memory first (``Tensor.pin_memory()``, what DataLoader's pinning does) and then to the GPU; and copied
   straight from pageable memory. GB/s of batch from the call to the end of the copy (the stream synchronized),
   over ``--epochs`` epochs.
2. **data wait**: a small forecaster (two 3x3 convolutions, as ``gpu_feed.py``) trained with 0 and 2 workers,
   ``pin_memory=True``, ``non_blocking`` copies, ``loss.item()`` each step (a loop that logs its loss): windows/s,
   the time each step waited in ``next()`` for its batch (mean and median, ms) and the share of the epoch spent
   waiting. The first epoch (workers' start, CUDA's first kernels) is reported apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

NO_CUDA = (
    "benchmarks/pinned_feed.py measures copies from host memory to a GPU, and this machine has none "
    "(torch.cuda.is_available() is False): nothing measured. Run it on a GPU node (benchmarks/node.sh, "
    'STEPS="pinned"), or pass --check-on-cpu to check the script itself (figures meaningless)'
)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def card_rate(device: torch.device, *sizes_mib: float, repeats: int = 10) -> float:
    """GB/s of pinned tensors of ``sizes_mib`` (default one of 256 MiB, the card's own rate) copied to the device
    in turn, ``repeats`` times, after one untimed round."""
    sources = [
        torch.empty(int(mib * 2**20), dtype=torch.uint8, pin_memory=device.type == "cuda")
        for mib in sizes_mib or (256,)
    ]
    targets = [torch.empty_like(src, device=device) for src in sources]
    for timed in (False, True):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats if timed else 1):
            for dst, src in zip(targets, sources, strict=True):
                dst.copy_(src, non_blocking=True)
        synchronize(device)
    return repeats * sum(src.numel() for src in sources) / (time.perf_counter() - start) / 1e9


def pinned_copy(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` copied into pinned memory (on the CPU check: into ordinary memory, pinning needs CUDA)."""
    return t.pin_memory() if device.type == "cuda" else t.clone()


def ordinary_slots() -> None:
    """The CPU check: the loader's pinned slots in ordinary memory, as the package's tests make them."""
    from zarrtorch._workers import pinned

    pinned.pinned_memory = lambda: (lambda n: torch.empty(n, dtype=torch.uint8), False)


def loader_of(path: Path, workers: int, pin: bool):
    from windows import WINDOWS

    from zarrtorch import ZarrDataLoader, ZarrIterableDataset

    ds = ZarrIterableDataset(path, windows=WINDOWS, seed=0)
    extra = {"persistent_workers": True} if workers else {}
    return ZarrDataLoader(ds, batch_size=32, num_workers=workers, pin_memory=pin, **extra)


def copy_rate(path: Path, device: torch.device, way: str, epochs: int) -> dict:
    """GB/s of every batch copied to ``device`` one ``way``: ``slots`` (pinned slots, no copy on the host),
    ``pin copy`` (pinned by a copy, then sent), ``pageable`` (sent from ordinary memory)."""
    loader = loader_of(path, 0, pin=way == "slots")
    slots = loader.job.pinned
    if way == "slots" and slots is None:
        raise RuntimeError("ZarrDataLoader(pin_memory=True, num_workers=0) made no pinned slots on this machine")
    seconds = nbytes = batches = in_slots = pinned = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            if slots is not None:
                in_slots += all(slots.holds(t) for t in batch.values())
            pinned += device.type == "cuda" and all(t.is_pinned() for t in batch.values())
            start = time.perf_counter()
            host = {k: pinned_copy(v, device) for k, v in batch.items()} if way == "pin copy" else batch
            on_device = {k: v.to(device, non_blocking=way != "pageable") for k, v in host.items()}
            synchronize(device)
            seconds += time.perf_counter() - start
            nbytes += sum(t.numel() * t.element_size() for t in on_device.values())
            batches += 1
            del batch, host, on_device
    return {
        "gb_s": nbytes / seconds / 1e9,
        "batches": batches,
        "in_slots": in_slots,
        "pinned": pinned,
        "mib_per_batch": nbytes / batches / 2**20,
    }


def model_for(device: torch.device) -> torch.nn.Module:
    channels = 8  # per time step
    return torch.nn.Sequential(
        torch.nn.Conv2d(2 * channels, 64, 3, padding=1),
        torch.nn.GELU(),
        torch.nn.Conv2d(64, 4 * channels, 3, padding=1),
    ).to(device)


def data_wait(path: Path, device: torch.device, workers: int, epochs: int) -> list[dict]:
    """Each epoch's windows/s and the step's wait for its batch, training with ``workers`` workers."""
    torch.manual_seed(0)
    loader = loader_of(path, workers, pin=True)
    model = model_for(device)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        waits, n = [], 0
        start = time.perf_counter()
        it = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - asked)
            x = batch["fields"].to(device, non_blocking=True).flatten(1, 2)
            y = batch["fields_target"].to(device, non_blocking=True).flatten(1, 2)
            del batch
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()  # a loop that logs its loss waits for the step
            n += len(x)
        seconds = time.perf_counter() - start
        out.append(
            {
                "windows_s": n / seconds,
                "wait_ms_mean": 1e3 * statistics.mean(waits),
                "wait_ms_median": 1e3 * statistics.median(waits),
                "wait_share": sum(waits) / seconds,
                "steps": len(waits),
            }
        )
    return out


def copy_sizes(device: torch.device, sizes_mib: list[float], repeats: int = 50) -> dict[str, float]:
    """GB/s of one pinned tensor of each size copied to the device, and of a windows batch's two tensors (2 and
    4 MiB) copied one after the other: whether the slots' rate is the card's rate at a batch's size."""
    rates = {f"{mib:g} MiB": card_rate(device, mib, repeats=repeats) for mib in sizes_mib}
    rates["2 + 4 MiB, two copies"] = card_rate(device, 2, 4, repeats=repeats)
    return rates


def main(argv: list[str] | None = None) -> dict:
    from gpu_feed import feed_arguments
    from windows import generated_store

    p = feed_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--out", default=None)
    p.add_argument("--check-on-cpu", action="store_true", help="run every step on the CPU: figures meaningless")
    p.add_argument(
        "--copy-sizes", type=float, nargs="*", default=None, help="only the card's rate at these sizes (MiB)"
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.check_on_cpu:
        print(NO_CUDA, file=sys.stderr)
        raise SystemExit(2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (a check of the script only)"
    if args.copy_sizes is not None:
        rates = copy_sizes(device, args.copy_sizes or [1, 2, 4, 6, 16, 64, 256])
        for what, gb_s in rates.items():
            print(f"{name}: host-to-device from pinned memory, {what}: {gb_s:.1f} GB/s", flush=True)
        return {"device": name, "copy_sizes": rates}
    path = generated_store(args.rows, 1, args.data_dir)
    result = {"device": name, "card_gb_s": card_rate(device), "copies": {}, "wait": {}}
    print(f"{name}: the card's host-to-device rate {result['card_gb_s']:.1f} GB/s (256 MiB, pinned)", flush=True)
    if device.type != "cuda":
        ordinary_slots()
    for way in ("slots", "pin copy", "pageable"):
        r = result["copies"][way] = copy_rate(path, device, way, args.epochs)
        print(
            f"  batches of {r['mib_per_batch']:.1f} MiB, {way:<9}: {r['gb_s']:6.2f} GB/s "
            f"({r['gb_s'] / result['card_gb_s']:.2f} x the card's), {r['in_slots']}/{r['batches']} in the loader's "
            f"pinned slots, {r['pinned']} pinned as DataLoader hands them out",
            flush=True,
        )
    for workers in args.workers:
        epochs = result["wait"][workers] = data_wait(path, device, workers, args.epochs)
        for k, e in enumerate(epochs):
            print(
                f"  training, {workers} workers, epoch {k + 1}{' (start)' if k == 0 else ''}: "
                f"{e['windows_s']:,.0f} windows/s, wait per step {e['wait_ms_mean']:.2f} ms mean / "
                f"{e['wait_ms_median']:.2f} median, {e['wait_share']:.0%} of the epoch waiting",
                flush=True,
            )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
