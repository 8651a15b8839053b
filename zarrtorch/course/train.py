"""``python -m zarrtorch train``: train the course's forecast model with Lightning, on one process or many.

The same command runs everywhere; how many processes there are is decided by the launcher:

* one process: ``python -m zarrtorch train --size tiny``;
* several processes on one machine: ``torchrun --nproc-per-node 2 -m zarrtorch train ...`` (the number
  of devices is read from torchrun's environment);
* a Slurm job: ``srun python -m zarrtorch train --accelerator gpu ...`` with one task per GPU (devices and
  nodes are read from ``SLURM_NTASKS_PER_NODE``/``SLURM_GPUS_ON_NODE`` and ``SLURM_NNODES``; Lightning picks
  up ranks and the master address from Slurm itself).

Every epoch, rank 0 prints how long each rank's training loop waited for its next batch (:class:`DataWait`):
what to compare between ``--workers 0`` and ``--workers 2`` on a node (``slurm/CHECKLIST.md``, step 2).

At the end, rank 0 writes ``<out>/metrics.json``: the configuration, per-epoch train/validation loss,
skill against persistence, training throughput and data wait, and (``--record-rows``) the rows each rank
trained on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from zarrtorch.course.say import say

EPILOG = """\
examples:
  python -m zarrtorch train --size tiny --epochs 2
  torchrun --nproc-per-node 2 -m zarrtorch train --size tiny --accelerator cpu --epochs 1
  srun python -m zarrtorch train --accelerator gpu --devices $SLURM_NTASKS_PER_NODE --nodes $SLURM_NNODES

Processes: under torchrun or srun, --devices and --nodes default to what the launcher started (one process
per device); the strategy is then DDP. Results: <out>/metrics.json (rank 0), CSV logs under <out>/logs.
"""


def _int_or_auto(text: str):
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a value >= 1, got {value}")
    return value


def _batches(text: str):
    """An integer number of batches, or a fraction of the epoch in (0, 1]."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return int(value) if ("." not in text and "e" not in text.lower()) else value


