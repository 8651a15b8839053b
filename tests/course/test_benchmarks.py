"""The benchmark runner end to end in its smallest mode (no timing thresholds: the numbers only have to
exist and be positive), plus the determinism of its generated data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402
import pagecache  # noqa: E402

EXPECTED = {  # (size, kind, workers or threads) -> epochs per run
    ("1x", "l0", 1): 1,
    ("1x", "l0", 2): 1,
    ("1x", "zarrtorch", 0): 2,
    ("1x", "zarrtorch", 2): 2,
    ("1x", "rank", 0): 2,  # batch_order="rank"
    ("1x", "rank", 2): 2,
    ("1x", "cache", 0): 2,
    ("1x", "cache", 2): 2,
    ("1x", "reference", 0): 2,
    ("1x", "reference", 2): 2,
    ("1x", "paced", 0): 1,  # epoch 1 in a tight loop; epoch 2 paced, reported under "paced"
    ("1x", "paced", 2): 1,
    ("big", "paced", 0): 1,
    ("big", "paced", 2): 1,
    ("1x", "naive", 0): 1,
    ("1x", "naive", 2): 1,
    ("1x", "numpy", 0): 1,
    ("1x", "numpy", 2): 1,
    ("1x", "startup", 2): 2,  # DataLoader over a dataset with nothing to read: the floor under a first batch
    ("big", "zarrtorch", 0): 2,
    ("big", "zarrtorch", 2): 2,
    ("big", "reference", 0): 2,
    ("big", "reference", 2): 2,
}


def test_generated_rows_do_not_depend_on_the_block():
    whole = harness.generate_rows(0, 64, chunk_rows=16, seed=3)
    assert whole.dtype == np.float32 and whole.shape == (64, *harness.SAMPLE_SHAPE)
    np.testing.assert_array_equal(harness.generate_rows(5, 40, chunk_rows=16, seed=3), whole[5:40])
    assert not np.array_equal(harness.generate_rows(0, 16, chunk_rows=16, seed=4), whole[:16])


def run_tiny(tmp_path, *options) -> dict:
    """``run.py --tiny`` in a subprocess; returns its JSON output."""
    out = tmp_path / "tiny.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--tiny", "--data-dir", str(tmp_path / "data")]
    proc = subprocess.run([*cmd, "--out", str(out), *options], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "targets" in proc.stdout and "samples/s" in proc.stdout
    return json.loads(out.read_text())


def check_epochs(data: dict, expected: dict) -> dict:
    got = {(s["size"], s["kind"], s["par"]): s for s in data["summary"]}
    assert set(got) == set(expected)
    for key, n_epochs in expected.items():
        s = got[key]
        assert len(s["epochs"]) == n_epochs, key
        for e in s["epochs"]:
            for name in ("samples_per_s", "seconds", "ttfb_s", "rss_main_peak_mib"):
                assert e[name] is not None and e[name] > 0, (key, name, e[name])
            assert e["held_mib"] >= 0 and e["cpu_s"] >= 0, key
            if key[1] != "l0" and key[2] > 0:
                assert e["rss_worker_peak_mib"] > 0 and e["uss_worker_peak_mib"] > 0, key
    assert len(data["runs"]) == len(expected)
    return got


@pytest.mark.slow
def test_bench_tiny_end_to_end(tmp_path):
    data = run_tiny(tmp_path)
    check_epochs(data, EXPECTED)
    assert data["meta"]["l0_2_threads_samples_per_s"] > 0
    assert data["targets"] and all(isinstance(t["pass"], bool) for t in data["targets"])
    assert all(Path(info["path"]).exists() for info in data["stores"].values())
    for s in data["summary"]:
        if s["kind"] == "paced":  # the step asks for 80% of the top rate measured in the same process
            p = s["paced"]
            assert p["pace"] == 0.8 and p["step_ms"] > 0 and p["rows"] > 0
            assert abs(p["step_ms"] / 1e3 - 16 / (0.8 * p["top_samples_per_s"])) < 1e-9  # --tiny: batch 16
            assert 0.0 <= p["data_wait_share"] <= 1.0
    assert sum("waiting for data" in t["target"] for t in data["targets"]) == 4
    first_batch = {t["target"].split(":")[0]: t["detail"] for t in data["targets"] if "first batch <=" in t["target"]}
    assert "start-up alone" in first_batch["zarrtorch, 2 workers"]  # beside the floor measured in the same run
    assert "start-up alone" not in first_batch["zarrtorch, 0 workers"]


@pytest.mark.slow
def test_bench_tiny_prototypes_by_thread(tmp_path):
    """The --prototypes variant (DataLoader's queue instead of the ring) runs beside the default, and
    --by-thread splits the CPU of every run by thread role."""
    data = run_tiny(tmp_path, "--only", "zarrtorch", "--prototypes", "--by-thread", "--scale", "1")
    got = check_epochs(data, {("1x", "zarrtorch", 0): 2, ("1x", "zarrtorch", 2): 2, ("1x", "prototype", 2): 2})
    for s in got.values():
        for e in s["epochs"]:
            roles = {k for k in e if k.startswith("threads/")}
            assert roles and all(e[k] >= 0 for k in roles), s["label"]
            assert any("main thread" in k for k in roles), roles


@pytest.mark.slow
def test_remote_latency_table(tmp_path):
    """benchmarks/remote.py on a small store: a figure for every setting, and the delayed server really
    answered every chunk request of every epoch (so the table measures reads, not a cache)."""
    from zarrtorch import prepare_zarr

    store = tmp_path / "r.zarr"
    prepare_zarr({"x": np.ones((96, 4, 8), "f4"), "y": np.arange(96)}, store, chunk_rows=16, progress=False)
    out = tmp_path / "remote.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "remote.py"),
        "--store",
        str(store),
        "--delay-ms",
        "0",
        "5",
        "--in-flight",
        "1",
        "4",
        "--repeats",
        "2",
        "--batch-size",
        "8",
        "--workers",
        "0",
        "--plain-client",
        "2",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "(x): the same setting over HTTP without delay" in proc.stdout
    data = json.loads(out.read_text())
    rows = {(r["delay_ms"], r["setting"]): r for r in data["rows"]}
    assert set(rows) == {(d, s) for d in (None, 0.0, 5.0) for s in ("default", "1 fixed", "4 fixed")}
    assert all(len(r["rows_per_s"]) == 2 and min(r["rows_per_s"]) > 0 for r in rows.values())  # 2 repeats each
    assert all(bool(r["ratio"]) == (r["delay_ms"] == 5.0) for r in rows.values())  # a ratio to 0 ms where delayed
    chunk_requests = 2 * 6 * data["epochs"] * 3 * 2  # arrays x chunks x epochs x settings x repeats
    assert set(data["requests"]) == {"0", "5"} and all(n >= chunk_requests for n in data["requests"].values())
    plain = {(r["delay_ms"], r["in_flight"]): r for r in data["plain_client"]}  # the bare client, 2 at once
    assert set(plain) == {(0.0, 2), (5.0, 2)} and all(len(r["requests_per_s"]) == 2 for r in plain.values())
    assert 0 < min(plain[5.0, 2]["requests_per_s"]) and max(plain[5.0, 2]["requests_per_s"]) <= 2 / 0.005  # Little
    assert plain[5.0, 2]["rows_per_s"][0] == plain[5.0, 2]["requests_per_s"][0] * 16 / 2  # 16-row chunks, 2 arrays
    assert all(len(r["server_cpu_s_per_request"]) == 2 for r in plain.values())  # the server's CPU, each repeat


def test_obstore_eval_maps_the_storage_options_users_pass_today():
    """benchmarks/obstore_eval.py's mapping of fsspec ``storage_options`` onto obstore (what switching the default
    client would need): s3fs's keys, endpoint and region, HTTP headers; an option with no counterpart is named."""
    pytest.importorskip("obstore", reason="obstore is not installed (pip install obstore): nothing to evaluate")
    import obstore_eval

    s3 = {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s", "client_kwargs": {"region_name": "r"}}
    store = obstore_eval.obstore_store("s3://bucket/a/b.zarr", s3 | {"config_kwargs": {"max_pool_connections": 9}})
    assert store.prefix == "a/b.zarr" and store.retry_config["max_retries"] == 0  # zarrtorch's RetryPolicy retries
    assert {k: store.config[k] for k in ("bucket", "endpoint", "access_key_id", "secret_access_key", "region")} == {
        "bucket": "bucket",
        "endpoint": "http://127.0.0.1:9",
        "access_key_id": "k",
        "secret_access_key": "s",
        "region": "r",
    }
    assert str(store.client_options["allow_http"]).lower() == "true"  # a plain http:// endpoint
    assert obstore_eval.obstore_store("s3://public/x", {"anon": True}).config["skip_signature"] in (True, "true")
    http = obstore_eval.obstore_store("https://h/x.zarr", {"client_kwargs": {"headers": {"Authorization": "t"}}})
    assert dict(http.client_options["default_headers"]) == {"authorization": b"t"}
    with pytest.raises(ValueError, match=r"\['profile', 'client_kwargs.verify'\]"):
        obstore_eval.obstore_store("s3://b/x", {"profile": "p", "client_kwargs": {"verify": False}})


@pytest.mark.slow
def test_obstore_eval_tables(tmp_path):
    """benchmarks/obstore_eval.py on a small store over HTTP and S3 (moto): a positive figure for every client,
    part and delay, a ratio to 0 ms where delayed, and every delayed server answered requests (the table measures
    reads, not a cache)."""
    pytest.importorskip("obstore", reason="obstore is not installed (pip install obstore): nothing to evaluate")
    pytest.importorskip("moto", reason="moto is not installed: no S3 stand-in")
    from zarrtorch import prepare_zarr

    store = tmp_path / "r.zarr"
    prepare_zarr({"x": np.ones((256, 4, 8), "f4")}, store, chunk_rows=64, progress=False)
    out = tmp_path / "obstore.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "obstore_eval.py"), "--store", str(store), "--json", str(out)]
    cmd += ["--protocols", "http", "s3", "--parts", "loader", "raw", "gil", "zarr", "--workers", "0"]
    cmd += ["--delay-ms", "0", "5", "--in-flight", "2", "--seconds", "0.2", "--epochs", "1", "--repeats", "1"]
    cmd += ["--zarr-chunks", "2", "--decode-chunks", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    rates = [m for m in data["measurements"] if m["what"] == "rate"]
    cells = {(m["protocol"], m["part"], m["setting"], m["delay_ms"]) for m in rates}
    settings = {
        "loader": {"fsspec, 0 workers", "obstore, 0 workers"},
        "raw": {f"{c}, 2 in flight" for c in obstore_eval_clients()},
        "gil": set(obstore_eval_clients()),
        "zarr": {"FsspecStore", "ObjectStore"},
    }
    expected = {
        (protocol, part, setting, delay)
        for protocol in ("http", "s3")
        for part, names in settings.items()
        for setting in names
        for delay in ((0.0,) if part == "gil" else (0.0, 5.0))
    }
    assert cells == expected
    assert all(len(m["values"]) == 1 and m["values"][0] > 0 for m in data["measurements"])
    assert all(bool(m["ratio"]) == (m["delay_ms"] == 5.0) for m in rates)
    assert set(data["requests"]) == {"http 0", "http 5", "s3 0", "s3 5"} and min(data["requests"].values()) > 4
    assert data["decode"]["us_per_chunk_1_threads"] > 0 and data["decode"]["us_per_chunk_2_threads"] > 0


def obstore_eval_clients() -> list[str]:
    return ["fsspec, zarrtorch's fetcher", "obstore, zarrtorch's fetcher", "obstore.get, N threads"]


@pytest.mark.slow
def test_obstore_eval_fork_part_answers_every_case(tmp_path):
    """benchmarks/obstore_eval.py's fork part: every case (obstore in a forked, spawned or forkserver child, and
    the loader's workers) answers within its deadline whatever obstore does (a hang is reported, not waited
    for), and a spawned or forkserver child reads the store pickled to it."""
    pytest.importorskip("obstore", reason="obstore is not installed (pip install obstore): nothing to evaluate")
    from zarrtorch import prepare_zarr

    store = tmp_path / "r.zarr"
    prepare_zarr({"x": np.ones((128, 4, 8), "f4")}, store, chunk_rows=64, progress=False)
    out = tmp_path / "fork.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "obstore_eval.py"), "--store", str(store), "--json", str(out)]
    # a spawned child imports torch and zarr first: seconds on a loaded machine, so the deadline is not 3 s
    cmd += ["--protocols", "http", "--parts", "fork", "--delay-ms", "0", "--fork-timeout", "12"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    fork = json.loads(out.read_text())["fork"]
    # obstore in a forked child after the parent used it hangs or crashes (exit -11), by run: both are answers
    assert len(fork) == 8 and all(case.get("child") or case.get("error") for case in fork.values())
    for method in ("spawn", "forkserver"):
        case = fork[f"{method} after a request in the parent, the store pickled to the child"]
        assert case["child"].startswith("ok") and case["parent after"].startswith("ok"), case
    assert fork["ZarrDataLoader over an obstore group, 2 workers, forkserver"]["child"].startswith("ok, 128 of 128")
    assert fork["ZarrDataLoader over an obstore group, 2 workers, fork"]["child"].startswith("refused at construction")


def test_head_of_line_model_hands_every_piece_out_in_order():
    """benchmarks/head_of_line.py on a short run: every setting measured in every repeat, each run's pieces handed
    out in order (the script checks it), over the latencies it says it drew."""
    import head_of_line

    out = head_of_line.main(["--pieces", "200", "--level", "16", "--base-ms", "5", "--tail-ms", "1", "--repeats", "2"])
    assert len(out["rates"]) == 5 and all(len(r) == 2 and min(r) > 0 for r in out["rates"].values())
    assert 5 < out["latency_ms"]["p50"] < out["latency_ms"]["p90"] < out["latency_ms"]["p99"]


@pytest.mark.slow
def test_windows_benchmark_counts_reads(tmp_path):
    """benchmarks/windows.py on a small generated store: zarrtorch reads each one-step chunk about once per
    epoch (counted at the reader), the step-by-step reader once per step of every window, and the block table
    has the default, the lengths asked for and the perfect shuffle."""
    out = tmp_path / "windows.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "windows.py"), "--rows", "600", "--chunks", "1", "--repeats", "1"]
    cmd += ["--blocks", "4", "64", "--trade-steps", "5000", "--step-by-step-batches", "3", "--out", str(out)]
    cmd += ["--data-dir", str(tmp_path), "--decode-threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    runs = data["stores"]["1"]
    assert 1.0 <= runs["zarrtorch 0w"]["decodes_per_chunk"] <= 1.1
    assert 1.0 <= runs["zarrtorch 0w 1t"]["decodes_per_chunk"] <= 1.1  # 0 workers, one decode thread
    assert 1.0 <= runs["zarrtorch 2w"]["decodes_per_chunk"] <= 1.1
    assert runs["step by step 0w"]["decodes_per_chunk"] == 6
    assert all(runs[name]["held_mib"] > 0 for name in runs if isinstance(runs[name], dict))  # every reader's memory
    assert [b["block_chunks"] for b in data["blocks"]] == [100, 4, 64, "perfect"]
    assert data["blocks"][-1]["diversity"] > 0.9
    assert all(b["most_held_chunks"] <= b["bound_chunks"] for b in data["blocks"][:-1])  # what loader_memory counts
    assert min(runs["L0 steps/s"], runs["L0r steps/s"], runs["raw steps/s"]) > 0  # the three limits


@pytest.mark.slow
def test_gpu_feed_benchmark_trains_every_window(tmp_path):
    """benchmarks/gpu_feed.py on the CPU (what runs where there is no GPU): a rate for each epoch and worker
    count, every window of the store trained once per epoch."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_feed.py"), "--rows", "300", "--epochs", "2"]
    proc = subprocess.run(cmd + ["--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if "windows/s trained" in line]
    assert len(lines) == 2 and "0 workers" in lines[0] and "2 workers" in lines[1], proc.stdout
    for line in lines:
        assert line.endswith("(295 windows each)")  # 300 steps - 6 per window + 1
        rates = re.search(r"per epoch (.+) \(", line).group(1).split(", ")
        assert len(rates) == 2 and all(float(r.replace(",", "")) > 0 for r in rates)


@pytest.mark.slow
def test_resume_first_batch_benchmark(tmp_path):
    """benchmarks/resume_first_batch.py on a small store: a figure for fresh and resumed loaders with 0 and 2
    workers, and the resumed loader (from a 64 x 4 state, on rank 5 of 48 x 2) really yields a first batch."""
    out = tmp_path / "resume.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "resume_first_batch.py"), "--rows", "400000"]
    cmd += ["--chunk-rows", "2000", "--repeats", "1", "--json", str(out), "--data-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    data = json.loads(out.read_text())
    for key in ("fresh 2w", "resumed 2w", "fresh 0w", "resumed 0w"):
        assert data[key]["seconds"] > 0, key
        assert data["runs"][key][0]["rows"] == 64, key  # a full first batch
    assert data["runs"]["resumed 0w"][0]["batches"] == data["runs"]["resumed 2w"][0]["batches"]  # len() per rank


def _with_its_benchmark_imports(script: Path) -> str:
    """A benchmark script's text and that of the benchmark modules beside it it imports (shared arguments)."""
    imported = re.findall(r"^\s*from (\w+) import", script.read_text(), flags=re.M)
    beside = [script.parent / f"{name}.py" for name in imported if (script.parent / f"{name}.py").exists()]
    return "\n".join(p.read_text() for p in [script, *beside])


def test_node_script_passes_only_flags_its_benchmarks_take():
    """benchmarks/node.sh is run on a loaned node, where a wrong flag costs a loan: every ``--flag`` it passes to
    a benchmark script is one that script's argument parser defines."""
    text = (ROOT / "benchmarks" / "node.sh").read_text()
    script = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))  # commands only
    calls = re.findall(r"(benchmarks/\w+\.py)((?:\\\n|[^\n])*)", script)  # continued lines too
    scripts = {
        "benchmarks/windows.py",
        "benchmarks/remote.py",
        "benchmarks/head_of_line.py",
        "benchmarks/gpu_feed.py",
        "benchmarks/run_lesson.py",
        "benchmarks/pinned_feed.py",
    }
    assert {name for name, _ in calls} == scripts
    for name, args in calls:
        defined = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", _with_its_benchmark_imports(ROOT / name)))
        passed = set(re.findall(r"(?<![\w-])(--[\w-]+)", args))
        assert passed and passed <= defined, (name, passed - defined)
    # the training command, run as a module there (nothing is installed on a node)
    trains = re.findall(r"-m zarrtorch\.course\.train((?:\\\n|[^\n])*)", script)
    defined = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", (ROOT / "zarrtorch/course/train.py").read_text()))
    assert len(trains) == 2
    for args in trains:
        passed = set(re.findall(r"(?<![\w-])(--[\w-]+)", args.split("|")[0]))
        assert passed and passed <= defined, ("zarrtorch.course.train", passed - defined)


def test_pinned_feed_benchmark_refuses_without_cuda_before_it_writes(tmp_path, capsys):
    """benchmarks/pinned_feed.py times copies to a GPU: on a machine without CUDA it says so, names where to run it
    (node.sh) and the flag that checks the script on a CPU, and exits with status 2 before it writes a store or a
    figure (``--check-on-cpu`` runs it here; its figures mean nothing)."""
    import pinned_feed
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the benchmark runs")
    out, data = tmp_path / "pinned.json", tmp_path / "data"
    with pytest.raises(SystemExit) as stop:
        pinned_feed.main(["--data-dir", str(data), "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "torch.cuda.is_available() is False" in err and "node.sh" in err and "--check-on-cpu" in err
    assert not out.exists() and not data.exists()


def test_the_lesson_runner_runs_cells_in_one_namespace_and_stops_at_the_first_error(tmp_path):
    """benchmarks/run_lesson.py, what runs lesson 05 on a node without Jupyter: cells share one namespace, run in
    the notebook's folder, skip magics, record what they print, and the run stops (status 1) at a failing cell."""
    import json

    def notebook(name, cells):
        path = tmp_path / name
        code = [
            {"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None} for c in cells
        ]
        path.write_text(json.dumps({"cells": code, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        return path

    (tmp_path / "here.txt").write_text("found")
    good = notebook("good.ipynb", ["%matplotlib inline\nx = 2", "print(x * 21, open('here.txt').read())"])
    out = tmp_path / "good.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run_lesson.py"), str(good), "--out", str(out)]
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=120).returncode == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["ran"] == 2 and report["results"][1]["printed"] == "42 found\n"
    bad = notebook("bad.ipynb", ["y = 1", "raise ValueError('lesson broke')", "print('never')"])
    cmd[2], cmd[-1] = str(bad), str(tmp_path / "bad.json")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    report = json.loads((tmp_path / "bad.json").read_text())
    assert proc.returncode == 1 and not report["ok"] and report["ran"] == 2
    assert "lesson broke" in report["results"][1]["error"]


def test_dropping_a_file_from_the_page_cache_makes_its_next_read_cold(tmp_path):
    """benchmarks/pagecache.py, what ``--cold`` relies on without root: a file of a few MB, written and read (all
    of it in the page cache), is no longer resident after ``drop_from_cache``, and reading it brings it back."""
    if pagecache.MINCORE is None:
        pytest.skip("this platform's libc has no mincore: the page cache's contents cannot be measured")
    store = tmp_path / "store"
    (store / "c").mkdir(parents=True)
    for name in ("c/0", "c/1"):
        (store / name).write_bytes(np.random.default_rng(0).bytes(3 * 2**20))
    assert pagecache.load_into_cache(store) == 6 * 2**20
    assert pagecache.resident_fraction(store) > 0.9
    assert pagecache.drop_from_cache(store) == 6 * 2**20
    assert pagecache.resident_fraction(store) < 0.1
    (store / "c/1").read_bytes()
    assert 0.4 < pagecache.resident_fraction(store) <= 0.6  # the file read, not the other


def layouts_run(tmp_path, *options) -> dict:
    """``benchmarks/layouts.py`` in a subprocess on a tiny store; returns its JSON output."""
    out = tmp_path / "layouts.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "layouts.py"), "--repeats", "1", "--no-gil-probe"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--out", str(out), *options]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(out.read_text()) | {"stdout": proc.stdout}


@pytest.mark.slow
def test_layouts_era5_cold_reads_three_fields_a_sample_warm_and_cold_with_0_and_2_workers(tmp_path):
    """``layouts.py --era5 --cold`` (issue 43 item 6) on a small grid (the hidden ``--era5-grid``): a group of t2m,
    u10 and v10, one time step a chunk; every figure (raw 1 and 2 threads, zarr's path and direct with 0 and 2
    workers) warm and cold in one run, the store's pages all resident before each warm pass and (almost) none
    before each cold one, and MB/s and cold/warm in the table."""
    options = ["--era5", "--cold", "--rows", "6", "--era5-grid", "9", "16", "--layouts", "v2 blosc lz4 shuffle"]
    data = layouts_run(tmp_path, *options)
    assert data["row_bytes"] == 3 * 9 * 16 * 4 and data["workers"] == [0, 2]
    figures = {"raw_1t", "raw_2t", "raw_2t_cpu_per_wall", "zarr 0w", "direct 0w", "zarr 2w", "direct 2w"}
    for layout, run in data["layouts"].items():
        assert {k for k in run if k not in ("path", "resident", "stored_mb", "files_left_after_drop")} == figures | {
            f"{f} cold" for f in figures
        }
        assert all(run[f]["median"] > 0 and run[f"{f} cold"]["median"] > 0 for f in figures), layout
        if pagecache.MINCORE is not None:
            shares, left = run["resident"], run.get("files_left_after_drop")
            assert shares["warm"]["min"] > 0.9 and shares["cold"]["max"] < 0.1, (shares, left)
    store = tmp_path / "data" / "era5-v2-blosc-lz4-shuffle-6x9x16.zarr"
    assert sorted(p.name for p in store.iterdir() if p.is_dir()) == ["t2m", "u10", "v10"]
    assert "warm MB/s" in data["stdout"] and "cold/warm" in data["stdout"]


@pytest.mark.slow
def test_windows_cold_measures_every_figure_again_from_an_evicted_store(tmp_path):
    """``windows.py --cold`` (issue 43 item 6): every limit and reader of the store also cold, each pass after the
    store's pages were dropped (the warm ones after they were read in), and the table prints cold / warm."""
    out = tmp_path / "windows.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "windows.py"), "--cold", "--rows", "100", "--chunks", "8"]
    cmd += ["--repeats", "1", "--blocks", "4", "--trade-steps", "300", "--step-by-step-batches", "1"]
    cmd += ["--data-dir", str(tmp_path), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = json.loads(out.read_text())["stores"]["8"]
    warm = {name for name in runs if not name.endswith(" cold") and name != "resident"}
    assert len(warm) == 7 and {name for name in runs if name.endswith(" cold")} == {f"{n} cold" for n in warm}
    assert all((r["windows_s"] if isinstance(r, dict) else r) > 0 for n, r in runs.items() if n != "resident")
    if pagecache.MINCORE is not None:
        assert runs["resident"]["warm"]["min"] > 0.9 and runs["resident"]["cold"]["max"] < 0.1, runs["resident"]
    assert "cold/warm" in proc.stdout


def test_cache_benchmark_counts_the_servers_chunks_and_what_placement_costs(tmp_path):
    """benchmarks/cache.py's parts that are not timings: the chunk requests of a cached loader's two epochs (every
    chunk, then none), and the fraction of the store a rank sees falling with ``redeal_every``."""
    import importlib.util

    from zarrtorch import prepare_zarr

    spec = importlib.util.spec_from_file_location("cache_benchmark", ROOT / "benchmarks" / "cache.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    store = tmp_path / "c.zarr"
    prepare_zarr({"x": np.ones((96, 4), "f4")}, store, chunk_rows=16, progress=False)
    traffic = bench.bytes_per_epoch(store, 0.0, 16, 0)
    assert traffic["epoch 1"]["chunk_requests"] == 6 and traffic["epoch 1"]["bytes"] > 0
    assert traffic["epoch 2"] == {"chunk_requests": 0, "bytes": 0}
    seen = [q["chunks_seen_by_a_rank"] for q in bench.placement_cost(1280, epochs=4, world=2, workers=0).values()]
    assert seen[0] > seen[-1] == pytest.approx(0.5)  # every epoch: more than a rank's half; kept 4 epochs: its half


def test_small_chunks_benchmark_compares_the_read_plans_it_names(tmp_path):
    """benchmarks/small_chunks.py's store is what it says (ten arrays of one-row Blosc lz4 chunks, each read by the
    direct decoder), its settings are the two plans it compares (one read, in the gathering thread; two in flight
    beside it), and every setting gets a rate per round for rows and windows."""
    import importlib.util

    import zarr

    from zarrtorch import ReadOptions, ReadPlan, ZarrIterableDataset
    from zarrtorch._read.fastpath import read_path_text

    spec = importlib.util.spec_from_file_location("small_chunks_benchmark", ROOT / "benchmarks" / "small_chunks.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    store = bench.group_store(48, tmp_path)
    group = zarr.open_group(str(store), mode="r")
    assert sorted(group.array_keys()) == sorted(bench.VARIABLES)
    assert {read_path_text(a) for _, a in group.arrays()} == {"direct (v2, blosc lz4 shuffle)"}
    plans = [
        ReadPlan.of(ZarrIterableDataset(store, read=ReadOptions(**options)), 0) for options in bench.SETTINGS.values()
    ]
    assert [(p.threads, p.most_in_flight) for p in plans] == [(1, 1), (1, 2)]
    results = bench.main(["--rows", "48", "--rounds", "2", "--workers", "0", "--data-dir", str(tmp_path)])
    assert set(results) == {"rows, 0 workers", "windows of 6, 0 workers"}
    for case in results.values():
        assert [len(got["per_s"]) for got in case.values()] == [2, 2]
        assert all(rate > 0 for got in case.values() for rate in got["per_s"])


def test_task_size_benchmark_builds_each_loader_with_its_task_size_and_leaves_the_default(tmp_path, monkeypatch):
    """benchmarks/task_size.py compares loaders that differ in ``READ_TASK_BYTES`` alone: each loader's plan has the
    chunks a task of its size holds (128 KiB rows: 2 and 8), the package's constant is as before once they are made,
    and every size gets its rates and ratios, for rows and for windows."""
    import importlib.util

    import zarrtorch._util.sizes as sizes

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("task_size_benchmark", ROOT / "benchmarks" / "task_size.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    default = sizes.READ_TASK_BYTES
    for windows in ([], ["--windows"]):
        args = ["--rows", "24", "--rounds", "1", "--layouts", "v2 no compressor", "--data-dir", str(tmp_path)]
        run = bench.main(args + windows)["layouts"]["v2 no compressor"]
        assert run["pieces_per_read"] == {256: 2, 1024: 8}
        assert sizes.READ_TASK_BYTES == default
        assert run["over_first"][256] == 1.0 and all(r > 0 for r in run["median"].values())
        assert set(run["over_raw"]) == {256, 1024}


def test_cache_cold_benchmark_keeps_nothing_only_in_its_setting_and_puts_the_cache_back(tmp_path):
    """benchmarks/cache_cold.py: the ``cache`` setting fills its folder, ``cache, nothing kept`` leaves it empty
    (the hand-over replaced for that epoch alone), ``write_soon`` is the cache's own again afterwards, and each
    setting gets a rate and a ratio per round."""
    import importlib.util

    from zarrtorch import prepare_zarr
    from zarrtorch._read import cache as cache_module

    spec = importlib.util.spec_from_file_location("cache_cold_benchmark", ROOT / "benchmarks" / "cache_cold.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    store = tmp_path / "c.zarr"
    prepare_zarr({"x": np.ones((96, 4), "f4")}, store, chunk_rows=16, progress=False)
    own = cache_module.write_soon
    results = bench.main(["--store", str(store), "--delay-ms", "0", "--rounds", "2", "--batch-size", "16"])
    assert cache_module.write_soon is own
    settings = results["settings"]
    assert list(settings) == list(bench.SETTINGS)
    assert all(r["packs"] == 0 for r in settings["no cache"]["per_round"])
    assert all(r["packs"] >= 1 for r in settings["cache"]["per_round"])
    assert all(r["packs"] == 0 for r in settings["cache, nothing kept"]["per_round"])
    for got in settings.values():
        assert len(got["per_round"]) == 2 and all(r["rows_per_s"] > 0 for r in got["per_round"])
    assert settings["no cache"]["vs_no_cache"]["median"] == 1.0
