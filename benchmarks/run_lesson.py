"""Run a lesson's code cells in order, as one script, where Jupyter is not installed (a loaned GPU node).

    python3 benchmarks/run_lesson.py notebooks/05_training.ipynb --out results/lesson05.json

A loaned node has Python, torch and the wheels carried to it (``benchmarks/node.sh``), not a Jupyter kernel: this
runs each code cell in one namespace, as a kernel would, with matplotlib drawing off screen, and records each
cell's seconds, what it printed and the first error. It stops at the first failing cell (as ``make course`` does)
and exits with status 1 then. IPython magics and shell lines (``%``, ``!``) are skipped: the lessons use them only
in comments (``# %load solutions/...``). Nothing here judges speed: the figures are for the notes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_cells(notebook: Path) -> list[str]:
    """The source of each code cell, magics and shell lines left out."""
    cells = json.loads(notebook.read_text())["cells"]
    out = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        lines = "".join(cell["source"]).splitlines()
        out.append("\n".join(line for line in lines if not line.lstrip().startswith(("%", "!"))))
    return out


def run_cells(cells: list[str], *, cwd: Path) -> list[dict]:
    """Each cell's seconds, printed text and error (``None`` when it ran), up to and with the first that failed."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a node; plt.show() then draws nothing
    namespace: dict = {"__name__": "__main__"}
    results = []
    previous = Path.cwd()
    os.chdir(cwd)  # a lesson opens files relative to the notebooks' folder, as its kernel would
    try:
        for number, source in enumerate(cells):
            printed = io.StringIO()
            start = time.perf_counter()
            error = None
            try:
                with contextlib.redirect_stdout(printed):
                    exec(compile(source, f"<cell {number}>", "exec"), namespace)  # noqa: S102
            except Exception:  # the lesson's own error, recorded and then the run stops
                error = traceback.format_exc(limit=8)
            results.append(
                {"cell": number, "seconds": time.perf_counter() - start, "printed": printed.getvalue(), "error": error}
            )
            print(f"[cell {number}] {results[-1]['seconds']:.1f} s{' FAILED' if error else ''}", flush=True)
            if error:
                print(error, file=sys.stderr)
                break
    finally:
        os.chdir(previous)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--out", type=Path, help="JSON of each cell's seconds, printed text and error")
    args = p.parse_args(argv)
    import torch

    cells = code_cells(args.notebook)
    results = run_cells(cells, cwd=args.notebook.resolve().parent)
    failed = any(r["error"] for r in results)
    report = {
        "notebook": str(args.notebook),
        "cuda": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "cells": len(cells),
        "ran": len(results),
        "seconds": sum(r["seconds"] for r in results),
        "ok": not failed and len(results) == len(cells),
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(
        f"{args.notebook}: {report['ran']} of {report['cells']} cells, {report['seconds']:.1f} s on "
        f"{report['device']}: {'ok' if report['ok'] else 'FAILED'}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
