"""The course's lessons as one list: the day's schedule, the optional block after it, and what each lesson costs.

One source of truth for the README's schedule, lesson 00's and the deck's ("The day" slide), which
``tests/course/test_schedule.py`` compares with :data:`DAY`; for ``make course``'s table of words and run time per
lesson (:func:`markdown_words`, :func:`run_notebook`); and for the solutions of the exercises, which live in
``notebooks/solutions/`` (not beside their questions on the repository's web page) and which
CI's nbval run executes in their notebooks (:mod:`zarrtorch.course.nbval_solutions`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Block:
    """One block of the day: ``start``-``end`` (HH:MM), what it is, and its notebook's number ("" for a break)."""

    start: str
    end: str
    what: str
    notebook: str = ""

    @property
    def minutes(self) -> int:
        return _minutes(self.end) - _minutes(self.start)


def _minutes(hhmm: str) -> int:
    hours, mins = hhmm.split(":")
    return 60 * int(hours) + int(mins)


DAY: tuple[Block, ...] = (
    Block("09:00", "09:20", "welcome, set-up check, why data loading is the bottleneck", "00"),
    Block("09:20", "10:20", "preparing first-axis chunks", "01"),
    Block("10:20", "10:35", "break"),
    Block("10:35", "11:35", "partitioning: ranks x workers, equal batches", "02"),
    Block("11:35", "12:20", "shuffling: chunk order + a bounded buffer", "03"),
    Block("12:20", "13:15", "lunch"),
    Block("13:15", "14:15", "streaming with a DataLoader", "04"),
    Block("14:15", "15:00", "training with Lightning on one device", "05"),
    Block("15:00", "15:15", "break"),
    Block("15:15", "16:15", "DDP: in a notebook, with torchrun, on Slurm", "06"),
    Block("16:15", "17:00", "reading from object storage", "07"),
    Block("17:00", "17:30", "wrap-up, questions, what to read next"),
)

# After the day (self-study, or a second morning): lessons that build on the day but are not on its path.
AFTER_THE_DAY: tuple[tuple[str, str, int], ...] = (
    ("08", "your own data: from yearly NetCDF files to windows", 45),
    ("A1", "appendix: coming from zarr-torch-dataset", 20),
)

MOST_WORDS = 1800  # markdown words a lesson on the path may hold: about 12 minutes of reading at 150 a minute
CODE_SHARE = 1 / 3  # of a lesson's block its code may take at the default size; the exercises take the rest

_WORD = re.compile(r"[A-Za-z0-9][\w'\-.]*")


def path_notebooks(root: Path) -> list[Path]:
    """The day's notebooks, in the order of the day."""
    numbers = [b.notebook for b in DAY if b.notebook]
    return [_one(root, n) for n in numbers]


def optional_notebooks(root: Path) -> list[Path]:
    return [_one(root, n) for n, _, _ in AFTER_THE_DAY]


def _one(root: Path, number: str) -> Path:
    found = sorted((Path(root) / "notebooks").glob(f"{number}_*.ipynb"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one notebook numbered {number} in {root}/notebooks, found {found}")
    return found[0]


def slot_minutes(number: str) -> int:
    """Minutes of the block (or the optional block) of notebook ``number``."""
    for block in DAY:
        if block.notebook == number:
            return block.minutes
    for n, _, minutes in AFTER_THE_DAY:
        if n == number:
            return minutes
    raise KeyError(f"notebook {number} is in neither the day nor the block after it")


def markdown_words(nb) -> int:
    """Words in the notebook's markdown cells (code, and numbers inside code spans, count as they read)."""
    return sum(len(_WORD.findall(_source(c))) for c in nb.cells if c.cell_type == "markdown")


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


# -- exercises and their solutions -------------------------------------------------------------------------
def exercise_cells(nb) -> list[int]:
    """Indices of the cells tagged ``exercise`` (the learner's answers), in order: exercise ``k`` is the k-th."""
    return [i for i, c in enumerate(nb.cells) if "exercise" in c.get("metadata", {}).get("tags", [])]


def solution_path(notebook: Path, k: int) -> Path:
    """Where exercise ``k`` (from 1) of ``notebook`` keeps its solution."""
    return Path(notebook).parent / "solutions" / f"{Path(notebook).name[:2]}_ex{k}.py"


# -- running a notebook ------------------------------------------------------------------------------------
def run_notebook(nb, notebook: Path, *, timeout: int = 3600) -> float:
    """Execute ``nb`` (read from ``notebook``) in place, in its own folder, with the course's kernel; returns the
    seconds its cells took. The kernel talks over local sockets (IPC), not TCP: a TCP kernel prints a warning
    about unencrypted traffic once per notebook, a newcomer's first screen of ``make course``."""
    import shutil
    import tempfile

    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    # An asynchronous manager: with a blocking one, nbclient waits for a cell's output in a call that never
    # returns when the kernel dies (killed for memory), and its check that the kernel is alive never runs.
    sockets = Path(tempfile.mkdtemp(prefix="zarrtorch-kernel-"))
    km = AsyncKernelManager(kernel_name="zarrtorch", transport="ipc", ip=str(sockets / "kernel"))
    client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(Path(notebook).parent)}})
    start = time.perf_counter()
    try:
        client.execute()
        return time.perf_counter() - start
    finally:
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=False)
        shutil.rmtree(sockets, ignore_errors=True)
