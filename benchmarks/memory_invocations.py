"""``loader_memory`` against the memory held, over several fresh invocations of the benchmark (issue 30).

    .venv/bin/python benchmarks/memory_invocations.py                   # 5 invocations of run.py, then the table
    .venv/bin/python benchmarks/memory_invocations.py --invocations 2 --scale 1 --gib 0.1   # a quick look
    .venv/bin/python benchmarks/memory_invocations.py --from results/mem_1.json results/mem_2.json  # table only

Each invocation is a new ``run.py --only zarrtorch,cache,remote --every-size --repeats 1`` process (its own forkserver,
its own runs), so what differs between invocations (the orchestrator, the allocator's and the page cache's
state) shows up as it does between two ``make bench``. The table gives, per configuration, what the package
predicts (``zarrtorch.loader_memory(loader).total``), the memory held in each invocation (the larger of the
two epochs; ``held MiB`` of benchmarks/README.md) and whether every invocation stays under the prediction and
within ``--tolerance`` of it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("zarrtorch", "cache", "remote")


def invoke(i: int, args) -> Path:
    out = Path(args.out_dir) / f"mem_{i}.json"
    cmd = [sys.executable, str(HERE / "run.py"), "--only", ",".join(KINDS), "--repeats", "1", "--out", str(out)]
    cmd += ["--scale", str(args.scale), "--gib", str(args.gib), "--every-size"]
    cmd += ["--data-dir", args.data_dir] if args.data_dir else []
    print(f"invocation {i}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def rows(paths: list[Path]) -> dict[tuple, dict]:
    """(size, kind, workers) -> {"rows", "predicted" (MiB, per invocation), "held" (MiB, per invocation)}."""
    table: dict[tuple, dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for run in data["runs"]:
            spec, result = run["spec"], run["result"]
            if spec["kind"] not in KINDS or result.get("predicted_mib") is None:
                continue
            row = table.setdefault((spec["size"], spec["kind"], spec["workers"]), {"predicted": [], "held": []})
            row["rows"] = spec["rows"]
            row["predicted"].append(result["predicted_mib"])
            row["held"].append(max(e["held_mib"] for e in result["epochs"]))
    return table


def report(table: dict[tuple, dict], tolerance: float) -> tuple[str, bool]:
    label = {"zarrtorch": "zarrtorch", "cache": "zarrtorch cache=True", "remote": "zarrtorch over HTTP"}
    lines = ["| configuration | rows | predicted MiB | held MiB, each invocation | held / predicted | bound |"]
    lines.append("|---|---:|---:|---|---|---|")
    ok = True
    order = sorted(table, key=lambda k: (k[0] != "1x", KINDS.index(k[1]), k[2]))
    for size, kind, workers in order:
        row = table[(size, kind, workers)]
        predicted = max(row["predicted"])
        ratios = [h / p for h, p in zip(row["held"], row["predicted"], strict=True)]
        fine = all(r <= 1 and r >= 1 / (1 + tolerance) for r in ratios)
        ok &= fine
        held = ", ".join(f"{h:,.0f}" for h in row["held"])
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        verdict = "ok" if fine else ("EXCEEDED" if max(ratios) > 1 else "LOOSE")
        lines.append(
            f"| {label[kind]}, {workers} workers | {row['rows']:,} | {predicted:,.0f} | {held} | {spread} | {verdict} |"
        )
    return "\n".join(lines), ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--invocations", type=int, default=5)
    p.add_argument("--scale", type=int, default=4, help="run.py --scale (4: also the 4x array)")
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out-dir", default=str(HERE / "results"))
    p.add_argument("--tolerance", type=float, default=0.15, help="the prediction may exceed what is held by this")
    p.add_argument("--from", dest="paths", nargs="*", help="tabulate these run.py outputs instead of running")
    args = p.parse_args(argv)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    paths = args.paths or [invoke(i + 1, args) for i in range(args.invocations)]
    text, ok = report(rows(paths), args.tolerance)
    print(text)
    print(
        f"\nevery invocation held <= predicted and predicted <= {1 + args.tolerance:.2f} x held: "
        f"{'yes' if ok else 'no'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
