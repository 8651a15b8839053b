"""Every exercise's solution is right (issue 45): each lesson, run at ``tiny`` with its exercise cells replaced by
their solutions (``notebooks/solutions/NN_exk.py``, which a learner loads with ``%load``), makes every check cell
print ``Exercise k: correct``; and every file in ``notebooks/solutions/`` belongs to an exercise.

A lesson runs only up to its last check cell (the cells after it check nothing of the exercises). The made-up
lesson of ``made_up_lesson.py`` shows that the run passes right solutions and fails a wrong one.
"""

from __future__ import annotations

import os
from pathlib import Path

import made_up_lesson
import nbformat
import pytest
from test_notebook_structure import LESSONS

from zarrtorch.course.lessons import exercise_cells, run_notebook, solution_path, with_solutions

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "notebooks" / "solutions"


def _tagged(nb, tag: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if tag in c.get("metadata", {}).get("tags", [])]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def run_with_solutions(path: Path) -> list[str]:
    """Execute the notebook at ``path`` at ``tiny``, its exercise cells holding their solutions, up to its last
    check cell; return what each check cell printed, in order (a failed check raises, with its message)."""
    nb = nbformat.read(path, as_version=4)
    solved = with_solutions(nb, path)
    checks = _tagged(solved, "check")
    assert checks, f"{path.name} has no check cell"
    solved.cells = solved.cells[: checks[-1] + 1]
    run_notebook(solved, path, timeout=900)
    return [_text(solved.cells[i]) for i in checks]


def orphans(notebooks: Path) -> list[str]:
    """Files in ``notebooks/solutions/`` that are the solution of no exercise cell of a notebook there."""
    owned = set()
    for path in sorted(notebooks.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        owned |= {solution_path(path, k).name for k in range(1, len(exercise_cells(nb)) + 1)}
    return sorted(p.name for p in (notebooks / "solutions").glob("*.py") if p.name not in owned)


@pytest.fixture
def tiny(monkeypatch):
    """The kernel a notebook runs in inherits this process's environment: the tiny size, the data's folder."""
    monkeypatch.setenv("ZARRTORCH_SIZE", "tiny")
    if "ZARRTORCH_DATA_DIR" in os.environ:
        monkeypatch.setenv("ZARRTORCH_DATA_DIR", os.environ["ZARRTORCH_DATA_DIR"])


@pytest.mark.slow
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_check_says_correct_with_the_solutions_loaded(path, tiny):
    printed = run_with_solutions(path)
    for k, text in enumerate(printed, start=1):
        assert f"Exercise {k}: correct" in text.splitlines(), f"{path.name}, exercise {k}'s check printed {text!r}"


def test_every_solution_file_belongs_to_an_exercise():
    assert SOLUTIONS.is_dir(), "notebooks/solutions/ holds the exercises' solutions"
    assert orphans(ROOT / "notebooks") == []


@pytest.mark.slow
def test_the_solutions_run_passes_right_solutions_and_fails_a_wrong_one(tmp_path, tiny):
    """The made-up lesson: its solutions make both checks print 'correct'; a wrong solution stops the run at its
    check, with the check's message; the learner's version prints 'not answered yet'."""
    path = made_up_lesson.write(tmp_path)
    assert run_with_solutions(path) == ["Exercise 1: correct\n", "Exercise 2: correct\n"]
    learner = nbformat.read(path, as_version=4)
    run_notebook(learner, path, timeout=120)
    assert [_text(learner.cells[i]) for i in _tagged(learner, "check")] == [
        made_up_lesson.NOT_ANSWERED.format(k=k) + "\n" for k in (1, 2)
    ]
    (tmp_path / "solutions" / "01_ex1.py").write_text("my_prediction = 3\n")
    with pytest.raises(Exception, match="3 rows"):
        run_with_solutions(path)


def test_an_orphan_solution_is_found(tmp_path):
    made_up_lesson.write(tmp_path)
    assert orphans(tmp_path) == []
    (tmp_path / "solutions" / "01_ex3.py").write_text("x = 1\n")
    (tmp_path / "solutions" / "02_ex1.py").write_text("x = 1\n")
    assert orphans(tmp_path) == ["01_ex3.py", "02_ex1.py"]
