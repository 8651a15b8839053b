"""The peers' results as one markdown table (pure: a dict in, text out; the test feeds it made-up results)."""

from __future__ import annotations

import re
import statistics

MiB = 2**20
GUARANTEES = [  # (column, key in a guarantees result)
    ("every row once (2 ranks)", "every_row_once"),
    ("equal batches per rank", "equal_batches"),
    ("reshuffled across ranks", "reshuffled"),
    ("mid-epoch resume exact", "resume_exact"),
    ("resume on 1 rank (saved on 2)", "resume_other_world"),
    ("resume on other worker count", "resume_other_workers"),
]
SERIES = ((1, "throughput"), (2, "throughput_2ranks"))
START_METHODS = (
    "fork",
    "spawn",
)  # the uneven passes, in the order they run and are shown  # (ranks, key in a peer's results): rank 0 of 1, of 2
HEAD = [
    "loader",
    "ranks",
    "workers",
    "rows/s ep1",
    "rows/s ep2",
    "x L0",
    "x zarrtorch",
    "TTFB s",
    "held MiB",
    "conversion",
]


def rate(run: dict | None) -> float | None:
    """Rows/s over epochs 1 and 2 together: start-up and a warm second epoch both count."""
    if not run or "epochs" not in run:
        return None
    rows, seconds = sum(e["rows"] for e in run["epochs"]), sum(e["seconds"] for e in run["epochs"])
    return rows / seconds if seconds else None


def _num(v: float | None, digits: int = 0) -> str:
    return "" if v is None else f"{v:,.{digits}f}"


