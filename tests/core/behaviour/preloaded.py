"""Rank processes for the DDP tests, forked from a server that imported torch and zarrtorch once.

A DDP test starts two or three rank processes per launch, and a fresh interpreter spends about two seconds of
CPU importing torch before its first line: over test_ddp.py's launches, a minute of a 2-core CI run. Python's
forkserver starts one process per test worker that imports the modules named here, then forks a child per
rank. Each child is still a process of its own, with the environment torchrun would give it (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and its own gloo connections; it runs the rank's script as
``__main__`` (so spawned DataLoader workers import it as they would under torchrun), its output in a file.
What a fresh interpreter alone can show (torchrun itself, imports in a new process) is tested with real
launches elsewhere (test_torchrun.py, tests/course/test_train.py)."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
from pathlib import Path

PRELOAD = ["numpy", "torch", "torch.distributed", "zarr", "zarrtorch"]


def _run(script: str | None, code: str | None, argv: list[str], env: dict, cwd: str, log: str) -> None:
    """The child: the rank's environment, folder and output file, then its script as ``__main__``."""
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "OMP_NUM_THREADS" in env:  # read when torch was imported, in the server: applied again here
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if code is not None:
        sys.argv = ["-c", *argv]
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [script, *argv]
        runpy.run_path(script, run_name="__main__")


class Rank:
    """One rank: ``Rank(script=path or code=text, argv, env)``; :meth:`communicate` waits and returns its
    output; :attr:`returncode` as a Popen's (negative: the signal that ended it)."""

    def __init__(self, argv, env, *, script=None, code=None, cwd=None, log_dir):
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)  # takes effect when this test worker's server first starts
        self.log = Path(log_dir) / f"rank-{os.getpid()}-{id(self)}.log"
        args = (None if script is None else str(script), code, [str(a) for a in argv], dict(env))
        self.process = context.Process(target=_run, args=(*args, str(cwd or os.getcwd()), str(self.log)))
        self.process.start()
        self.pid = self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def communicate(self, timeout: float) -> tuple[str, None]:
        """Wait up to ``timeout`` seconds (``TimeoutError`` past it, the rank still running) and return its
        output, as ``Popen.communicate`` does with stderr joined to stdout."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise TimeoutError(f"rank process {self.pid} still running after {timeout} s")
        return self.log.read_text(errors="replace"), None

    def kill(self) -> None:
        self.process.kill()

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode


def end_still_running(ranks: list[Rank]) -> None:
    """Kill and reap the ranks that have not ended (a launch that failed or timed out leaves none behind)."""
    for rank in ranks:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