def build_parser() -> argparse.ArgumentParser:
    from zarrtorch.course.paths import SIZES

    p = argparse.ArgumentParser(
        prog="python -m zarrtorch train",
        description="Train a small CNN that forecasts the next 6-hourly temperature field from the current\n"
        "fields, with PyTorch Lightning, streaming a first-axis-chunked Zarr store through zarrtorch's loader.\n"
        "Validation uses the last chunks in time; skill = 1 - MSE(model) / MSE(persistence).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = p.add_argument_group("data")
    d.add_argument(
        "--data",
        type=Path,
        default=None,
        help="a store prepared with prepare_zarr holding 'fields' and 'target' (default: the course's "
        "train.zarr for --size)",
    )
    d.add_argument(
        "--size", choices=SIZES, default=None, help="course dataset size (default: $ZARRTORCH_SIZE or small)"
    )
    d.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="share of the chunks, at the end in time, kept for validation (default 0.2)",
    )
    d.add_argument(
        "--rows",
        type=int,
        default=None,
        help="use only the store's first ROWS rows, a whole number of chunks (default: all): a shorter period",
    )
    ld = p.add_argument_group("loading")
    ld.add_argument("--batch-size", type=int, default=32, help="rows per batch on each process (default 32)")
    ld.add_argument(
        "--workers", type=int, default=0, help="DataLoader worker processes per training process (default 0)"
    )
    ld.add_argument("--buffer-chunks", type=int, default=8, help="shuffle-buffer size in chunks (default 8)")
    ld.add_argument(
        "--shuffle",
        choices=("none", "chunks", "full"),
        default="full",
        help="none: time order; chunks: random chunk order only; full: chunk order + buffer (default)",
    )
    ld.add_argument("--seed", type=int, default=0, help="seed shared by every process (default 0)")
    h = p.add_argument_group("hardware and processes")
    h.add_argument("--accelerator", default="auto", help="auto | cpu | gpu | cuda | mps (default auto)")
    h.add_argument(
        "--devices",
        type=_int_or_auto,
        default="auto",
        help="processes (devices) per node; default: from torchrun/Slurm, else Lightning's choice",
    )
    h.add_argument(
        "--nodes", type=int, default=None, help="number of nodes (default: $SLURM_NNODES, from torchrun, or 1)"
    )
    h.add_argument(
        "--strategy", default="auto", help="Lightning strategy (default: ddp when there are several processes)"
    )
    h.add_argument(
        "--precision", default=None, help="Lightning precision, e.g. bf16-mixed on recent GPUs (default 32-true)"
    )
    h.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads per process (default: the CPUs "
        "this process may use, shared between the processes of a node)",
    )
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=int, default=2, help="epochs (default 2)")
    t.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (default: no limit)")
    t.add_argument(
        "--limit-train-batches",
        type=_batches,
        default=None,
        help="batches per epoch: an integer count or a fraction (default: all)",
    )
    t.add_argument("--limit-val-batches", type=_batches, default=None, help="validation batches: count or fraction")
    t.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    t.add_argument("--hidden", type=int, default=16, help="CNN channels (default 16)")
    t.add_argument("--depth", type=int, default=3, help="CNN convolution layers (default 3)")
    t.add_argument(
        "--deterministic", action="store_true", help="deterministic algorithms (reproducible, slower on GPU)"
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        type=Path,
        default=Path("lightning_logs/zarrtorch-train"),
        help="folder for metrics.json, CSV logs and the checkpoint (default lightning_logs/zarrtorch-train)",
    )
    o.add_argument(
        "--record-rows",
        action="store_true",
        help="record the rows each process trained on, every "
        "epoch, in metrics.json (checks the partition: disjoint ranks, new rows every epoch)",
    )
    o.add_argument("--no-checkpoint", action="store_true", help="do not save a checkpoint")
    o.add_argument(
        "--checkpoint-every-n-steps",
        type=int,
        default=0,
        help="also save <out>/checkpoints/last.ckpt every N optimizer steps, mid-epoch (default: at epoch ends)",
    )
    o.add_argument(
        "--resume",
        default=None,
        help="continue from a checkpoint: a .ckpt path; 'last' for <out>/checkpoints/last.ckpt; 'auto' for the "
        "checkpoint a requeue saved (<out>/checkpoints/requeue.ckpt), else last.ckpt, else a fresh start (what "
        "the Slurm scripts pass: a requeued job continues). On another number of processes the interrupted "
        "epoch continues without reading a row twice",
    )
    o.add_argument("--progress", action="store_true", help="show Lightning's progress bar (off by default)")
    return p


