"""``make bench``: decode limit, zarrtorch, the reference library and two baselines on one generated array.

    .venv/bin/python benchmarks/run.py                 # 1 GiB array + a 4x one, 3 repetitions (minutes)
    .venv/bin/python benchmarks/run.py --small         # 0.1 GiB (+ 0.4 GiB), quick look
    .venv/bin/python benchmarks/run.py --tiny          # a few MB, 1 repetition: the end-to-end test
    .venv/bin/python benchmarks/run.py --only zarrtorch --prototypes --by-thread   # profile + prototypes

Every (configuration, size, repetition) runs in a fresh process (forked from a forkserver that has
imported torch/zarr once, so no run inherits data, threads or DataLoader workers from another); the
store's files are read once before each run so that every run finds them in the OS page cache
(``--cache cold`` drops the page cache instead, which needs root). Medians over the repetitions are
printed as a table and written with every raw measurement to ``--out`` (JSON). See benchmarks/README.md.

Modules, each importing only the next: run.py (this orchestrator) -> harness.py (one run, in its fresh
process) -> prototypes.py (patches on the zarrtorch run).
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

from zarrtorch import available_cpus  # noqa: E402

PRELOAD = ["harness", "prototypes", "numpy", "torch", "zarr", "zarrtorch", "zarrtorch.course.baselines", "zarrdataset"]
MiB = 2**20
MEMORY_KINDS = ("zarrtorch", "rank", "cache", "remote")  # the runs whose memory is compared with loader_memory
PROTOTYPES = {2: "queue"}  # --prototypes: the variant run per number of workers (a transport or a patch)

# Targets (information only, never a test): thresholds and tolerances.
TARGET_L0_RATIO = 0.9  # zarrtorch, every epoch, 0 and 2 workers, vs L0 with 2 threads
TARGET_MEMORY_PREDICTION = 0.15  # zarrtorch.loader_memory >= memory held, and at most 15% above it
TARGET_MEMORY_FRACTION = 0.25  # zarrtorch memory vs the reference's
TARGET_RANK_ORDER_RATIO = 0.95  # batch_order="rank" vs the default order, same workers
TARGET_TTFB_CHUNKS = 3  # time to first batch, in single-thread chunk reads
FLAT_TOLERANCE = 0.25  # "flat when the array grows": at most +25% (plus one chunk read for times,
FLAT_SLACK_MIB = 16  # 16 MiB for memory, below the noise of sampling)
TARGET_NAIVE_RATIO = 50
PACE = 0.8  # the paced run: a sleeping step that asks for 80% of the loader's own top rate
TARGET_DATA_WAIT = 0.02  # ... waits for data at most 2% of the wall time


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--gib", type=float, default=1.0, help="decoded size of the first array in GiB (default 1.0)")
    add("--small", action="store_true", help="quick mode: --gib 0.1")
    add("--tiny", action="store_true", help="test mode: ~8 MB, 16-row chunks, batch 16, 1 repetition, --scale 2")
    add("--scale", type=int, default=4, help="rows of the second array / rows of the first (<= 1: no second)")
    add("--repeats", type=int, default=3, help="fresh-process repetitions per configuration (median)")
    add("--chunk-rows", type=int, default=128, help="rows per chunk (default 128 = 8 MiB)")
    add("--batch-size", type=int, default=64)
    add("--naive-batches", type=int, default=20, help="batches timed for the row-by-row loader")
    add("--naive-seconds", type=float, default=30, help="... or fewer: it stops after this many seconds")
    add("--epochs", type=int, default=2, help="epochs per run for zarrtorch and the reference")
    kinds = "l0,zarrtorch,rank,cache,reference,naive,numpy,prototype; remote (zarrtorch over HTTP) only if named"
    add("--only", default="", help=f"comma list of kinds: {kinds}")
    add("--cache", choices=("warm", "cold"), default="warm", help="cold: drop the OS page cache (root) before each run")
    add("--touch", action="store_true", help="the consumer reads one float per page of every batch")
    add("--prototypes", action="store_true", help="also run zarrtorch with the patches of prototypes.py")
    add("--by-thread", action="store_true", help="also split the CPU of every run by process and thread role")
    add("--every-size", action="store_true", help="cache=True and remote at every size, not only the first")
    add("--smaps", action="store_true", help="also record where each process's memory lives (/proc/<pid>/smaps)")
    add("--data-dir", default=str(HERE.parent / "data" / "bench"))
    add("--out", default=str(HERE / "results" / "latest.json"))
    add("--seed", type=int, default=0, help="seed of the generated data")
    add("--timeout", type=float, default=1200, help="seconds before a run is killed")
    add("--uss-period", type=float, default=0.1, help="seconds between private-memory samples")
    a = p.parse_args(argv)
    if a.small:
        a.gib = 0.1
    if a.tiny:
        a.gib, a.chunk_rows, a.batch_size, a.repeats, a.naive_batches = 0.008, 16, 16, 1, 2
        a.scale = min(a.scale, 2)
    if a.prototypes and a.only:
        a.only += ",prototype"
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


def make_specs(args, stores: dict, kinds: set[str]) -> list[dict]:
    base = {"batch_size": args.batch_size, "touch": args.touch, "uss_period": args.uss_period}
    base |= {"by_thread": args.by_thread, "smaps": args.smaps}
    specs = []
    for size, info in stores.items():
        first = size == "1x"
        store = {"store": info["path"], "size": size, "rows": info["rows"], **base}
        loaders = {"epochs": args.epochs, **store}
        if first:
            specs += [{"kind": "l0", "threads": t, **store} for t in (1, 2)]
        specs += [{"kind": "zarrtorch", "workers": w, **loaders} for w in (0, 2)]
        if first:
            specs += [{"kind": "rank", "workers": w, **loaders} for w in (0, 2)]  # batch_order="rank"
        specs += [{"kind": "reference", "workers": w, **loaders} for w in (0, 2)]
        if first or args.every_size:
            specs += [{"kind": "cache", "workers": w, **loaders} for w in (0, 2)]
            if "remote" in kinds:  # named in --only: not in a plain make bench (benchmarks/remote.py is)
                specs += [{"kind": "remote", "workers": w, **loaders} for w in (0, 2)]
        specs += [{"kind": "paced", "workers": w, "pace": PACE, **store} for w in (0, 2)]
        if args.prototypes:
            specs += [{"kind": "prototype", "workers": w, "variant": v, **loaders} for w, v in PROTOTYPES.items()]
        if first:
            naive = {"batches": args.naive_batches, "max_seconds": args.naive_seconds, **store}
            specs += [{"kind": "naive", "workers": w, **naive} for w in (0, 2)]
            specs += [{"kind": "numpy", "workers": w, **store} for w in (0, 2)]
            specs += [{"kind": "startup", "workers": 2, **loaders}]  # the floor under a first batch
    return [s for s in specs if not kinds or s["kind"] in kinds]


def key_of(spec: dict) -> tuple:
    return spec["size"], spec["kind"], spec.get("threads", spec.get("workers"))


def label_of(kind: str, par: int) -> str:
    return {
        "l0": f"L0 raw decode, {par} thread{'s' * (par > 1)}",
        "zarrtorch": f"zarrtorch, {par} workers",
        "rank": f"zarrtorch batch_order='rank', {par} workers",
        "reference": f"reference 0.0.9, {par} workers",
        "naive": f"naive row-by-row, {par} workers",
        "numpy": f"numpy in RAM, {par} workers",
        "prototype": f"zarrtorch transport={PROTOTYPES.get(par)}, {par} workers",
        "cache": f"zarrtorch cache=True, {par} workers",
        "remote": f"zarrtorch over HTTP, {par} workers",
        "paced": f"zarrtorch, {par} workers, step at {PACE:.0%} of its top rate",
        "startup": f"DataLoader start-up alone, {par} workers",
    }[kind]


def short(result: dict) -> str:
    return " | ".join(
        f"{e['samples_per_s']:,.0f}/s ttfb {1e3 * (e['ttfb_s'] or 0):.0f} ms held {e['held_mib']:.0f} MiB"
        for e in result["epochs"]
    )


# --------------------------------------------------------------------------------------------------
# Summaries and targets
# --------------------------------------------------------------------------------------------------
def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(key_of(r["spec"]), []).append(r)
    out = []
    for (size, kind, par), rs in groups.items():
        epochs = []
        for i in range(max(len(r["result"]["epochs"]) for r in rs)):
            per = [r["result"]["epochs"][i] for r in rs if len(r["result"]["epochs"]) > i]
            keys = dict.fromkeys(k for p in per for k, v in p.items() if not isinstance(v, dict))
            med = {k: _median([p.get(k) for p in per]) for k in keys}
            med["epoch"] = i + 1
            med["repeats"] = {k: [p[k] for p in per] for k in ("samples_per_s", "ttfb_s", "held_mib")}
            epochs.append(med)
        out.append({"size": size, "kind": kind, "par": par, "label": label_of(kind, par), "epochs": epochs})
        out[-1] |= {"rows": rs[0]["spec"]["rows"], "repeats": len(rs)}
        out[-1]["predicted_mib"] = rs[0]["result"].get("predicted_mib")  # zarrtorch.loader_memory
        paced = [r["result"]["paced"] for r in rs if "paced" in r["result"]]
        if paced:
            out[-1]["paced"] = {k: _median([p[k] for p in paced]) for k in paced[0]}
            out[-1]["paced"]["repeats"] = [p["data_wait_share"] for p in paced]
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


def _startup_floor(summary, par: int) -> str:
    """The first batches of DataLoader alone at ``par`` workers, when that configuration ran."""
    for floor in find(summary, "1x", "startup", par):
        ms = " / ".join(f"{1e3 * e['ttfb_s']:.0f}" for e in floor["epochs"])
        epochs = " / ".join(str(e["epoch"]) for e in floor["epochs"])
        return f"; DataLoader's start-up alone (nothing to read): first batch in {ms} ms in epochs {epochs}"
    return ""


def _flat(small: float, big: float, slack: float) -> bool:
    return big <= small * (1 + FLAT_TOLERANCE) + slack


def targets(summary: list[dict], chunk_rows: int, scaled: bool) -> list[dict]:
    out = []

    def add(ok: bool, target: str, detail: str) -> None:
        out.append({"target": target, "pass": ok, "detail": detail})

    l0_2, l0_1 = find(summary, "1x", "l0", 2), find(summary, "1x", "l0", 1)
    zt, naive = find(summary, "1x", "zarrtorch"), find(summary, "1x", "naive")
    best = max(zt, key=_min_epoch_rate) if zt else None
    l0 = l0_2[0]["epochs"][0]["samples_per_s"] if l0_2 else None
    for s in zt if l0 else []:
        rate, cpu = _min_epoch_rate(s), min(e["cpu_ratio_l0_2t"] or 0 for e in s["epochs"])
        add(
            rate >= TARGET_L0_RATIO * l0,
            f"{s['label']}: every epoch >= {TARGET_L0_RATIO}x L0 (2 threads)",
            f"slowest epoch {rate:,.0f}/s = {rate / l0:.2f}x L0 {l0:,.0f}/s (CPU per sample: {cpu:.2f}x L0's)",
        )
    for s in (s for s in summary if s["kind"] in MEMORY_KINDS and s.get("predicted_mib")):
        held, predicted = max(e["held_mib"] for e in s["epochs"]), s["predicted_mib"]
        add(
            held <= predicted <= (1 + TARGET_MEMORY_PREDICTION) * held,
            f"{s['label']} ({s['rows']:,} rows): zarrtorch.loader_memory an upper bound on the memory held, "
            f"at most {TARGET_MEMORY_PREDICTION:.0%} above it",
            f"held {held:,.0f} MiB, predicted {predicted:,.0f} MiB (predicted {predicted / held - 1:+.0%})",
        )
    for s in zt:  # the reference at the same number of workers; its epoch 2 replays rows it holds in RAM
        for r in find(summary, "1x", "reference", s["par"]):
            zrate, rrate = _min_epoch_rate(s), r["epochs"][-1]["samples_per_s"]
            zmem, rmem = max(e["held_mib"] for e in s["epochs"]), max(e["held_mib"] for e in r["epochs"])
            add(
                zrate >= rrate,
                f"{s['label']}: >= the reference's epoch-{len(r['epochs'])} speed (same workers)",
                f"slowest epoch {zrate:,.0f}/s vs {rrate:,.0f}/s ({zrate / rrate:.2f}x; the reference's epoch 2 "
                "is served from the partition it holds in RAM)",
            )
            add(
                zmem <= TARGET_MEMORY_FRACTION * rmem,
                f"{s['label']}: ... holding <= {TARGET_MEMORY_FRACTION:.2f} of the reference's memory",
                f"held {zmem:,.0f} MiB vs {rmem:,.0f} MiB ({zmem / rmem:.2f}; held = main RSS growth + workers' USS)",
            )
    for s in find(summary, "1x", "rank"):  # the batches of no worker, whatever the workers: at the default's speed
        for z in find(summary, "1x", "zarrtorch", s["par"]):
            rate, default = _min_epoch_rate(s), _min_epoch_rate(z)
            add(
                rate >= TARGET_RANK_ORDER_RATIO * default,
                f"{s['label']}: every epoch >= {TARGET_RANK_ORDER_RATIO}x the default order's (same workers)",
                f"slowest epoch {rate:,.0f}/s vs {default:,.0f}/s ({rate / default:.2f}x)",
            )
    for s in find(summary, "1x", "cache"):  # the comparable mode: rows kept in RAM after epoch 1
        for r in find(summary, "1x", "reference", s["par"]):
            zrate, rrate = s["epochs"][-1]["samples_per_s"], r["epochs"][-1]["samples_per_s"]
            zmem, rmem = max(e["held_mib"] for e in s["epochs"]), max(e["held_mib"] for e in r["epochs"])
            add(
                zrate >= rrate and zmem <= rmem,
                f"{s['label']}: epoch 2 >= the reference's epoch 2 (same workers), holding no more memory",
                f"{zrate:,.0f}/s vs {rrate:,.0f}/s ({zrate / rrate:.2f}x); held {zmem:,.0f} vs {rmem:,.0f} MiB",
            )
    chunk_s = chunk_rows / l0_1[0]["epochs"][0]["samples_per_s"] if l0_1 else None
    for s in zt if chunk_s else []:
        t1 = max(e["ttfb_s"] for e in s["epochs"])
        add(
            t1 <= TARGET_TTFB_CHUNKS * chunk_s,
            f"{s['label']}: time to first batch <= {TARGET_TTFB_CHUNKS} chunk reads "
            f"({1e3 * TARGET_TTFB_CHUNKS * chunk_s:.0f} ms)",
            f"slowest epoch's first batch {1e3 * t1:.0f} ms = {t1 / chunk_s:.1f} chunk reads of {1e3 * chunk_s:.1f} ms"
            + _startup_floor(summary, s["par"]),
        )
        for big in find(summary, "big" if scaled else None, "zarrtorch", s["par"]):
            t4 = max(e["ttfb_s"] for e in big["epochs"])
            grows = f"when the array grows {big['rows'] // s['rows']}x"
            add(
                _flat(t1, t4, chunk_s),
                f"{s['label']}: time to first batch flat {grows}",
                f"{1e3 * t1:.0f} ms -> {1e3 * t4:.0f} ms",
            )
    for s in zt if scaled else []:
        for big in find(summary, "big", "zarrtorch", s["par"]):
            key = "rss_worker_peak_mib" if s["par"] > 0 else "rss_main_peak_mib"
            who = "per worker" if s["par"] > 0 else "of the main process (it decodes)"
            m1, m4 = max(e[key] for e in s["epochs"]), max(e[key] for e in big["epochs"])
            grows = f"when the array grows {big['rows'] // s['rows']}x"
            add(
                _flat(m1, m4, FLAT_SLACK_MIB),
                f"{s['label']}: peak RSS {who} flat {grows}",
                f"{m1:,.0f} MiB -> {m4:,.0f} MiB",
            )
    proto = find(summary, "1x", "prototype")
    if proto and l0:
        pbest = max(proto, key=_min_epoch_rate)
        rate = _min_epoch_rate(pbest)
        add(
            rate >= TARGET_L0_RATIO * l0,
            f"[variant, not the default] every epoch >= {TARGET_L0_RATIO}x L0 (2 threads)",
            f"{pbest['label']}: slowest epoch {rate:,.0f}/s = {rate / l0:.2f}x L0",
        )
    for s in (s for s in summary if s["kind"] == "paced"):
        p, size = s["paced"], "" if s["size"] == "1x" else f" ({s['rows']} rows)"
        steady = _f(p["steady_data_wait_share"], "{:.1%}")
        add(
            p["data_wait_share"] <= TARGET_DATA_WAIT,
            f"{s['label']}{size}: waiting for data <= {TARGET_DATA_WAIT:.0%} of the wall time",
            f"{p['data_wait_share']:.1%} of a paced epoch after a paced one, after its first batch; {steady} once "
            f"the shuffle buffers are full (step {p['step_ms']:.1f} ms per batch; top rate "
            f"{p['top_samples_per_s']:,.0f}/s; repeats {', '.join(f'{v:.1%}' for v in p['repeats'])}); "
            f"the paced epoch right after the tight one: {p['after_tight_data_wait_share']:.1%}",
        )
    if best and naive:
        nbest = max(naive, key=lambda s: s["epochs"][0]["samples_per_s"])
        rate, nrate = _min_epoch_rate(best), nbest["epochs"][0]["samples_per_s"]
        add(
            rate >= TARGET_NAIVE_RATIO * nrate,
            f">= {TARGET_NAIVE_RATIO}x the naive map-style loader",
            f"{rate:,.0f}/s vs {nbest['label']} {nrate:,.1f}/s = {rate / nrate:,.0f}x",
        )
    return out


# --------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------
def _f(v, fmt="{:,.0f}"):
    return "-" if v is None else fmt.format(v)


def _grid(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def table(summary: list[dict], size: str) -> str:
    rows = [
        ("configuration", "ep", "samples/s", "xL0(2t)", "steady/s", "TTFB ms", "CPU us/smp", "xL0 CPU")
        + ("RSS main", "RSS worker", "held MiB")
    ]
    for s in (s for s in summary if s["size"] == size and s["kind"] != "startup"):  # in the targets instead
        for e in s["epochs"]:
            ep = "-" if s["kind"] in ("l0", "naive", "numpy") else str(e["epoch"])
            rows.append(
                (s["label"], ep, _f(e["samples_per_s"]), _f(e["ratio_l0_2t"], "{:.2f}"))
                + (_f(e["steady_samples_per_s"]), _f(e["ttfb_s"] and 1e3 * e["ttfb_s"], "{:,.1f}"))
                + (_f(e["cpu_us_per_sample"]), _f(e["cpu_ratio_l0_2t"], "{:.2f}"), _f(e["rss_main_peak_mib"]))
                + (_f(e["rss_worker_peak_mib"]), _f(e["held_mib"]))
            )
    return _grid(rows)


def growth_table(summary: list[dict], scale: int) -> str:
    x = f"{scale}x"
    rows = [("configuration", "ep", "samples/s 1x", x, "TTFB ms 1x", x, "RSS/proc 1x", x, "held MiB 1x", x)]
    for kind in ("zarrtorch", "prototype", "reference"):
        for s in find(summary, "1x", kind):
            key = "rss_worker_peak_mib" if s["par"] > 0 else "rss_main_peak_mib"
            for big in find(summary, "big", kind, s["par"]):
                for e, b in zip(s["epochs"], big["epochs"], strict=True):
                    rows.append(
                        (s["label"] + (" (per worker)" if s["par"] else " (main)"), str(e["epoch"]))
                        + (_f(e["samples_per_s"]), _f(b["samples_per_s"]))
                        + (_f(1e3 * e["ttfb_s"], "{:,.1f}"), _f(1e3 * b["ttfb_s"], "{:,.1f}"))
                        + (_f(e[key]), _f(b[key]), _f(e["held_mib"]), _f(b["held_mib"]))
                    )
    return _grid(rows)


def threads_table(summary: list[dict], size: str) -> str:
    """``--by-thread``: median CPU us/sample of the zarrtorch runs by process and thread role, per epoch."""
    runs = [s for s in summary if s["size"] == size and s["kind"] in ("zarrtorch", "prototype")]
    cols = [(f"{s['label']} ep{e['epoch']}", e) for s in runs for e in s["epochs"]]
    roles = sorted({k for _, e in cols for k in e if k.startswith("threads/")})
    rows = [("process / thread role", *(name for name, _ in cols))]
    for role in roles:
        values = [e.get(role) or 0.0 for _, e in cols]
        if max(values) >= 0.05:
            rows.append((role.removeprefix("threads/"), *(f"{v:,.1f}" for v in values)))
    total = "TOTAL (process tree, incl. exited threads)"
    return _grid([*rows, (total, *(_f(e["cpu_us_per_sample"], "{:,.1f}") for _, e in cols))])


def machine() -> dict:
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    versions = {}
    for name in ("torch", "zarr", "numcodecs", "numpy", "zarr-torch-dataset", "zarrtorch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    info = {"host": platform.node(), "cpu_model": model, "cpus": os.cpu_count(), "cpus_available": available_cpus()}
    return info | {"memory_gib": memory_gib, "python": platform.python_version(), "versions": versions}


def main(argv=None) -> int:
    args = parse_args(argv)
    kinds = {k.strip() for k in args.only.split(",") if k.strip()}
    run = Runner(args.timeout)
    t_start, load_start, cpus = time.time(), os.getloadavg(), os.cpu_count() or 1  # load is machine-wide

    sizes = {"1x": harness.rows_for(args.gib, args.chunk_rows)}
    if args.scale > 1:
        sizes["big"] = sizes["1x"] * args.scale
    stores = {}
    for size, rows in sizes.items():
        print(
            f"array {size if size == '1x' else f'{args.scale}x'}: {rows} rows x {harness.SAMPLE_SHAPE} float32 = "
            f"{rows * harness.ROW_BYTES / 2**30:.3f} GiB decoded, chunks of {args.chunk_rows} rows "
            f"({args.chunk_rows * harness.ROW_BYTES / MiB:.1f} MiB), zstd",
            flush=True,
        )
        spec = {"kind": "ensure_store", "data_dir": args.data_dir, "rows": rows, "chunk_rows": args.chunk_rows}
        stores[size] = info = run({**spec, "seed": args.seed})
        print(
            f"  {'generated' if info['generated'] else 'reused'} {info['path']} ({info['stored_bytes'] / MiB:,.0f} "
            f"MiB on disk, ratio {info['compression_ratio']:.2f})",
            flush=True,
        )

    specs = make_specs(args, stores, kinds)
    runs, failures = [], []
    n = len(specs) * args.repeats
    server = contextlib.ExitStack()
    if any(s["kind"] == "remote" for s in specs):  # kind remote: the stores over HTTP, served from this process
        from zarrtorch.course.servers import HttpStoreServer

        http = server.enter_context(HttpStoreServer(Path(args.data_dir)))
        specs = [{**s, "url": f"{http.url}/{Path(s['store']).name}"} if s["kind"] == "remote" else s for s in specs]
    for rep in range(args.repeats):  # repetitions outermost: slow drifts of the machine hit every configuration
        for spec in specs:
            spec = {**spec, "repeat": rep}
            what = f"{spec['size']} {label_of(spec['kind'], key_of(spec)[2])} rep {rep + 1}"
            cache = harness.prepare_cache(spec["store"], args.cache)
            t0 = time.perf_counter()
            try:
                result = run(spec)
            except (RuntimeError, TimeoutError) as exc:  # report, go on with the other configurations
                failures.append({"spec": spec, "error": str(exc)})
                print(f"FAILED {what}:\n{exc}", file=sys.stderr, flush=True)
                continue
            runs.append({"spec": spec, "cache": cache, "result": result})
            done = len(runs) + len(failures)
            print(f"[{done}/{n}] {what}: {short(result)}  ({time.perf_counter() - t0:.1f} s)", flush=True)

    server.close()
    summary = summarize(runs)
    l0_rate = add_ratios(summary)
    goals = targets(summary, args.chunk_rows, scaled=args.scale > 1)
    load_end = os.getloadavg()

    info1 = stores["1x"]
    print(
        f"\n== {info1['rows']} rows x 64 KiB = {info1['decoded_bytes'] / 2**30:.2f} GiB, chunks of {args.chunk_rows} "
        f"rows, zstd ratio {info1['compression_ratio']:.2f}, batch {args.batch_size}, median of {args.repeats}; "
        f"page cache: {args.cache}; load average {load_start[0]:.1f} -> {load_end[0]:.1f} on {cpus} CPUs =="
    )
    print(table(summary, "1x"))
    if args.scale > 1 and find(summary, "big", "zarrtorch") + find(summary, "big", "reference"):
        print(f"\n== growth: 1x ({info1['rows']} rows) vs {args.scale}x ({stores['big']['rows']} rows) ==")
        print(growth_table(summary, args.scale))
    if args.by_thread:
        print("\n== CPU us/sample by process and thread role (1x; the total includes threads that exited) ==")
        print(threads_table(summary, "1x"))
    print("\n== targets (information, not tests) ==")
    for g in goals:
        print(f"{'PASS' if g['pass'] else 'MISS'}  {g['target']}: {g['detail']}")
    if max(load_start[0], load_end[0]) > cpus:
        print(
            f"note: the machine was busy (load average {load_start[0]:.1f} / {load_end[0]:.1f} on {cpus} CPUs): "
            "rates are lower and noisier than on a quiet machine; CPU us/sample is less affected."
        )

    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t_start)),
        "seconds": round(time.time() - t_start, 1),
        "args": vars(args),
        "machine": machine(),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "isolation": "every run in a fresh process forked from a forkserver with torch/zarr preloaded",
        "page_cache": args.cache,
        "l0_2_threads_samples_per_s": l0_rate,
        "held_definition": "main process's peak anonymous + shared resident memory (RssAnon + RssShmem) minus "
        "its value at the start + each worker's peak private dirty memory (library file pages left out); "
        "held_rss_uss_mib: the former measure (main RSS growth + each worker's USS)",
    }
    out = {"meta": meta, "stores": stores, "summary": summary, "targets": goals, "runs": runs, "failures": failures}
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
