"""``python -m zarrtorch train``: help, a one-epoch run writing metrics.json, and the two multi-process
launchers it supports on a laptop: torchrun, and a simulated ``srun`` (Slurm's environment, 2 tasks)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from zarrtorch import ZarrIterableDataset, prepare_zarr
from zarrtorch.audit import load_state as audit_state
from zarrtorch.course.callbacks import DataWait
from zarrtorch.course.train import torchrun_train, validation_summary

REPO = Path(__file__).resolve().parents[2]
CHUNK = 16
ROWS = 12 * CHUNK + 7  # partial last chunk
SMALL = ["--batch-size", "8", "--hidden", "4", "--depth", "2", "--no-checkpoint"]
LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    fields = rng.normal(size=(ROWS, 4, 8, 16)).astype(np.float32)
    target = (fields[:, 0] + 0.1 * rng.normal(size=(ROWS, 8, 16))).astype(np.float32)
    path = tmp_path_factory.mktemp("cli") / "train.zarr"
    prepare_zarr({"fields": fields, "target": target}, path, chunk_rows=CHUNK, progress=False)
    return path


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra})
    return env


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc


def train_command(store: Path, out: Path, *options: str) -> list[str]:
    """``python -m zarrtorch train`` on ``store``, writing to ``out``, on the CPU, recording the rows it trains."""
    cmd = [sys.executable, "-m", "zarrtorch", "train", "--data", str(store), "--accelerator", "cpu"]
    return cmd + ["--out", str(out), "--record-rows", *options]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_help(tmp_path):
    proc = run([sys.executable, "-m", "zarrtorch", "train", "--help"], cwd=tmp_path)
    for option in (
        "--data",
        "--size",
        "--accelerator",
        "--devices",
        "--nodes",
        "--strategy",
        "--epochs",
        "--batch-size",
        "--workers",
        "--buffer-chunks",
        "--seed",
        "--max-steps",
        "--limit-train-batches",
        "--out",
        "--record-rows",
        "--progress",
        "torchrun",
        "srun",
    ):
        assert option in proc.stdout


def test_one_epoch_writes_metrics(store, tmp_path):
    out = tmp_path / "out"
    proc = run(
        [
            sys.executable,
            "-m",
            "zarrtorch",
            "train",
            "--data",
            str(store),
            "--epochs",
            "1",
            "--out",
            str(out),
            "--record-rows",
            *SMALL,
        ],
        cwd=tmp_path,
    )
    assert "samples/s" in proc.stdout and "skill" in proc.stdout
    assert "%|" not in proc.stdout + proc.stderr  # no progress bar by default
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 1 and metrics["launcher"] is None
    (epoch,) = metrics["epochs"]
    for key in ("train_loss", "val_loss", "val_skill", "samples_per_s"):
        assert np.isfinite(epoch[key]), key
    assert metrics["data"]["fit_rows"] + metrics["data"]["val_rows"] == ROWS
    assert metrics["rows_check"][0]["rows"] == [metrics["data"]["fit_rows"] // 8 * 8]
    assert (out / "logs").is_dir()
    _check_data_wait(metrics, proc.stdout, ranks=1)


def _check_data_wait(metrics: dict, stdout: str, ranks: int) -> None:
    """Every epoch says how long each rank's training loop waited for its next batch (what decides workers or
    not on a node, slurm/CHECKLIST.md step 2), in metrics.json and in one printed line per epoch."""
    waits = metrics["data_wait"]
    assert [w["epoch"] for w in waits] == [e["epoch"] for e in metrics["epochs"]]
    for w in waits:
        assert len(w["share_per_rank"]) == len(w["seconds_per_rank"]) == ranks
        assert all(0 <= share <= 1 for share in w["share_per_rank"]), w
        assert f"epoch {w['epoch']} | data wait" in stdout


def test_a_shorter_period_trains_and_validates_on_its_rows_only(store, tmp_path):
    out = tmp_path / "out"
    run(train_command(store, out, "--epochs", "1", "--rows", str(10 * CHUNK), *SMALL), cwd=tmp_path)
    metrics = json.loads((out / "metrics.json").read_text())
    data = metrics["data"]
    assert (data["rows"], data["fit_rows"] + data["val_rows"]) == (10 * CHUNK, 10 * CHUNK)
    (trained,) = metrics["rows_per_rank"][0]["rows"]
    assert max(trained) < data["fit_rows"] and len(trained) == len(set(trained)) == data["fit_rows"] // 8 * 8
    proc = subprocess.run(
        train_command(store, tmp_path / "refused", "--rows", str(CHUNK + 3), *SMALL),
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and f"error: rows={CHUNK + 3} does not end on a chunk boundary" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_option_is_refused(capsys):
    """In this process: ``python -m zarrtorch`` is ``raise SystemExit(cli.main())`` (test_help runs it as one)."""
    import zarrtorch.cli

    with pytest.raises(SystemExit) as refused:
        zarrtorch.cli.main(["train", "--devices", "zero"])
    assert refused.value.code == 2 and "--devices" in capsys.readouterr().err


def _check_two_ranks(metrics: dict, launcher: str) -> None:
    assert metrics["world_size"] == 2 and metrics["launcher"] == launcher
    fit_rows = metrics["data"]["fit_rows"]
    checks = metrics["rows_check"]
    assert len(checks) == 2
    for c in checks:
        assert c["disjoint"] and c["batches"][0] == c["batches"][1] == fit_rows // 16
    rows = metrics["rows_per_rank"]
    for rank in (0, 1):
        assert set(rows[0]["rows"][rank]) != set(rows[1]["rows"][rank])


@pytest.mark.slow
def test_torchrun_two_cpu_processes(store, tmp_path):
    out = tmp_path / "out"
    proc = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "zarrtorch",
            "train",
            "--data",
            str(store),
            "--accelerator",
            "cpu",
            "--epochs",
            "2",
            "--out",
            str(out),
            "--record-rows",
            "--seed",  # with seed 0, rank 0 happens to get the same 5 of the 10 chunks in epochs 0 and 1 (chance
            "1",  # 1/252), and _check_two_ranks checks that each rank's rows change between epochs
            *SMALL,
        ],
        cwd=tmp_path,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    _check_two_ranks(metrics, "torchrun")
    assert "TorchElasticEnvironment" in proc.stdout
    _check_data_wait(metrics, proc.stdout, ranks=2)


def slurm_env(rank: int, *, tasks: int, nodes: int, port: str, **extra) -> dict:
    """What srun gives one task (plus the rendezvous on 127.0.0.1)."""
    per_node = tasks // nodes
    return clean_env(
        SLURM_NTASKS=str(tasks),
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank % per_node),
        SLURM_NODEID=str(rank // per_node),
        SLURM_NNODES=str(nodes),
        SLURM_NTASKS_PER_NODE=str(per_node),
        SLURM_JOB_NAME="zarrtorch-test",
        SLURM_JOB_ID="4242",
        SLURM_NODELIST="localhost",
        SLURM_JOB_NODELIST="localhost",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        **extra,
    )


@pytest.mark.slow
def test_slurm_requeue_signal_resumes_exactly(store, tmp_path):
    """SIGUSR1 to a running job under Slurm's variables: the command saves checkpoints/requeue.ckpt at the next
    step, calls ``scontrol requeue`` (a stand-in records the call) and ends by itself; Slurm then starts the job
    again with the same command and job id: ``--resume auto`` continues from that checkpoint and trains exactly
    the rest of the epoch (tests/course/test_slurm_jobs.py does the same with 4 ranks and the batch scripts)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    scontrol.chmod(0o755)
    out = tmp_path / "out"
    model = ["--batch-size", "4", "--hidden", "32", "--depth", "4", "--threads", "1"]
    cmd = train_command(store, out, "--epochs", "3", *model, "--resume", "auto")
    env = slurm_env(0, tasks=1, nodes=1, port=str(free_port()), PATH=f"{bin_dir}:{os.environ['PATH']}")
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in job.stdout:  # the command says when it listens for the signal
        lines.append(line)
        if "SIGUSR1 -> checkpoint and requeue" in line:
            break
    time.sleep(0.5)  # around the start of the first epoch (any time from the line above on is handled)
    job.send_signal(signal.SIGUSR1)
    rest, _ = job.communicate(timeout=300)
    assert job.returncode == 0, "".join(lines) + rest
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    ckpt = out / "checkpoints" / "requeue.ckpt"
    saved = audit_state(ckpt)
    assert json.loads((out / "metrics.json").read_text())["requeued"].startswith("requeued at step")
    run(cmd, cwd=tmp_path, env=env)  # the requeued job: same command, same job id, same --out
    metrics = json.loads((out / "metrics.json").read_text())
    fit_rows = metrics["data"]["fit_rows"]
    ds = ZarrIterableDataset(store, seed=0, row_range=(0, fit_rows))
    recorded = {e["epoch"]: e["rows"][0] for e in metrics["rows_per_rank"]}
    assert recorded and max(recorded) == 2  # the requeued run finished the job
    for epoch, rows in recorded.items():  # the interrupted epoch: the rest after the saved position; later: whole
        planned = ds.batch_row_ids(epoch=epoch, batch_size=4, drop_last=True)
        skip = saved["batches_seen"] if epoch == saved["epoch"] else 0
        expected = np.concatenate(planned[skip:]) if skip < len(planned) else np.empty(0, dtype=np.int64)
        np.testing.assert_array_equal(np.asarray(rows, dtype=np.int64), expected)  # none when it had ended
    # the signal may land between epochs (validation): then the saved epoch was complete and is not repeated
    assert saved["epoch"] in recorded or saved["batches_seen"] == len(
        ds.batch_row_ids(epoch=saved["epoch"], batch_size=4, drop_last=True)
    )


