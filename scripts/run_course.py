"""Run the whole course headless: generate the data, execute every notebook in order, print the times.

Executed copies go to ``data/<size>/executed/`` so the committed notebooks (with their tiny-data outputs,
checked by nbval) stay untouched. Exits non-zero if any notebook fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gpus() -> int:
    """CUDA devices visible here, counted without initialising CUDA in this process."""
    from lightning.fabric.accelerators.cuda import num_cuda_devices

    return num_cuda_devices()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", default=os.environ.get("ZARRTORCH_SIZE", "small"), choices=("tiny", "small", "workshop"))
    p.add_argument("--only", nargs="*", help="notebook name prefixes to run (default: all)")
    p.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="seconds allowed per cell (default 3600; 10800 for workshop on a machine without a GPU)",
    )
    a = p.parse_args(argv)
    if a.timeout is None:
        a.timeout = 3600
        if a.size == "workshop" and not gpus():
            a.timeout = 3 * 3600
            print(
                "[course] workshop size without a GPU: lessons 05 and 06 train the 128 x 256 grid on the CPU. That "
                "size is for a GPU node; on the 2-core machine the course was written on they took 35 minutes.",
                flush=True,
            )

    os.environ["ZARRTORCH_SIZE"] = a.size
    import nbformat
    from nbclient import NotebookClient

    from zarrtorch.course.paths import data_dir
    from zarrtorch.course.synthetic import make_data

    rows: list[tuple[str, float, str]] = []
    t0 = time.perf_counter()
    print(f"[course] generating the {a.size!r} data (skipped if present)", flush=True)
    make_data(a.size, progress=sys.stdout.isatty())
    rows.append(("make-data", time.perf_counter() - t0, "ok"))
    print(f"[course] data ready in {rows[-1][1]:.1f} s", flush=True)

    out_dir = data_dir(a.size) / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9A-Z][0-9]_*.ipynb"))
    if a.only:
        notebooks = [nb for nb in notebooks if any(nb.name.startswith(pfx) for pfx in a.only)]
    for nb_path in notebooks:
        nb = nbformat.read(nb_path, as_version=4)
        client = NotebookClient(
            nb, timeout=a.timeout, kernel_name="zarrtorch", resources={"metadata": {"path": str(nb_path.parent)}}
        )
        start = time.perf_counter()
        print(f"[course] {nb_path.name} ...", flush=True)
        try:
            client.execute()
            status = "ok"
        except Exception as exc:  # report and go on: one failing lesson should not hide the others
            status = f"FAILED: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
        elapsed = time.perf_counter() - start
        nbformat.write(nb, out_dir / nb_path.name)
        rows.append((nb_path.name, elapsed, status))
        print(f"[course] {nb_path.name}: {elapsed:.1f} s {status}", flush=True)

    total = time.perf_counter() - t0
    width = max(len(r[0]) for r in rows)
    shown = out_dir.relative_to(ROOT) if out_dir.is_relative_to(ROOT) else out_dir
    print(f"\nCourse run on size {a.size!r} (executed notebooks in {shown}):")
    for name, secs, status in rows:
        print(f"  {name:<{width}}  {secs:8.1f} s  {status}")
    print(f"  {'total':<{width}}  {total:8.1f} s")
    failed = [r for r in rows if r[2] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