# ---------------------------------------------------------------------------------------------------------
# How many processes: from the launcher's environment
# ---------------------------------------------------------------------------------------------------------
def _first_int(text: str | None) -> int | None:
    """``SLURM_NTASKS_PER_NODE`` looks like ``4`` or ``4(x2)``; GPU counts may be ``gpu:4``."""
    if not text:
        return None
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def launcher_topology(env: dict | None = None) -> dict:
    """What the launcher started: ``{"launcher", "devices", "nodes", "world_size"}`` (devices/nodes may be None)."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env or "LOCAL_WORLD_SIZE" in env:  # torchrun
        world = int(env.get("WORLD_SIZE", "1"))
        local = int(env.get("LOCAL_WORLD_SIZE", world))
        return {"launcher": "torchrun", "devices": local, "nodes": max(1, world // max(1, local)), "world_size": world}
    if "SLURM_NTASKS" in env and "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        nodes = _first_int(env.get("SLURM_NNODES")) or 1
        devices = _first_int(env.get("SLURM_NTASKS_PER_NODE")) or _first_int(env.get("SLURM_GPUS_ON_NODE"))
        if devices is None:
            devices = max(1, int(env["SLURM_NTASKS"]) // nodes)
        return {"launcher": "slurm", "devices": devices, "nodes": nodes, "world_size": int(env["SLURM_NTASKS"])}
    return {"launcher": None, "devices": None, "nodes": None, "world_size": 1}


def _resolve_processes(args) -> tuple[object, int, str, dict]:
    topo = launcher_topology()
    devices = args.devices
    if devices == "auto" and topo["devices"] is not None:
        devices = topo["devices"]
    nodes = args.nodes if args.nodes is not None else (topo["nodes"] or 1)
    strategy = args.strategy
    if strategy == "auto" and (topo["world_size"] > 1 or (isinstance(devices, int) and devices * nodes > 1)):
        strategy = "ddp"
    return devices, nodes, strategy, topo


def _local_processes(devices, topo) -> int:
    if topo["devices"]:
        return int(topo["devices"])
    return devices if isinstance(devices, int) else 1


def cpus_per_process(topo: dict, local_processes: int, env: dict | None = None) -> int:
    """The CPUs each training process has. In a Slurm job: ``SLURM_CPUS_PER_TASK``, but never more than the
    task's :func:`~zarrtorch.available_cpus` (its affinity mask, capped by a cgroup CPU quota), because srun
    since Slurm 22.05 binds a task to 1 CPU unless told (``SRUN_CPUS_PER_TASK``) while the variable still says
    what the job asked for; a disagreement is printed. Elsewhere: this process's CPUs shared by the training
    processes of this machine (torchrun and ``ddp_notebook`` do not bind)."""
    from zarrtorch import available_cpus

    env = os.environ if env is None else env
    if topo["launcher"] == "slurm" and env.get("SLURM_CPUS_PER_TASK"):
        asked, mask = max(1, _first_int(env["SLURM_CPUS_PER_TASK"]) or 1), available_cpus()
        if mask < asked:
            say(
                f"zarrtorch: SLURM_CPUS_PER_TASK={asked} but this task may use {mask} CPU(s) (its affinity "
                f"mask, or a cgroup CPU quota): using {mask}. srun (Slurm 22.05 and newer) does not take "
                "--cpus-per-task from the batch script: `export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK` before srun",
                sys.stderr,
            )
        elif mask > asked:  # srun did not bind the task (no task/affinity plugin): the job's share is the rule
            say(
                f"zarrtorch: SLURM_CPUS_PER_TASK={asked}, {mask} CPU(s) available (the task is not bound): "
                f"using {asked}",
                sys.stderr,
            )
        return min(asked, mask)
    return max(1, available_cpus() // max(1, local_processes))


def decode_threads_for(cpus: int, workers: int) -> int:
    """Lesson 04's rule: with no workers, every core but one (the training loop's) decodes; with workers,
    each decodes in its share of the cores."""
    return max(1, cpus - 1) if workers == 0 else max(1, cpus // workers)


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------
def data_module(store, args, decode: int):
    """The training command's ``ZarrDataModule``: its options, and the decode threads each process gets."""
    from zarrtorch import ReadOptions
    from zarrtorch.lightning import ZarrDataModule

    return ZarrDataModule(
        store,
        batch_size=args.batch_size,
        num_workers=args.workers,
        buffer_chunks=args.buffer_chunks,
        seed=args.seed,
        val_fraction=args.val_fraction,
        rows=args.rows,
        shuffle=args.shuffle,
        return_index=args.record_rows,
        read=ReadOptions(decode_threads=decode),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)

    import lightning as L
    import torch

    from zarrtorch import available_cpus
    from zarrtorch.course.callbacks import DataWait, HistoryWriter, RowRecorder, quiet_lightning, summarize_rows
    from zarrtorch.course.requeue import AgreedRequeue, Requeued, resume_path, slurm_environment

    quiet_lightning()
    from zarrtorch.course.models import ForecastModule, channel_stats
    from zarrtorch.course.paths import course_size, train_store_path

    store = args.data
    if store is None:
        size = course_size(args.size)
        if launcher_topology()["world_size"] > 1:  # several processes: none of them may write the data
            store = train_store_path(size)
            if not store.exists():
                print(
                    f"error: no course data for size {size!r}: generate it once before a multi-process run with "
                    f"`python -m zarrtorch make-data --size {size}`, or pass --data",
                    file=sys.stderr,
                )
                return 2
        else:
            from zarrtorch.course.synthetic import ensure_data

            store = ensure_data(size)["train"]
    store = Path(store)
    devices, nodes, strategy, topo = _resolve_processes(args)
    cpus = cpus_per_process(topo, _local_processes(devices, topo))
    threads = args.threads or cpus
    decode = decode_threads_for(cpus, args.workers)
    torch.set_num_threads(threads)
    try:
        dm = data_module(store, args, decode)
    except ValueError as exc:  # a period or split the store cannot have: say which, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    L.seed_everything(args.seed, workers=True, verbose=False)

    out = args.out
    data_wait = DataWait()
    callbacks = [HistoryWriter(out / "history.json"), data_wait]
    requeue = AgreedRequeue(out / "checkpoints" / "requeue.ckpt") if "SLURM_JOB_ID" in os.environ else None
    if requeue is not None:  # before the Trainer: the signal may come at any time from here on
        callbacks.append(requeue)
        requeue.listen()
    recorder = RowRecorder() if args.record_rows else None
    if recorder is not None:
        callbacks.append(recorder)
    if not args.no_checkpoint:
        from lightning.pytorch.callbacks import ModelCheckpoint

        every = args.checkpoint_every_n_steps or None
        callbacks.append(
            ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0, every_n_train_steps=every)
        )
    from lightning.pytorch.loggers import CSVLogger

    trainer_kwargs = dict(
        accelerator=args.accelerator,
        devices=devices,
        num_nodes=nodes,
        strategy=strategy,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        deterministic=args.deterministic or None,
        enable_progress_bar=args.progress,
        enable_model_summary=False,
        logger=CSVLogger(out, name="logs"),
        callbacks=callbacks,
        enable_checkpointing=not args.no_checkpoint,
        default_root_dir=out,
        num_sanity_val_steps=0,
        log_every_n_steps=min(10, args.limit_train_batches) if isinstance(args.limit_train_batches, int) else 10,
    )
    if topo["launcher"] == "slurm":  # explicitly (an interactive allocation is ignored otherwise), own requeue off
        trainer_kwargs["plugins"] = [slurm_environment()]
    if args.precision:
        trainer_kwargs["precision"] = args.precision
    if args.limit_train_batches is not None:
        trainer_kwargs["limit_train_batches"] = args.limit_train_batches
    if args.limit_val_batches is not None:
        trainer_kwargs["limit_val_batches"] = args.limit_val_batches
    trainer = L.Trainer(**trainer_kwargs)
    rank = trainer.global_rank
    say(
        f"rank {rank}/{trainer.world_size} on {os.uname().nodename}: {available_cpus()} CPU(s) available "
        f"(affinity mask, CPU quota), {cpus} per process, {threads} torch thread(s), {decode} decode thread(s), "
        f"{args.workers} DataLoader worker(s){'; SIGUSR1 -> checkpoint and requeue' if requeue is not None else ''}"
    )

    stats = channel_stats(dm.store, stop_row=dm.split_plan.split_row)
    model = ForecastModule(stats, hidden=args.hidden, depth=args.depth, lr=args.lr, print_epochs=True)
    if trainer.is_global_zero:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"data: {dm.describe()}", flush=True)
        print(
            f"processes: {trainer.world_size} ({trainer.num_nodes} node(s) x {trainer.num_devices} device(s), "
            f"{type(trainer.accelerator).__name__.replace('Accelerator', '')}, {type(trainer.strategy).__name__}"
            f"{', ' + type(env).__name__ if (env := getattr(trainer.strategy, 'cluster_environment', None)) else ''}"
            f"{', launched by ' + topo['launcher'] if topo['launcher'] else ''}); {threads} CPU thread(s) per "
            f"process; model: {n_params} parameters; batch {args.batch_size} per process, shuffle {args.shuffle}",
            flush=True,
        )

    ckpt_path = None
    if args.resume == "auto":
        ckpt_path = resume_path(out)  # None: a fresh start
        if ckpt_path is not None and trainer.is_global_zero:
            print(f"resuming from {ckpt_path}", flush=True)
    elif args.resume == "last":
        ckpt_path = out / "checkpoints" / "last.ckpt"
    elif args.resume:
        ckpt_path = Path(args.resume)
    if ckpt_path is not None and not ckpt_path.exists():
        print(f"error: no checkpoint at {ckpt_path} to resume from", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    requeued = None
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    except Requeued as stop:  # every rank, at the same step: this job ends, the requeued one continues
        requeued = str(stop)
    wall = time.perf_counter() - t0

    if not trainer.is_global_zero:
        return 0
    history = model.history
    speeds = [h["samples_per_s"] for h in history]
    metrics = {
        "command": "python -m zarrtorch train " + " ".join(sys.argv[1:] if argv is None else argv),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": {
            "store": store.name,
            "rows": dm.split_plan.rows,
            "chunk_rows": dm.split_plan.chunk_rows,
            "fit_rows": dm.split_plan.fit_rows,
            "val_rows": dm.split_plan.val_rows,
        },
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "devices_per_node": trainer.num_devices,
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
        "launcher": topo["launcher"],
        "threads_per_process": threads,
        "epochs": history,
        "samples_per_s": speeds[-1] if speeds else None,
        "samples_per_s_note": "all processes together, last epoch (the first epoch includes start-up)",
        "data_wait": data_wait.figures,
        "fit_seconds": wall,
        "requeued": requeued,
        "final": {
            k: history[-1][k]
            for k in ("train_loss", "val_loss", "val_skill", "val_mse", "persistence_mse")
            if history and k in history[-1]
        },
    }
    if recorder is not None:
        metrics["rows_check"] = summarize_rows(recorder.epochs)
        metrics["rows_per_rank"] = recorder.epochs
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    final = metrics["final"]
    if final:
        print(
            f"done in {wall:.1f} s: {validation_summary(final)}, {metrics['samples_per_s']:.0f} samples/s in the "
            f"last epoch; metrics in {out / 'metrics.json'}",
            flush=True,
        )
    return 0


