"""Every exercise's solution is right (issue 45). CI's nbval run of each lesson at ``tiny`` runs, right after the
k-th check cell, the solution ``notebooks/solutions/NN_exk.py`` (which a learner loads with ``%load``) and the
check again, which must print ``Exercise k: correct`` (``zarrtorch/course/nbval_solutions.py``, the hook of
``notebooks/conftest.py``). Here: that the hook gives every lesson's every exercise those two items; that it
passes right solutions and fails a wrong or missing one (a made-up lesson, ``made_up_lesson.py``, run by nbval
in a subprocess); and that every file in ``notebooks/solutions/`` belongs to an exercise.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import made_up_lesson
import nbformat
import pytest
from test_notebook_structure import LESSONS

from zarrtorch.course.lessons import exercise_cells, solution_path

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "notebooks" / "solutions"


def nbval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """pytest with nbval at ``tiny`` in a fresh process (its kernel inherits the size and the data's folder)."""
    env = os.environ | {"ZARRTORCH_SIZE": "tiny"}
    command = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "no:randomly", "-q", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def orphans(notebooks: Path) -> list[str]:
    """Files in ``notebooks/solutions/`` that are the solution of no exercise cell of a notebook there."""
    owned = set()
    for path in sorted(notebooks.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        owned |= {solution_path(path, k).name for k in range(1, len(exercise_cells(nb)) + 1)}
    return sorted(p.name for p in (notebooks / "solutions").glob("*.py") if p.name not in owned)


def test_the_nbval_run_checks_every_exercise_of_every_lesson_with_its_solution():
    """Collected as CI collects them: after each lesson's k-th check cell, its solution then the check again."""
    done = nbval("--collect-only", *(str(p.relative_to(ROOT)) for p in LESSONS), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for path in LESSONS:
        n = len(exercise_cells(nbformat.read(path, as_version=4)))
        items = re.findall(rf"^notebooks/{re.escape(path.name)}::(Cell \d+.*)$", done.stdout, re.M)
        solved = [item for item in items if re.fullmatch(r"Cell \d+ (solution|solved) \d+", item)]
        expected = [f"{what} {k}" for k in range(1, n + 1) for what in ("solution", "solved")]
        assert [item.split(" ", 2)[2] for item in solved] == expected, f"{path.name}: {solved}"


def test_every_solution_file_belongs_to_an_exercise():
    assert SOLUTIONS.is_dir(), "notebooks/solutions/ holds the exercises' solutions"
    assert orphans(ROOT / "notebooks") == []


@pytest.mark.slow
def test_right_solutions_pass_and_a_wrong_or_missing_one_fails(tmp_path):
    """The made-up lesson under nbval with the hook, three copies in one run (one pytest start, not three): the
    learner's version with right solutions (every check 'not answered yet') compares equal and both solutions say
    correct; with a wrong solution it fails at its check with the check's message; with a missing one it fails
    naming the file to write."""
    for copy in ("right", "wrong", "missing"):
        made_up_lesson.write(tmp_path / copy)
    (tmp_path / "wrong" / "solutions" / "01_ex1.py").write_text("my_prediction = 3\n")
    (tmp_path / "missing" / "solutions" / "01_ex1.py").unlink()
    paths = [f"{copy}/01_made_up.ipynb" for copy in ("right", "wrong", "missing")]
    done = nbval("-p", "zarrtorch.course.nbval_solutions", "-rA", *paths, cwd=tmp_path)
    assert done.returncode != 0, done.stdout[-3000:]
    outcomes = re.findall(r"^(PASSED|FAILED) (\w+)/01_made_up\.ipynb::(Cell \d+(?: \w+ \d+)?)", done.stdout, re.M)
    # the failures' sections, by copy (a copy may have several)
    sections = re.findall(r"^_{3,} (\w+)/01_made_up\.ipynb::.*?\n(.*?)(?=^_{3,} |^={3,} )", done.stdout, re.M | re.S)
    failures = {copy: "".join(text for folder, text in sections if folder == copy) for copy, _ in sections}

    def items(copy: str, outcome: str) -> list[str]:
        return [item for got, folder, item in outcomes if folder == copy and got == outcome]

    code_cells = sum(c["cell_type"] == "code" for c in made_up_lesson.cells())
    assert len(items("right", "PASSED")) == code_cells + 2 * len(made_up_lesson.EXERCISES), done.stdout[-3000:]
    assert items("right", "FAILED") == [] and "right" not in failures
    assert [re.sub(r"\d+", "N", item) for item in items("wrong", "FAILED")] == ["Cell N solved N"], outcomes
    assert items("wrong", "FAILED")[0].endswith("solved 1") and "3 rows? count them" in failures["wrong"]
    assert [item.split(" ", 2)[2] for item in items("missing", "FAILED")] == ["solution 1", "solved 1"], outcomes
    assert "exercise 1 has no solution: write 01_ex1.py" in failures["missing"], done.stdout[-3000:]


def test_an_orphan_solution_is_found(tmp_path):
    made_up_lesson.write(tmp_path)
    assert orphans(tmp_path) == []
    (tmp_path / "solutions" / "01_ex3.py").write_text("x = 1\n")
    (tmp_path / "solutions" / "02_ex1.py").write_text("x = 1\n")
    assert orphans(tmp_path) == ["01_ex3.py", "02_ex1.py"]
