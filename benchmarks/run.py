"""``make bench``: decode limit, zarrtorch, the reference library and two baselines on one generated array.

    .venv/bin/python benchmarks/run.py                 # 1 GiB array + a 4x one, 3 repetitions (minutes)
    .venv/bin/python benchmarks/run.py --small         # 0.1 GiB (+ 0.4 GiB), quick look
    .venv/bin/python benchmarks/run.py --tiny          # a few MB, 1 repetition: the end-to-end test

Every (configuration, size, repetition) runs in a fresh process (forked from a forkserver that has
imported torch/zarr once, so no run inherits data, threads or DataLoader workers from another); the
store's files are read once before each run so that every run finds them in the OS page cache
(``--cache cold`` drops the page cache instead, which needs root). Medians over the repetitions are
printed as a table and written with every raw measurement to ``--out`` (JSON). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (light at import: numpy only; the heavy imports happen in the runs)

PRELOAD = [
    "harness",
    "profile_stream",
    "numpy",
    "numpy.random",
    "torch",
    "torch.utils.data",
    "zarr",
    "zarrtorch",
    "zarrtorch.course.baselines",
    "zarrdataset",
    "psutil",
]
MiB = 2**20
# --prototypes: the monkeypatched proposals of profile_stream.py run per number of workers
# (direct decode and lazy refill, prototyped here first, are in the package now)
PROTOTYPES = {2: "ring"}

# Targets (information only, never a test): thresholds and tolerances.
TARGET_L0_RATIO = 0.9  # zarrtorch, every epoch, best configuration, vs L0 with 2 threads
TARGET_MEMORY_FRACTION = 0.25  # zarrtorch memory vs the reference's
TARGET_TTFB_CHUNKS = 3  # time to first batch, in single-thread chunk reads
FLAT_TOLERANCE = 0.25  # "flat when the array grows": at most +25% (plus one chunk read for times,
FLAT_SLACK_MIB = 16  # 16 MiB for memory, below the noise of sampling)
TARGET_NAIVE_RATIO = 50


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0, help="decoded size of the first array in GiB (default 1.0)")
    p.add_argument("--small", action="store_true", help="quick mode: --gib 0.1")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="test mode: ~8 MB, 16-row chunks, batch 16, 1 repetition, 2 naive batches, --scale 2",
    )
    p.add_argument(
        "--scale",
        type=int,
        default=4,
        help="rows of the second array / rows of the first (default 4; <= 1: no second size)",
    )
    p.add_argument("--repeats", type=int, default=3, help="fresh-process repetitions per configuration (median)")
    p.add_argument("--chunk-rows", type=int, default=128, help="rows per chunk (default 128 = 8 MiB)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--naive-batches", type=int, default=20, help="batches timed for the row-by-row loader")
    p.add_argument(
        "--naive-seconds",
        type=float,
        default=30,
        help="... or fewer: it stops after this many seconds (at least 2 batches)",
    )
    p.add_argument("--epochs", type=int, default=2, help="epochs per run for zarrtorch and the reference")
    p.add_argument("--only", default="", help="comma list of kinds: l0,zarrtorch,reference,naive,numpy")
    p.add_argument(
        "--cache",
        choices=("warm", "cold"),
        default="warm",
        help="warm: read the store before each run (default); cold: drop the OS page cache (root)",
    )
    p.add_argument("--touch", action="store_true", help="the consumer reads one float per page of every batch")
    p.add_argument(
        "--prototypes",
        action="store_true",
        help="also run zarrtorch with the prototypes of profile_stream.py (monkeypatched, the package "
        "is not changed): batches sent through a ring of reused shared-memory slots (2 workers)",
    )
    p.add_argument("--data-dir", default=str(ROOT / "data" / "bench"))
    p.add_argument("--out", default=str(HERE / "results" / "latest.json"))
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    p.add_argument("--timeout", type=float, default=1200, help="seconds before a run is killed")
    p.add_argument("--uss-period", type=float, default=0.1, help="seconds between private-memory samples")
    a = p.parse_args(argv)
    if a.small:
        a.gib = 0.1
    if a.tiny:
        a.gib, a.chunk_rows, a.batch_size, a.repeats, a.naive_batches = 0.008, 16, 16, 1, 2
        a.scale = min(a.scale, 2)
    return a


class Runner:
    """Starts every run in a fresh process forked from one forkserver with the heavy modules preloaded."""

    def __init__(self, timeout: float):
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.timeout = timeout

    def __call__(self, spec: dict) -> dict:
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=harness.entry, args=(spec, child), name=f"bench-{spec['kind']}")
        proc.start()
        child.close()
        try:
            if not parent.poll(self.timeout):
                raise TimeoutError(f"run {spec} took more than {self.timeout} s")
            reply = parent.recv()
        except EOFError:
            reply = {"ok": False, "error": f"the run died (exit code {proc.exitcode})"}
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if not reply["ok"]:
            raise RuntimeError(f"run {spec['kind']} failed:\n{reply['error']}")
        return reply["result"]


def prepare_cache(store: str, mode: str) -> str:
    if mode == "cold":
        if harness.drop_page_cache():
            return "dropped"
        harness.warm_page_cache(store)
        return "warm (could not drop: not root?)"
    harness.warm_page_cache(store)
    return "warm"


def make_specs(args, stores: dict, kinds: set[str]) -> list[dict]:
    base = {"batch_size": args.batch_size, "touch": args.touch, "uss_period": args.uss_period}
    specs = []
    for size, info in stores.items():
        first = size == "1x"
        store = {"store": info["path"], "size": size, "rows": info["rows"]}
        if first:
            specs += [{"kind": "l0", "threads": t, **store} for t in (1, 2)]
        specs += [{"kind": "zarrtorch", "workers": w, "epochs": args.epochs, **base, **store} for w in (0, 2)]
        specs += [{"kind": "reference", "workers": w, "epochs": args.epochs, **base, **store} for w in (0, 2)]
        if args.prototypes:
            specs += [
                {"kind": "prototype", "workers": w, "variant": v, "epochs": args.epochs, **base, **store}
                for w, v in PROTOTYPES.items()
            ]
        if first:
            specs += [
                {
                    "kind": "naive",
                    "workers": w,
                    "batches": args.naive_batches,
                    "max_seconds": args.naive_seconds,
                    **base,
                    **store,
                }
                for w in (0, 2)
            ]
            specs += [{"kind": "numpy", "workers": w, **base, **store} for w in (0, 2)]
    return [s for s in specs if not kinds or s["kind"] in kinds]


def key_of(spec: dict) -> tuple:
    return spec["size"], spec["kind"], spec.get("threads", spec.get("workers"))


def label_of(kind: str, par: int) -> str:
    return {
        "l0": f"L0 raw decode, {par} thread{'s' * (par > 1)}",
        "zarrtorch": f"zarrtorch, {par} workers",
        "reference": f"reference 0.0.9, {par} workers",
        "naive": f"naive row-by-row, {par} workers",
        "numpy": f"numpy in RAM, {par} workers",
        "prototype": f"proto: zarrtorch+{PROTOTYPES.get(par)}, {par} workers",
    }[kind]


def short(spec_result: dict) -> str:
    parts = []
    for e in spec_result["epochs"]:
        held = e.get("held_bytes", 0) / MiB
        parts.append(f"{e['samples_per_s']:,.0f}/s ttfb {1e3 * (e['ttfb_s'] or 0):.0f} ms held {held:.0f} MiB")
    return " | ".join(parts)


# --------------------------------------------------------------------------------------------------
# Summaries and targets
# --------------------------------------------------------------------------------------------------
def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _epoch_numbers(e: dict) -> dict:
    mem = e["memory"]
    workers = mem["workers"]
    return {
        "samples_per_s": e["samples_per_s"],
        "steady_samples_per_s": e.get("steady_samples_per_s"),
        "seconds": e["seconds"],
        "ttfb_s": e["ttfb_s"],
        "cpu_s": e.get("cpu_s"),
        "cpu_us_per_sample": 1e6 * e["cpu_s"] / e["samples"] if e.get("cpu_s") is not None and e["samples"] else None,
        "rss_main_peak_mib": (mem["main"]["rss_peak"] or 0) / MiB,
        "rss_main_start_mib": (mem["main"]["rss_start"] or 0) / MiB,
        "rss_worker_peak_mib": max((w["rss_peak"] or 0) for w in workers) / MiB if workers else None,
        "uss_worker_peak_mib": max((w["uss_peak"] or 0) for w in workers) / MiB if workers else None,
        "rss_worker_peaks_mib": [(w["rss_peak"] or 0) / MiB for w in workers],
        "held_mib": e["held_bytes"] / MiB,
    }


def summarize(runs: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(key_of(r["spec"]), []).append(r)
    out = []
    for (size, kind, par), rs in groups.items():
        n_epochs = max(len(r["result"]["epochs"]) for r in rs)
        epochs = []
        for i in range(n_epochs):
            per = [_epoch_numbers(r["result"]["epochs"][i]) for r in rs if len(r["result"]["epochs"]) > i]
            med = {k: _median([p[k] for p in per]) for k in per[0] if k != "rss_worker_peaks_mib"}
            med["epoch"] = i + 1
            med["repeats"] = {k: [p[k] for p in per] for k in ("samples_per_s", "ttfb_s", "held_mib")}
            epochs.append(med)
        out.append(
            {
                "size": size,
                "kind": kind,
                "par": par,
                "label": label_of(kind, par),
                "rows": rs[0]["spec"]["rows"],
                "epochs": epochs,
                "repeats": len(rs),
            }
        )
    return out


def find(summary, size, kind, par=None):
    return [s for s in summary if s["size"] == size and s["kind"] == kind and (par is None or s["par"] == par)]


def add_ratios(summary: list[dict]) -> float | None:
    l0 = find(summary, "1x", "l0", 2)
    l0_rate = l0[0]["epochs"][0]["samples_per_s"] if l0 else None
    l0_cpu = l0[0]["epochs"][0]["cpu_us_per_sample"] if l0 else None
    for s in summary:
        for e in s["epochs"]:
            e["ratio_l0_2t"] = e["samples_per_s"] / l0_rate if l0_rate else None
            # what the ratio would be if both were limited by CPU alone (a busy machine distorts the other)
            cpu = e["cpu_us_per_sample"]
            e["cpu_ratio_l0_2t"] = l0_cpu / cpu if l0_cpu and cpu else None
    return l0_rate


def _min_epoch_rate(s):
    return min(e["samples_per_s"] for e in s["epochs"])


def _flat(small: float, big: float, slack: float) -> bool:
    return big <= small * (1 + FLAT_TOLERANCE) + slack


def targets(summary: list[dict], chunk_rows: int, scaled: bool) -> list[dict]:
    out = []

    def add(name, ok, detail):
        out.append({"target": name, "pass": ok, "detail": detail})

    l0_2 = find(summary, "1x", "l0", 2)
    l0_1 = find(summary, "1x", "l0", 1)
    zt = find(summary, "1x", "zarrtorch")
    naive = find(summary, "1x", "naive")
    best = max(zt, key=_min_epoch_rate) if zt else None
    if best and l0_2:
        l0 = l0_2[0]["epochs"][0]["samples_per_s"]
        r = _min_epoch_rate(best) / l0
        cpu = min(e["cpu_ratio_l0_2t"] or 0 for e in best["epochs"])
        add(
            f"zarrtorch every epoch >= {TARGET_L0_RATIO}x L0 (2 threads), best configuration",
            r >= TARGET_L0_RATIO,
            f"{best['label']}: slowest epoch {_min_epoch_rate(best):,.0f}/s = {r:.2f}x L0 {l0:,.0f}/s "
            f"(CPU per sample: {cpu:.2f}x L0's)",
        )
    for s in zt:  # the reference at the same number of workers; its epoch 2 replays rows it holds in RAM
        r = find(summary, "1x", "reference", s["par"])
        if not r:
            continue
        r = r[0]
        zrate, rrate = _min_epoch_rate(s), r["epochs"][-1]["samples_per_s"]
        zmem = max(e["held_mib"] for e in s["epochs"])
        rmem = max(e["held_mib"] for e in r["epochs"])
        add(
            f"{s['label']}: >= the reference's epoch-{len(r['epochs'])} speed (same workers)",
            zrate >= rrate,
            f"slowest epoch {zrate:,.0f}/s vs {rrate:,.0f}/s ({zrate / rrate:.2f}x; the reference's epoch 2 is "
            "served from the partition it holds in RAM)",
        )
        add(
            f"{s['label']}: ... holding <= {TARGET_MEMORY_FRACTION:.2f} of the reference's memory",
            zmem <= TARGET_MEMORY_FRACTION * rmem,
            f"held {zmem:,.0f} MiB vs {rmem:,.0f} MiB ({zmem / rmem:.2f}; held = main RSS growth + workers' USS)",
        )
    if zt and l0_1:
        chunk_s = chunk_rows / l0_1[0]["epochs"][0]["samples_per_s"]
        for s in zt:
            t1 = max(e["ttfb_s"] for e in s["epochs"])
            add(
                f"{s['label']}: time to first batch <= {TARGET_TTFB_CHUNKS} chunk reads ({1e3 * TARGET_TTFB_CHUNKS * chunk_s:.0f} ms)",
                t1 <= TARGET_TTFB_CHUNKS * chunk_s,
                f"slowest epoch's first batch {1e3 * t1:.0f} ms = {t1 / chunk_s:.1f} chunk reads of {1e3 * chunk_s:.1f} ms",
            )
            big = find(summary, "big" if scaled else None, "zarrtorch", s["par"])
            if big:
                t4 = max(e["ttfb_s"] for e in big[0]["epochs"])
                add(
                    f"{s['label']}: time to first batch flat when the array grows {big[0]['rows'] // s['rows']}x",
                    _flat(t1, t4, chunk_s),
                    f"{1e3 * t1:.0f} ms -> {1e3 * t4:.0f} ms",
                )
    if zt and scaled:
        for s in zt:
            big = find(summary, "big", "zarrtorch", s["par"])
            if not big:
                continue
            key = "rss_worker_peak_mib" if s["par"] > 0 else "rss_main_peak_mib"
            who = "per worker" if s["par"] > 0 else "of the main process (it decodes)"
            m1 = max(e[key] for e in s["epochs"])
            m4 = max(e[key] for e in big[0]["epochs"])
            add(
                f"{s['label']}: peak RSS {who} flat when the array grows {big[0]['rows'] // s['rows']}x",
                _flat(m1, m4, FLAT_SLACK_MIB),
                f"{m1:,.0f} MiB -> {m4:,.0f} MiB",
            )
    proto = find(summary, "1x", "prototype")
    if proto and l0_2:
        pbest = max(proto, key=_min_epoch_rate)
        l0 = l0_2[0]["epochs"][0]["samples_per_s"]
        r = _min_epoch_rate(pbest) / l0
        add(
            f"[prototype, not the package] every epoch >= {TARGET_L0_RATIO}x L0 (2 threads)",
            r >= TARGET_L0_RATIO,
            f"{pbest['label']}: slowest epoch {_min_epoch_rate(pbest):,.0f}/s = {r:.2f}x L0",
        )
    if best and naive:
        nbest = max(naive, key=lambda s: s["epochs"][0]["samples_per_s"])
        r = _min_epoch_rate(best) / nbest["epochs"][0]["samples_per_s"]
        add(
            f">= {TARGET_NAIVE_RATIO}x the naive map-style loader",
            r >= TARGET_NAIVE_RATIO,
            f"{_min_epoch_rate(best):,.0f}/s vs {nbest['label']} {nbest['epochs'][0]['samples_per_s']:,.1f}/s = {r:,.0f}x",
        )
    return out


# --------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------
def _f(v, fmt="{:,.0f}", none="-"):
    return none if v is None else fmt.format(v)


def table(summary: list[dict], size: str) -> str:
    head = (
        "configuration",
        "ep",
        "samples/s",
        "xL0(2t)",
        "steady/s",
        "TTFB ms",
        "CPU us/smp",
        "xL0 CPU",
        "RSS main",
        "RSS worker",
        "held MiB",
    )
    rows = [head]
    for s in summary:
        if s["size"] != size:
            continue
        for e in s["epochs"]:
            ep = "-" if s["kind"] in ("l0", "naive", "numpy") else str(e["epoch"])
            rows.append(
                (
                    s["label"],
                    ep,
                    _f(e["samples_per_s"]),
                    _f(e["ratio_l0_2t"], "{:.2f}"),
                    _f(e["steady_samples_per_s"]),
                    _f(e["ttfb_s"] and 1e3 * e["ttfb_s"], "{:,.1f}"),
                    _f(e["cpu_us_per_sample"]),
                    _f(e["cpu_ratio_l0_2t"], "{:.2f}"),
                    _f(e["rss_main_peak_mib"]),
                    _f(e["rss_worker_peak_mib"]),
                    _f(e["held_mib"]),
                )
            )
    return _grid(rows)


def growth_table(summary: list[dict], scale: int) -> str:
    head = (
        "configuration",
        "ep",
        "samples/s 1x",
        f"{scale}x",
        "TTFB ms 1x",
        f"{scale}x",
        "RSS/proc 1x",
        f"{scale}x",
        "held MiB 1x",
        f"{scale}x",
    )
    rows = [head]
    for kind in ("zarrtorch", "prototype", "reference"):
        for s in find(summary, "1x", kind):
            big = find(summary, "big", kind, s["par"])
            if not big:
                continue
            key = "rss_worker_peak_mib" if s["par"] > 0 else "rss_main_peak_mib"
            for e, b in zip(s["epochs"], big[0]["epochs"], strict=True):
                rows.append(
                    (
                        s["label"] + (" (per worker)" if s["par"] else " (main)"),
                        str(e["epoch"]),
                        _f(e["samples_per_s"]),
                        _f(b["samples_per_s"]),
                        _f(1e3 * e["ttfb_s"], "{:,.1f}"),
                        _f(1e3 * b["ttfb_s"], "{:,.1f}"),
                        _f(e[key]),
                        _f(b[key]),
                        _f(e["held_mib"]),
                        _f(b["held_mib"]),
                    )
                )
    return _grid(rows)


def _grid(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        cells = [str(c).ljust(widths[i]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict:
    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    model = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "uid": os.getuid(),
        "versions": {n: version(n) for n in ("torch", "zarr", "numcodecs", "numpy", "zarr-torch-dataset", "zarrtorch")},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    kinds = {k.strip() for k in args.only.split(",") if k.strip()}
    run = Runner(args.timeout)
    t_start = time.time()
    load_start = os.getloadavg()

    sizes = {"1x": harness.rows_for(args.gib, args.chunk_rows)}
    if args.scale > 1:
        sizes["big"] = sizes["1x"] * args.scale
    stores = {}
    for size, rows in sizes.items():
        print(
            f"array {size if size == '1x' else f'{args.scale}x'}: {rows} rows x {harness.SAMPLE_SHAPE} float32 = {rows * harness.ROW_BYTES / 2**30:.3f} GiB "
            f"decoded, chunks of {args.chunk_rows} rows ({args.chunk_rows * harness.ROW_BYTES / MiB:.1f} MiB), zstd",
            flush=True,
        )
        info = run(
            {
                "kind": "ensure_store",
                "data_dir": args.data_dir,
                "rows": rows,
                "chunk_rows": args.chunk_rows,
                "seed": args.seed,
            }
        )
        print(
            f"  {'generated' if info['generated'] else 'reused'} {info['path']} ({info['stored_bytes'] / MiB:,.0f} MiB "
            f"on disk, ratio {info['compression_ratio']:.2f})",
            flush=True,
        )
        stores[size] = info

    specs = make_specs(args, stores, kinds)
    runs, failures = [], []
    n = len(specs) * args.repeats
    for rep in range(args.repeats):  # repetitions outermost: slow drifts of the machine hit every configuration
        for spec in specs:
            spec = {**spec, "repeat": rep}
            cache = prepare_cache(spec["store"], args.cache)
            t0 = time.perf_counter()
            try:
                result = run(spec)
            except (RuntimeError, TimeoutError) as exc:  # report, go on with the other configurations
                failures.append({"spec": spec, "error": str(exc)})
                print(
                    f"FAILED {spec['size']} {label_of(spec['kind'], key_of(spec)[2])} rep {rep + 1}:\n{exc}",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            runs.append({"spec": spec, "cache": cache, "result": result})
            print(
                f"[{len(runs) + len(failures)}/{n}] {spec['size']} {label_of(spec['kind'], key_of(spec)[2])} rep {rep + 1}: "
                f"{short(result)}  ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )

    summary = summarize(runs)
    l0_rate = add_ratios(summary)
    goals = targets(summary, args.chunk_rows, scaled=args.scale > 1)
    load_end = os.getloadavg()

    info1 = stores["1x"]
    print()
    print(
        f"== {info1['rows']} rows x 64 KiB = {info1['decoded_bytes'] / 2**30:.2f} GiB, chunks of {args.chunk_rows} rows, "
        f"zstd ratio {info1['compression_ratio']:.2f}, batch {args.batch_size}, median of {args.repeats}; "
        f"page cache: {args.cache}; load average {load_start[0]:.1f} -> {load_end[0]:.1f} on {os.cpu_count()} CPUs =="
    )
    print(table(summary, "1x"))
    if args.scale > 1 and any(s["size"] == "big" for s in summary):
        print()
        print(f"== growth: 1x ({info1['rows']} rows) vs {args.scale}x ({stores['big']['rows']} rows) ==")
        print(growth_table(summary, args.scale))
    print()
    print("== targets (information, not tests) ==")
    for g in goals:
        print(f"{'PASS' if g['pass'] else 'MISS'}  {g['target']}: {g['detail']}")
    if load_start[0] > (os.cpu_count() or 1) or load_end[0] > (os.cpu_count() or 1):
        print(
            f"note: the machine was busy (load average {load_start[0]:.1f} / {load_end[0]:.1f} on "
            f"{os.cpu_count()} CPUs): rates are lower and noisier than on a quiet machine; "
            "CPU us/sample is less affected."
        )

    out = {
        "meta": {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_start)),
            "seconds": round(time.time() - t_start, 1),
            "args": vars(args),
            "machine": machine(),
            "load_average_start": load_start,
            "load_average_end": load_end,
            "isolation": "every run in a fresh process forked from a forkserver with torch/zarr preloaded",
            "page_cache": args.cache,
            "l0_2_threads_samples_per_s": l0_rate,
            "held_definition": "main process peak RSS minus its RSS at start + each worker's peak private memory (USS)",
        },
        "stores": stores,
        "summary": summary,
        "targets": goals,
        "runs": runs,
        "failures": failures,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float))
    print(f"\nwrote {path}")
    if failures:
        print(f"{len(failures)} run(s) failed: see 'failures' in the JSON", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