def torchrun_train(
    nproc: int, *options: str, cwd: str | os.PathLike, timeout_s: float = 600
) -> subprocess.CompletedProcess:
    """Run ``torchrun --nproc-per-node NPROC -m zarrtorch train OPTIONS`` in ``cwd`` with this Python (``python -m
    torch.distributed.run``, what ``torchrun`` is), on a free port, one CPU thread per process. Prints what it
    starts and each line of the ranks' output as it comes (rank 0 prints the epochs), and stops the run after
    ``timeout_s`` seconds, saying so, rather than holding a notebook cell without a word. Returns the exit code,
    the output and the errors (Lightning's warnings go there)."""
    import socket
    import tempfile
    import threading

    with socket.socket() as s:  # a free port for the processes to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(port)]
    command = [*head, "-m", "zarrtorch", "train", *options]
    say(f"starting: torchrun --nproc-per-node {nproc} -m zarrtorch train {' '.join(options)}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as err:
        # a session of its own: stopping it stops the ranks torchrun started too
        proc = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
        )
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # already gone
                pass

        timer = threading.Timer(timeout_s, stop)
        timer.start()
        lines = []
        for line in proc.stdout:
            lines.append(line)
            say("  | " + line.rstrip("\n"))
        returncode = proc.wait()
        timer.cancel()
        err.seek(0)
        errors = err.read()
    took = time.perf_counter() - start
    say(f"stopped after {timeout_s:g} s" if stopped.is_set() else f"exit code {returncode} after {took:.0f} s")
    return subprocess.CompletedProcess(command, returncode, "".join(lines), errors)


def validation_summary(final: dict) -> str:
    """The last validation's loss and skill, or that none ran (a run stopped by ``--max-steps`` before the
    epoch's validation), rather than printing NaN as if the model had diverged."""
    loss = final.get("val_loss")
    if loss is None or math.isnan(loss):
        return "not validated (the run stopped before its epoch's validation)"
    return f"val_loss {loss:.4f}, skill vs persistence {final.get('val_skill', float('nan')):.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