def test_one_rule_for_the_cpus_of_a_process(monkeypatch):
    """Under srun each task is bound to --cpus-per-task cores: SLURM_CPUS_PER_TASK is its share, not divided
    again by the tasks per node (8 CPUs once became 2 threads); torchrun's processes share the machine's mask.
    Decode threads follow lesson 04: every core but the training loop's with no workers, else a share each."""
    from zarrtorch.course.train import cpus_per_process, decode_threads_for

    slurm = {"launcher": "slurm", "devices": 4, "nodes": 2, "world_size": 8}
    monkeypatch.setattr("zarrtorch.available_cpus", lambda: 8)
    assert cpus_per_process(slurm, 4, env={"SLURM_CPUS_PER_TASK": "8"}) == 8
    monkeypatch.setattr("zarrtorch.available_cpus", lambda: 16)
    torchrun = {"launcher": "torchrun", "devices": 4, "nodes": 1, "world_size": 4}
    assert cpus_per_process(torchrun, 4, env={}) == 4
    assert decode_threads_for(8, 0) == 7 and decode_threads_for(8, 4) == 2 and decode_threads_for(1, 0) == 1


def test_a_task_bound_to_fewer_cpus_than_slurm_says_uses_its_mask(monkeypatch, capsys):
    """srun since Slurm 22.05, without SRUN_CPUS_PER_TASK, binds each task to 1 CPU while SLURM_CPUS_PER_TASK
    still says 8: 8 threads would share 1 core. The affinity mask is what the task has; the rank says so, with
    the fix."""
    from zarrtorch.course.train import cpus_per_process

    slurm = {"launcher": "slurm", "devices": 4, "nodes": 2, "world_size": 8}
    monkeypatch.setattr("zarrtorch.available_cpus", lambda: 1)
    assert cpus_per_process(slurm, 4, env={"SLURM_CPUS_PER_TASK": "8"}) == 1
    err = capsys.readouterr().err
    assert "SLURM_CPUS_PER_TASK=8" in err and "1 CPU(s)" in err and "export SRUN_CPUS_PER_TASK" in err
    monkeypatch.setattr("zarrtorch.available_cpus", lambda: 8)
    assert cpus_per_process(slurm, 4, env={"SLURM_CPUS_PER_TASK": "8"}) == 8
    assert capsys.readouterr().err == ""  # they agree: nothing to say


