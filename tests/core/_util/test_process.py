"""The ranks' agreement check (zarrtorch/_util/process.py) and the process group it runs in."""

from __future__ import annotations

import gc
import os
import time
import weakref

import pytest
import torch.distributed as dist

from zarrtorch._util.process import _check_group, check_ranks_agree


def test_the_check_group_dies_with_the_process_group_it_was_made_for_not_at_interpreter_exit(tmp_path):
    """A gloo rank of test_mix's two-rank run ended with SIGABRT ("terminate called without an active exception")
    after its script had called destroy_process_group, once in three CI runs. The suspect: the gloo group the ranks'
    check runs in, kept alive by zarrtorch's cache until the interpreter tore itself down (torch's own issues show
    gloo groups destroyed then aborting the process). The cache must not outlive torch's own reference: once the
    default group is destroyed, the check group is freed at once, and a new default group gets a new check group."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'first'}", rank=0, world_size=1)
    try:
        check_ranks_agree("plan", "epoch 0")
        first = weakref.ref(_check_group(60.0))
    finally:
        dist.destroy_process_group()
    gc.collect()
    assert first() is None, "zarrtorch keeps the check group of a destroyed process group alive"

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'second'}", rank=0, world_size=1)
    try:
        second = _check_group(60.0)
        assert second is _check_group(60.0), "the check group is made once per process group, not per check"
        check_ranks_agree("plan", "epoch 1")
    finally:
        dist.destroy_process_group()


def test_a_ctrl_c_held_while_workers_are_forked_is_raised_once_they_are():
    """A SIGINT that arrives inside the block is not raised there (where fork's hooks would drop it) but at its end;
    the program's own handler is back in place afterwards."""
    import signal

    from zarrtorch._util.process import ctrl_c_held

    before = signal.getsignal(signal.SIGINT)
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_held():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):  # the handler runs at one of these bytecodes: here it only notes the signal
                time.sleep(0.001)
            reached_the_end = True
    assert reached_the_end and signal.getsignal(signal.SIGINT) is before