def _conversion(conv: dict | None) -> str:
    if not conv or conv.get("conversion_s") is None:
        return "none"
    return f"{conv['conversion_s']:.0f} s, {conv['disk_bytes'] / MiB:.0f} MiB"


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown(results: dict) -> str:
    """``results``: ``{"l0": {"rows_per_s"}, "peers": [{"name", "status", "reason"?, "conversion"?,
    "throughput": {workers: run}, "throughput_2ranks": {workers: run}?, "guarantees": {...}}]}``; a peer whose
    status is not ``ok`` gets one row that says why (``not installable: ...``, ``not run: ...``). Rows/s of
    rank 0 of 2 are that rank's (it reads half the rows); the guarantees, checked on 2 ranks, sit on the row of
    2 ranks with the workers they ran with (on the 1-rank row when no 2-rank run exists)."""
    l0 = (results.get("l0") or {}).get("rows_per_s")
    ours = next((p for p in results["peers"] if p["name"] == "zarrtorch"), {})
    head = HEAD + [c for c, _ in GUARANTEES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if l0:
        cells = ["L0: raw decode, every chunk in order, 2 threads", "", "", _num(l0), "", "1.00"]
        lines.append("| " + " | ".join(cells + [""] * (len(head) - len(cells))) + " |")
    for peer in results["peers"]:
        if peer.get("status") != "ok":
            note = _cell(peer.get("reason") or peer.get("status") or "?")
            lines.append(f"| {peer['name']} | | | {note} |" + " |" * (len(head) - 4))
            continue
        g = peer.get("guarantees") or {}
        guarantee_ranks = 2 if peer.get("throughput_2ranks") else 1
        for ranks, key in SERIES:
            for workers, run in sorted((peer.get(key) or {}).items(), key=lambda kv: int(kv[0])):
                start = f"| {peer['name']} | {ranks} | {workers} |"
                if "error" in run:
                    lines.append(f"{start} failed: {_cell(run['error'])} |" + " |" * (len(head) - 4))
                    continue
                eps = run["epochs"]
                r, base = rate(run), rate((ours.get(key) or {}).get(workers))
                cells = [peer["name"], str(ranks), str(workers), _num(eps[0]["rows_per_s"]), _num(eps[1]["rows_per_s"])]
                cells += [_num(r / l0, 2) if r and l0 else "", _num(r / base, 2) if r and base else ""]
                cells += [_num(eps[0]["ttfb_s"], 2), _num(max(e["held_mib"] for e in eps))]
                cells.append(_conversion(peer.get("conversion")))
                shown = str(g.get("workers")) == str(workers) and ranks == guarantee_ranks  # where the checks ran
                cells += guarantee_cells(g) if shown else [""] * len(GUARANTEES)
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


UNEVEN_HEAD = ["loader", "batches per rank"]


def guarantee_cells(g: dict | None) -> list[str]:
    """The six verdicts of one guarantees result, or ``failed: <error>`` in the first column when it did not run."""
    g = g or {}
    if "error" in g:
        return [f"failed: {_cell(g['error'])}"] + [""] * (len(GUARANTEES) - 1)
    return [_cell(g.get(key, "")) for _, key in GUARANTEES]


def uneven_key(start_method: str) -> str:
    """Where the uneven pass with workers started by ``start_method`` sits in the results: ``uneven_fork``, ..."""
    return f"uneven_{start_method}"


def uneven_passes(results: dict) -> list[tuple[str, dict]]:
    """``(start method, pass)`` of every uneven pass in ``results``, in :data:`START_METHODS` order."""
    return [(m, results[uneven_key(m)]) for m in START_METHODS if results.get(uneven_key(m))]


def uneven_markdown(uneven: dict) -> str:
    """The guarantees pass on the uneven store (``run.py``'s ``run_uneven``): one line per loader, the batches
    each rank yielded in epoch 1, the six verdicts; a loader that could not run says why."""
    head = UNEVEN_HEAD + [c for c, _ in GUARANTEES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for peer in uneven["peers"]:
        if peer.get("status") != "ok":
            cells = [peer["name"], _cell(peer.get("reason") or peer.get("status") or "?")]
            lines.append("| " + " | ".join(cells + [""] * (len(head) - 2)) + " |")
            continue
        g = peer.get("guarantees") or {}
        batches = " and ".join(str(b) for b in g.get("batches_per_rank", []))
        lines.append("| " + " | ".join([peer["name"], batches, *guarantee_cells(g)]) + " |")
    return "\n".join(lines)


LAYOUT_HEAD = [
    "store",
    "sample",
    "loader",
    "workers",
    "per s ep1",
    "per s ep2",
    "per s: median [range]",
    "x beluga: median [range]",
    "note",
]
# how a page's layouts table begins, whatever its later columns: run.py --layouts only finds the old table by it
LAYOUT_TABLE_START = "| " + " | ".join(LAYOUT_HEAD[:4]) + " |"
# settings zarrtorch has made its default since: a run measured with one is what the default does now, and a
# refusal that named one (measured before) no longer happens
NOW_DEFAULT = {"allow_shards": "the default since issue 43"}


def _failure(result: dict) -> str | None:
    """What a round's result says instead of epochs (``refused: ...``, ``no API``, ``failed: ...``), else None."""
    if "epochs" in result and not ("error" in result or "refused" in result):
        return None
    why = result.get("refused")
    if why:
        return "refused: " + why if why != "no API" else "no API"
    return "failed: " + str(result.get("error", "no epochs"))


def superseded(run: dict) -> bool:
    """A zarrtorch refusal that named a setting now the default: it was measured before the default changed."""
    why = " ".join(str(r.get("refused", "")) for r in run["rounds"])
    return run["loader"] == "zarrtorch" and any(f"{setting}=True" in why for setting in NOW_DEFAULT)


def counts_as_default(run: dict) -> bool:
    """Run with zarrtorch's default settings, as they are now (no setting, or one that is now the default)."""
    return not run.get("setting") or run["setting"] in NOW_DEFAULT


def _layout_loader(run: dict) -> str:
    name = run["loader"]
    if run.get("setting"):
        name += f", {run['setting']}=True" + (
            f" ({NOW_DEFAULT[run['setting']]})" if run["setting"] in NOW_DEFAULT else ""
        )
    if run.get("batch") == 0:
        name += ", samples one by one (no batches)"
    return name


# -- the layouts part's rounds: every loader of a case runs once a round, so round i of one run and round i of
# another shared the machine's load; a ratio pairs them round by round, and a figure is the median of its rounds
def round_rates(run: dict) -> list[float | None]:
    """Samples/s of each round of a layouts run (epochs 1 and 2 together, as :func:`rate`); ``None`` for a round
    that refused or failed."""
    return [None if _failure(r) else rate(r) for r in run["rounds"]]


def spread(values: list[float | None]) -> dict | None:
    """``median``, ``min``, ``max`` of the rounds that have a value, and every round's (``rounds``, ``None`` where
    that round has none); ``None`` when no round has one."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept), "rounds": list(values)}


def layout_rate(run: dict) -> float | None:
    """The median over rounds of samples/s (epochs 1 and 2 together, as :func:`rate` for the peers)."""
    figures = spread(round_rates(run))
    return figures["median"] if figures else None


def best_per_round(rates: list[list[float | None]]) -> list[float | None]:
    """Round by round, the highest of several runs' samples/s (``None`` where none of them has a value)."""
    rounds = max((len(r) for r in rates), default=0)
    out = []
    for i in range(rounds):
        values = [r[i] for r in rates if i < len(r) and r[i] is not None]
        out.append(max(values, default=None))
    return out


def ratio_per_round(rates: list[float | None], bases: list[float | None]) -> list[float | None]:
    """``rates[i] / bases[i]``, each ratio within one round; ``None`` where either is missing."""
    return [a / b if a and b else None for a, b in zip(rates, bases, strict=False)]


def _beluga_batched(run: dict) -> bool:
    return run["loader"].startswith("zarr-beluga") and bool(run.get("batch"))


def beluga_best_rounds(runs: list[dict], store: str, frames: int) -> list[float | None]:
    """Round by round, zarr-beluga's best batched samples/s on ``store`` for samples of ``frames`` rows (over its
    worker counts)."""
    same = [r for r in runs if r["store"] == store and r["frames"] == frames and _beluga_batched(r)]
    return best_per_round([round_rates(r) for r in same])


def layout_figures(runs: list[dict]) -> list[dict]:
    """Each run's figures as ``run.py`` records them beside its rounds: ``per_s`` (:func:`spread` of its rounds'
    samples/s) and ``x_beluga`` (:func:`spread` of its ratio, round by round, to zarr-beluga's best batched
    figure of the same round on the same store and sample kind)."""
    out = []
    for r in runs:
        best = beluga_best_rounds(runs, r["store"], r["frames"])
        out.append({"per_s": spread(round_rates(r)), "x_beluga": spread(ratio_per_round(round_rates(r), best))})
    return out


def median_range(figures: dict | None, digits: int = 0) -> str:
    """``median [min-max]`` (only the median when all rounds agree to the digits shown); "" for no figures."""
    if not figures:
        return ""
    median, low, high = (_num(figures[k], digits) for k in ("median", "min", "max"))
    return median if low == high else f"{median} [{low}-{high}]"


def _median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def layouts_markdown(layouts: dict) -> str:
    """The layouts part of a run (``run.py``'s ``run_layouts``): one line per store, sample kind (a window of
    ``window_frames`` rows or a single row), loader and worker count; samples/s in epochs 1 and 2 (medians over
    the rounds) and over both (median [lowest-highest] of the rounds); ``x beluga``: the ratio to zarr-beluga's
    best batched figure for that store and sample kind in the same round, median [range] over the rounds. A
    loader that refused the store in every round, or whose epochs were cut (too slow for whole epochs), or that
    failed in some rounds, says so in ``note``; a refusal that named a setting zarrtorch has made its default
    since is left out (:func:`superseded`)."""
    lines = ["| " + " | ".join(LAYOUT_HEAD) + " |", "|" + "---|" * len(LAYOUT_HEAD)]
    runs = layouts["runs"]
    for r, figures in zip(runs, layout_figures(runs), strict=True):
        if superseded(r):
            continue
        frames = r["frames"]
        sample = f"window of {frames}" if frames > 1 else "row"
        start = [r["store"], sample, _layout_loader(r), str(r["workers"])]
        failures = [(i + 1, _failure(result)) for i, result in enumerate(r["rounds"]) if _failure(result)]
        ran = [result for result in r["rounds"] if not _failure(result)]
        if not ran:
            note = failures[0][1] if failures else "no rounds"
            lines.append("| " + " | ".join(start + ["", "", "", "", _cell(note)]) + " |")
            continue
        cut = [result for result in ran if any(e.get("capped_after_s") for e in result["epochs"])]
        notes = []
        if cut:
            after = next(e["capped_after_s"] for e in cut[0]["epochs"] if e.get("capped_after_s"))
            notes.append(f"epochs cut after {after:.0f} s in {len(cut)} of {len(r['rounds'])} rounds")
        notes += [f"round {i}: {why}" for i, why in failures]
        ep1 = _median_of([result["epochs"][0]["rows_per_s"] for result in ran])
        ep2 = _median_of([result["epochs"][1]["rows_per_s"] for result in ran])
        cells = start + [_num(ep1), _num(ep2), median_range(figures["per_s"]), median_range(figures["x_beluga"], 2)]
        lines.append("| " + " | ".join(cells + [_cell("; ".join(notes))]) + " |")
    return "\n".join(lines)


WORKERS_HEAD = [
    "loader",
    "worker counts",
    "batches of rank 0 in epoch 1, per count",
    "same batches for any worker count (workers: first batch that differs)",
]


def workers_markdown(case: dict) -> str:
    """The worker-count case (``run.py``'s ``run_workers_case``): one line per loader, the counts it was read
    with, its batch count per count and the verdict; a loader that could not run says why."""
    lines = ["| " + " | ".join(WORKERS_HEAD) + " |", "|" + "---|" * len(WORKERS_HEAD)]
    for peer in case["peers"]:
        result = peer.get("workers") or {}
        if peer.get("status") != "ok" or "error" in result:
            why = peer.get("reason") or result.get("error") or peer.get("status") or "?"
            lines.append("| " + " | ".join([peer["name"], "", "", _cell(f"not run: {why}")]) + " |")
            continue
        counts = ", ".join(str(w) for w in result["counts"])
        batches = ", ".join(str(n) for n in result["batches"].values())
        lines.append("| " + " | ".join([peer["name"], counts, batches, _cell(result["same_batches"])]) + " |")
    return "\n".join(lines)


# -- the mixing case (run.py --mix-case) ------------------------------------------------------------------------------
MIX_HEAD = [
    "loader",
    "weights",
    "variant",
    "rows per source, epoch 1; epoch 2 (target)",
    "each source within a global batch of its target",
    "each epoch: no row drawn over its share (draws / store rows, rounded up), none under it (rounded down)",
    "the same over epochs 1 and 2 together (a source goes on where it stopped)",
    "per-source batches (epoch 1, epoch 2)",
    "every rank the same source at each step",
    "every rank draws every source",
    "equal batches per rank",
    "epoch 2 order",
    "rows/s",
]
MIX_VERDICTS = ["rows_per_source", "on_target", "quota_once", "two_epochs_once", "homogeneous_batches"]
MIX_VERDICTS += ["same_source_per_step", "every_rank_every_source"]
MIX_VERDICTS += ["equal_batches", "epoch2_order"]


def mix_markdown(case: dict) -> str:
    """The mixing case (``run.py``'s ``run_mix_case``): one line per loader, weight setting and variant, its
    verdicts (``mix_case.mix_verdicts``) and rows/s; a loader or variant that could not run says why."""
    lines = ["| " + " | ".join(MIX_HEAD) + " |", "|" + "---|" * len(MIX_HEAD)]
    for run in case["runs"]:
        weights = "/".join(f"{w:g}" for w in run["weights"])
        mix = run.get("mix") or {}
        if run.get("status") != "ok" or "error" in mix:
            why = run.get("reason") or mix.get("error") or run.get("status") or "?"
            lines.append(
                "| "
                + " | ".join([run["name"], weights, "", _cell(f"not run: {why}")] + [""] * (len(MIX_HEAD) - 4))
                + " |"
            )
            continue
        for variant, result in mix["variants"].items():
            if "error" in result:
                cells = [_cell(f"refused: {result['error']}")] + [""] * (len(MIX_HEAD) - 4)
            else:
                rate = result.get("rows_per_s")
                cells = [_cell(result[k]) for k in MIX_VERDICTS] + ["?" if rate is None else f"{rate:,.0f}"]
            lines.append("| " + " | ".join([run["name"], weights, variant, *cells]) + " |")
    return "\n".join(lines)


CACHE_HEAD = [
    "loader",
    "remote copy",
    "requests ep1",
    "requests ep2 (x ep1)",
    "MiB fetched ep1",
    "MiB fetched ep2 (x ep1)",
    "rows/s ep1",
    "rows/s warm (ep2 on)",
    "warm x ep1",
    "order changes every epoch",
]


def cache_summary(result: dict) -> dict:
    """One loader's cache-case result (``common.cache_epochs`` with the server's ``traffic``) in figures: the
    requests and bytes of epochs 1 and 2 and their ratio, rows/s of epoch 1 and of the warm epochs together
    (their rows over their seconds), and the order verdict."""
    traffic, epochs = result.get("traffic") or {}, result["epochs"]
    first, second = traffic.get("1", {}), traffic.get("2", {})
    warm = epochs[1:]
    warm_rate = sum(e["rows"] for e in warm) / sum(e["seconds"] for e in warm)
    same = [e["epoch"] for e in warm if e["order_as_before"]]
    return {
        "requests": (first.get("requests", 0), second.get("requests", 0)),
        "bytes": (first.get("bytes", 0), second.get("bytes", 0)),
        "rows_per_s": (epochs[0]["rows_per_s"], warm_rate),
        "order": "yes" if not same else "no: epoch " + ", ".join(map(str, same)) + " in the order of the one before",
    }


def _remote(address: str) -> str:
    """A remote copy's address without the stand-in's port, which changes from run to run."""
    return _cell(re.sub(r"^http://[^/]+", "http://stand-in", address))


def _ratio(after: float, before: float) -> str:
    return f"{after / before:.2f}" if before else ""


def cache_markdown(case: dict) -> str:
    """The cache case (``run.py``'s ``run_cache_case``): one line per loader with the traffic and rates of
    :func:`cache_summary`; a loader that could not run or read the stand-in says why, as does one with no remote
    cache (``not_run``)."""
    lines = ["| " + " | ".join(CACHE_HEAD) + " |", "|" + "---|" * len(CACHE_HEAD)]
    for peer in case["peers"]:
        result = peer.get("cache") or {}
        why = peer.get("reason") or result.get("error") or result.get("refused")
        if peer.get("status") != "ok" or why:
            why = why or peer.get("status") or "?"
            lines.append("| " + " | ".join([peer["name"], _remote(result.get("remote", "")), _cell(f"not run: {why}")]))
            lines[-1] += " |" * (len(CACHE_HEAD) - 2)
            continue
        s = cache_summary(result)
        (r1, r2), (b1, b2), (v1, v2) = s["requests"], s["bytes"], s["rows_per_s"]
        cells = [peer["name"], _remote(result["remote"]), f"{r1:,}", f"{r2:,} ({_ratio(r2, r1)})"]
        cells += [f"{b1 / 2**20:,.1f}", f"{b2 / 2**20:,.1f} ({_ratio(b2, b1)})", f"{v1:,.0f}", f"{v2:,.0f}"]
        cells += [_ratio(v2, v1), _cell(s["order"])]
        lines.append("| " + " | ".join(cells) + " |")
    for name, why in (case.get("not_run") or {}).items():
        lines.append("| " + " | ".join([name, "", _cell(f"not run: {why}")]) + " |" * (len(CACHE_HEAD) - 2))
    return "\n".join(lines)