def test_a_requeue_without_its_checkpoint_resumes_from_last(store, tmp_path):
    """A node failure requeues the job without ``requeue.ckpt``: ``--resume auto`` continues from ``last.ckpt``
    (the last epoch end) and trains only the epochs after it, each whole."""
    out = tmp_path / "out"
    model = ["--batch-size", "8", "--hidden", "4", "--depth", "2", "--threads", "1"]
    cmd = train_command(store, out, *model, "--resume", "auto")
    env = slurm_env(0, tasks=1, nodes=1, port=str(free_port()))
    first = run([*cmd, "--epochs", "1"], cwd=tmp_path, env=env)  # the job, until the node fails after epoch 0
    assert "resuming from" not in first.stdout
    (out / "checkpoints" / "requeue.ckpt").unlink(missing_ok=True)  # none: no signal came before the failure
    saved = audit_state(out / "checkpoints" / "last.ckpt")  # the loader's position: the end of epoch 0
    again = run([*cmd, "--epochs", "2"], cwd=tmp_path, env=env)
    assert f"resuming from {out / 'checkpoints' / 'last.ckpt'}" in again.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1], "epoch 0 is not trained again"
    ds = ZarrIterableDataset(store, seed=0, row_range=(0, metrics["data"]["fit_rows"]))
    (epoch,) = metrics["rows_per_rank"]
    assert epoch["epoch"] == 1
    planned = np.concatenate(ds.batch_row_ids(epoch=1, batch_size=8, drop_last=True))
    got = np.asarray(epoch["rows"][0], dtype=np.int64)
    assert got.tolist() == planned.tolist(), f"saved {saved}, {len(got)} rows trained of {len(planned)} planned"


