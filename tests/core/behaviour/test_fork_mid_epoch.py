"""The training process forks in the middle of an epoch (a user's own ``os.fork()``, a library that forks to run a
job beside training) and the child goes on with the parent's iterator. The child waited forever with 0 workers: the
work-ahead thread it waited for does not exist in it. With DataLoader workers it took batches from the parent's
workers' queues, and the parent's epoch sometimes ended short, silently (54 of 61 rows, no error; 1 trial of 6).
The iterator now belongs to the process that made it: in another one it refuses at once, naming both. And an
epoch that ends before its planned batches is an error, whatever took them."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import zarrtorch.epoch
from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr

ROWS, BATCH = 61, 7


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("fork") / "s.zarr"
    prepare_zarr({"x": np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)}, path, chunk_rows=2, progress=False)
    return path


def next_in_a_fork(iterator) -> str:
    """What ``next(iterator)`` does in a child forked now: the text of the error it raised, or what it returned
    (nothing: it was still waiting after 30 s)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only this, then out, whatever happens
        try:
            os.close(read)
            signal.alarm(30)  # a child left waiting is killed: it says nothing, and the test fails
            try:
                got = next(iterator)
                said = f"returned {type(got).__name__}"
            except BaseException as exc:  # noqa: BLE001 (reported to the parent)
                said = f"{type(exc).__name__}: {exc}"
            os.write(write, said.encode()[:60000])
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fork_that_goes_on_with_its_parents_epoch_is_refused_and_the_parent_reads_every_row_once(store, workers):
    ds = ZarrIterableDataset(store, seed=3, return_index=True)
    extra = dict(multiprocessing_context="fork") if workers else {}
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=workers, **extra)
    iterator = iter(loader)
    seen = [next(iterator)["index"] for _ in range(3)]
    said = next_in_a_fork(iterator)
    assert said.startswith("RuntimeError: this iterator of a ZarrDataLoader was made in process"), said
    assert f"process {os.getpid()}" in said and "a fork of it" in said and "iter(loader)" in said, said
    for batch in iterator:
        seen.append(batch["index"])
        np.testing.assert_array_equal(batch["x"].numpy()[:, 0], batch["index"].numpy() * 4)
    assert sorted(np.concatenate(seen).tolist()) == list(range(ROWS))


def test_an_epoch_that_ends_before_its_planned_batches_is_an_error_not_a_short_epoch(store, monkeypatch):
    """Batches lost on the way (here: the epoch's generator made to drop its last one): the end of the iteration
    says how many of the planned batches never arrived, and the epoch is not counted as done."""
    run_epoch = zarrtorch.epoch.run_epoch

    def all_but_the_last(*args, **kwargs):
        batches = list(run_epoch(*args, **kwargs))
        yield from batches[:-1]

    monkeypatch.setattr(zarrtorch.epoch, "run_epoch", all_but_the_last)
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=3, return_index=True), batch_size=BATCH)
    got = 0
    with pytest.raises(RuntimeError, match=rf"ended after {len(loader) - 1} of the {len(loader)} batches it planned"):
        for _ in loader:
            got += 1
    assert got == len(loader) - 1
    monkeypatch.undo()
    again = [batch["index"] for batch in loader]  # iter() again: the epoch, whole
    assert sorted(np.concatenate(again).tolist()) == list(range(ROWS))


CTRL_C_AT_FORK = """
import os, signal, sys
from zarrtorch import ZarrDataLoader, ZarrIterableDataset

# a Ctrl-C that lands while a worker is forked: the parent's first bytecodes after fork() are its at-fork hooks
os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
loader = ZarrDataLoader(ZarrIterableDataset(sys.argv[1]), batch_size=7, num_workers=2, multiprocessing_context="fork")
try:
    batches = sum(1 for _ in loader)
    print("the epoch ran:", batches, "batches", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_ctrl_c_that_lands_while_the_workers_are_forked_interrupts_instead_of_being_dropped(store, tmp_path):
    """A user's Ctrl-C hit at the start of an epoch did nothing in 5 of 24 trials (2 workers, a signal at a random
    time): it arrived while DataLoader forked a worker, Python ran its handler inside the fork's hooks (logging's
    ``_releaseLock``), and printed the KeyboardInterrupt as "Exception ignored". It is now raised by ``iter()`` once
    the workers are started."""
    import subprocess
    import sys

    script = tmp_path / "ctrl_c_at_fork.py"
    script.write_text(CTRL_C_AT_FORK)
    done = subprocess.run([sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "interrupted", done.stdout + done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
