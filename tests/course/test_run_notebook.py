"""``zarrtorch.course.lessons.run_notebook``, which ``make course``, the solutions test and the hub rehearsal use to
execute a lesson: a kernel that dies is an error at once, never a wait."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import nbformat

from zarrtorch.course.lessons import run_notebook

DIES = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import nbformat
    from zarrtorch.course.lessons import run_notebook

    cell = "import os, signal\\nos.kill(os.getpid(), signal.SIGKILL)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell), nbformat.v4.new_code_cell("1")])
    try:
        run_notebook(nb, Path(sys.argv[1]) / "dies.ipynb", timeout=600)
    except Exception as exc:
        print(type(exc).__name__)
    """
)


def test_a_kernel_killed_in_a_cell_is_an_error_within_seconds_not_a_hang(tmp_path):
    """A kernel killed while running a cell (as a hub's memory limit kills it) left ``run_notebook`` waiting for
    the cell's output forever, deaf to SIGTERM: nbclient's check that the kernel lives never ran beside a blocking
    kernel client. Run in a process of its own, so that a hang fails this test instead of stopping the suite."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", DIES, str(tmp_path)], capture_output=True, text=True, timeout=90
        )  # the cell's own timeout (600 s) is not what may end it
    except subprocess.TimeoutExpired:
        raise AssertionError("run_notebook still waits, 90 s after its kernel died") from None
    assert done.stdout.split() == ["DeadKernelError"], done.stdout + done.stderr[-2000:]


def test_a_notebook_runs_and_its_outputs_are_kept(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    run_notebook(nb, tmp_path / "ok.ipynb", timeout=120)
    assert nb.cells[0].outputs[0]["text"] == "42\n"