def test_resume_auto_takes_the_newer_checkpoint(tmp_path):
    """requeue.ckpt when it is the newer (a requeue mid-epoch), last.ckpt when it is (an old requeue, later
    epochs, then a node failure), either alone, nothing when neither exists."""
    from zarrtorch.course.requeue import resume_path

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert resume_path(tmp_path) is None
    last, requeue = folder / "last.ckpt", folder / "requeue.ckpt"
    last.write_bytes(b"x")
    assert resume_path(tmp_path) == last
    requeue.write_bytes(b"x")
    os.utime(last, ns=(1_000_000_000, 1_000_000_000))
    assert resume_path(tmp_path) == requeue
    os.utime(requeue, ns=(500_000_000, 500_000_000))
    assert resume_path(tmp_path) == last
    last.unlink()
    assert resume_path(tmp_path) == requeue


def test_a_run_stopped_before_validating_says_so_instead_of_nan():
    """`--max-steps` can end a run before its epoch's validation: the last line says it was not validated."""
    assert validation_summary({"train_loss": 0.9, "val_loss": float("nan")}).startswith("not validated")
    assert validation_summary({"train_loss": 0.9}).startswith("not validated")
    said = validation_summary({"val_loss": 0.90261, "val_skill": 0.0791})
    assert said == "val_loss 0.9026, skill vs persistence 0.079"


def test_data_wait_is_the_time_between_a_batch_and_the_next():
    """The share of an epoch's training time (from its start to its last batch's end) that the loop spent between
    one batch's end (or the epoch's start) and the next batch's start: where it waits for the loader."""
    now = [0.0]
    wait = DataWait(clock=lambda: now[0])
    marks = [("start", 0.0), ("batch", 3.0), ("end", 4.0), ("batch", 6.0), ("end", 10.0)]
    for what, t in marks:
        now[0] = t
        if what == "start":
            wait.on_train_epoch_start(None, None)
        elif what == "batch":
            wait.on_train_batch_start(None, None, None, 0)
        else:
            wait.on_train_batch_end(None, None, None, None, 0)
    assert wait.epoch_figures() == (5.0, 10.0)  # waited 3 + 2 s of 10


def test_a_resumed_epoch_counts_its_wait_from_its_first_batch():
    """An epoch resumed from a mid-epoch checkpoint starts without the epoch-start hook: the time before its
    first batch (restoring the checkpoint) is not counted as waiting for data."""
    now = [100.0]
    wait = DataWait(clock=lambda: now[0])
    wait.on_train_batch_start(None, None, None, 0)
    now[0] = 101.0
    wait.on_train_batch_end(None, None, None, None, 0)
    now[0] = 101.5
    wait.on_train_batch_start(None, None, None, 1)
    now[0] = 102.0
    wait.on_train_batch_end(None, None, None, None, 1)
    assert wait.epoch_figures() == (0.5, 2.0)


def test_torchrun_train_prints_the_ranks_lines_as_they_come(tmp_path, capsys):
    """The lesson's launcher: `torchrun -m zarrtorch train ...` in a folder, its lines printed as they come (a
    reader sees progress, not a silent cell), the whole output returned with the exit code."""
    done = torchrun_train(1, "--help", cwd=tmp_path, timeout_s=120)
    printed = capsys.readouterr().out
    assert done.returncode == 0, done.stderr[-2000:]
    assert printed.startswith("starting: torchrun --nproc-per-node 1 -m zarrtorch train --help")
    assert "  | usage: python -m zarrtorch train" in printed and "usage:" in done.stdout


def test_torchrun_train_stops_a_run_past_its_time(tmp_path, capsys):
    """A run that takes longer than `timeout_s` is stopped and says so, instead of holding the notebook."""
    done = torchrun_train(1, "--data", str(tmp_path / "missing.zarr"), cwd=tmp_path, timeout_s=0.01)
    assert done.returncode != 0
    assert "stopped after 0.01 s" in capsys.readouterr().out
