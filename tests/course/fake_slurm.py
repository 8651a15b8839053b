"""Stand-ins for Slurm on one machine, so that the batch scripts' own lines run as they would in a job.

``srun`` starts ``SLURM_NNODES x SLURM_NTASKS_PER_NODE`` tasks of its command with the variables Slurm gives a
task (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``...), binds each with ``sched_setaffinity`` to the
CPUs it would get (``--cpus-per-task`` or ``SRUN_CPUS_PER_TASK``, else 1 CPU as since Slurm 22.05, at most
this machine's CPUs; ``SLURM_CPUS_PER_TASK`` keeps the job's value then), records their pids, and with
``--kill-on-bad-exit=1`` ends the others when one exits with an error (as Slurm does); ``scontrol show
hostnames`` answers 127.0.0.1 for every node, ``scontrol requeue`` is recorded; ``module`` does nothing.
What is Slurm's documented behaviour is imitated, nothing more: the tests check the scripts and the training
command, not Slurm.
"""

from __future__ import annotations

import os
import random
import socket
import stat
import sys
from pathlib import Path

SRUN = r"""#!PYTHON
import json, os, signal, subprocess, sys, time
args, kill_on_bad_exit, cpus = sys.argv[1:], False, None
while args and args[0].startswith("-"):
    option = args.pop(0)
    if option in ("--kill-on-bad-exit=1", "--kill-on-bad-exit", "-K", "-K1"):
        kill_on_bad_exit = True
    elif option.startswith("--cpus-per-task="):
        cpus = option.split("=", 1)[1]
log = os.environ["FAKE_SLURM_DIR"]
nodes, per_node = int(os.environ["SLURM_NNODES"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
cpus = cpus or os.environ.get("SRUN_CPUS_PER_TASK")  # since Slurm 22.05 srun does not take the job's
here = sorted(os.sched_getaffinity(0))  # this machine's CPUs: every "node" is this machine
bound = min(int(cpus or 1), len(here))  # 1 CPU per task when srun was not told
tasks, cpu_sets = [], []
for rank in range(nodes * per_node):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node),
               SLURM_NODEID=str(rank // per_node), SLURM_NTASKS=str(nodes * per_node), SLURM_STEP_ID="0")
    if cpus:  # srun told: the variable says it; else the job's SLURM_CPUS_PER_TASK stays, as on a real cluster
        env["SLURM_CPUS_PER_TASK"] = cpus
    start = (rank % per_node) * bound  # the tasks of a node on different CPUs where there are enough
    cpu_set = {here[(start + i) % len(here)] for i in range(bound)}
    cpu_sets.append(sorted(cpu_set))
    tasks.append(subprocess.Popen(args, env=env, preexec_fn=lambda s=cpu_set: os.sched_setaffinity(0, s)))
with open(os.path.join(log, "tasks.json"), "w") as f:
    json.dump({"pids": [t.pid for t in tasks], "kill_on_bad_exit": kill_on_bad_exit, "cpus_per_task": cpus,
               "cpu_sets": cpu_sets}, f)
code = 0
while None in [t.poll() for t in tasks]:  # every task polled (a list, not any(): that stops at the first alive)
    bad = [t.returncode for t in tasks if t.returncode not in (None, 0)]
    if bad and kill_on_bad_exit:
        code = code or bad[0]
        for t in tasks:
            if t.poll() is None:
                t.terminate()
        deadline = time.monotonic() + 10
        while any(t.poll() is None for t in tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
        for t in tasks:
            if t.poll() is None:
                t.kill()
        break
    time.sleep(0.1)
codes = [t.wait() for t in tasks]
sys.exit(code or next((c for c in codes if c), 0))
"""

SCONTROL = r"""#!PYTHON
import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `scontrol show hostnames | head -n1`: end quietly, as a C tool does
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    print("\n".join(["127.0.0.1"] * int(os.environ.get("SLURM_NNODES", "1"))))
elif args[:1] == ["requeue"]:
    with open(os.path.join(os.environ["FAKE_SLURM_DIR"], "requeue.log"), "a") as f:
        f.write(" ".join(args) + "\n")
else:
    sys.exit(f"fake scontrol: {args} not imitated")
"""

MODULE = "#!/bin/sh\nexit 0\n"


def install(folder: Path) -> Path:
    """Write the stand-ins into ``folder/bin`` and return that folder (put it first on ``PATH``)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("module", MODULE)):
        path = bin_dir / name
        path.write_text(text.replace("#!PYTHON", f"#!{sys.executable}"))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def job_id_with_a_free_port(base: int = 15000, span: int = 15000) -> int:
    """A job id whose rendezvous port (``base + id % span``, as the scripts compute it) is free here.

    The search starts at a random id: tests running side by side (pytest-xdist) that each took the first free port
    took the same one, and a job run again under its own id (a requeue) then found it in use."""
    first = random.randrange(span)
    for job in range(first, first + span):
        port = base + job % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return job + 10 * span  # a realistic, larger id with the same port
    raise RuntimeError("no free port for the rendezvous")


def job_environment(
    folder: Path, *, nodes: int = 2, tasks_per_node: int = 2, cpus_per_task: int = 1, name: str = "zarrtorch-ddp"
) -> dict:
    """The variables a batch script sees (sbatch's), plus PATH with the stand-ins first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SRUN_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    env.update(
        PATH=f"{install(folder)}{os.pathsep}{env['PATH']}",
        FAKE_SLURM_DIR=str(folder),
        SLURM_JOB_ID=str(job_id_with_a_free_port()),
        SLURM_JOB_NAME=name,
        SLURM_JOB_NODELIST=f"node[1-{nodes}]",
        SLURM_NNODES=str(nodes),
        SLURM_NTASKS_PER_NODE=str(tasks_per_node),
        SLURM_NTASKS=str(nodes * tasks_per_node),
        SLURM_CPUS_PER_TASK=str(cpus_per_task),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return env
