"""Run the whole course headless: generate the data, execute every notebook in order, print the times.

Executed copies go to ``data/<size>/executed/`` so the committed notebooks stay untouched. Prints, per notebook,
its markdown words, its code's run time, its slot in the day and the share of the slot the code takes. Exits
non-zero if any notebook fails.
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

    from zarrtorch.course.lessons import CODE_SHARE, markdown_words, run_notebook, slot_minutes
    from zarrtorch.course.paths import data_dir
    from zarrtorch.course.synthetic import make_data

    rows: list[tuple[str, int | None, float, int | None, str]] = []  # name, words, seconds, slot, status
    t0 = time.perf_counter()
    print(f"[course] generating the {a.size!r} data (skipped if present)", flush=True)
    make_data(a.size, progress=sys.stdout.isatty())
    rows.append(("make-data", None, time.perf_counter() - t0, None, "ok"))
    print(f"[course] data ready in {rows[-1][2]:.1f} s", flush=True)

    out_dir = data_dir(a.size) / "executed"
    out_dir.mkdir(parents=True, exist_ok=True)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9A-Z][0-9]_*.ipynb"))
    if a.only:
        notebooks = [nb for nb in notebooks if any(nb.name.startswith(pfx) for pfx in a.only)]
    for nb_path in notebooks:
        nb = nbformat.read(nb_path, as_version=4)
        start = time.perf_counter()
        print(f"[course] {nb_path.name} ...", flush=True)
        try:
            run_notebook(nb, nb_path, timeout=a.timeout)
            status = "ok"
        except Exception as exc:  # report and go on: one failing lesson should not hide the others
            status = f"FAILED: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
        elapsed = time.perf_counter() - start
        nbformat.write(nb, out_dir / nb_path.name)
        try:
            slot = slot_minutes(nb_path.name[:2])
        except KeyError:
            slot = None
        rows.append((nb_path.name, markdown_words(nb), elapsed, slot, status))
        print(f"[course] {nb_path.name}: {elapsed:.1f} s {status}", flush=True)

    total = time.perf_counter() - t0
    width = max(len(r[0]) for r in rows)
    shown = out_dir.relative_to(ROOT) if out_dir.is_relative_to(ROOT) else out_dir
    print(f"\nCourse run on size {a.size!r} (executed notebooks in {shown}):")
    print(f"  {'notebook':<{width}}  {'words':>6}  {'code s':>8}  {'slot':>5}  {'code/slot':>9}  status")
    for name, words, secs, slot, status in rows:
        share = f"{secs / (60 * slot):9.0%}" if slot else f"{'':>9}"
        print(
            f"  {name:<{width}}  {words if words is not None else '':>6}  {secs:8.1f}  "
            f"{f'{slot} min' if slot else '':>5}  {share}  {status}"
        )
    print(f"  {'total':<{width}}  {'':>6}  {total:8.1f}")
    print(
        f"  (a lesson's code may take {CODE_SHARE:.0%} of its slot at the default size; reading and exercises the rest)"
    )
    failed = [r for r in rows if r[4] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
