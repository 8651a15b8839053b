"""The course notebooks share one kernel and one lesson structure (issues 10 and 45): checked on the committed files.

Every notebook uses the kernel that ``scripts/setup.sh`` installs. Every lesson, the day's (01-07) and those
after it (08, A1), opens with objectives, prerequisites and time, ends with key points, and holds at least two
exercises in four cells each (``made_up_lesson.py`` shows them on a made-up lesson):

1. a markdown cell ``### Exercise k — <title>``; at least one title per lesson says "Predict, then run";
2. a code cell tagged ``exercise``: the learner's placeholder (``...`` or ``None``), first line a comment;
3. a code cell tagged ``check``, whose committed output is ``Exercise k: not answered yet (...)``: the
   committed notebook is the learner's version;
4. a code cell tagged ``solution`` holding exactly ``# %load solutions/NN_exk.py``, and that file, so that the
   repository's web page never shows a solution beside its question. No other cell carries these tags.

Every notebook on the day's path (00-07) holds at most ``zarrtorch.course.lessons.MOST_WORDS`` words of
markdown. The checks are functions returning what is wrong; a made-up lesson shows that they pass one that
keeps the rules and catch each rule broken.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import made_up_lesson
import nbformat
import pytest

from zarrtorch.course.lessons import MOST_WORDS, markdown_words, optional_notebooks, path_notebooks, solution_path

ROOT = Path(__file__).resolve().parents[2]
ALL = sorted((ROOT / "notebooks").glob("*.ipynb"))
PATH = path_notebooks(ROOT)  # 00-07, the day's
LESSONS = [p for p in PATH if not p.name.startswith("00")] + optional_notebooks(ROOT)  # 01-07, 08, A1
EXERCISE_TITLE = re.compile(r"^### Exercise (\d+) — \S")
ROLES = ("exercise", "check", "solution")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _is_exercise_heading(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and _source(cell).lstrip().startswith("### Exercise")


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        parts.append("".join(out.get("data", {}).get("text/plain", "")))
        parts.append("\n".join(out.get("traceback", [])))
    return "\n".join(parts)


def installed_kernel_name() -> str:
    """The ``--name`` that scripts/setup.sh gives ``ipykernel install``."""
    text = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    found = re.findall(r"ipykernel install[^\n]*--name[ =]([\w.-]+)", text)
    assert len(found) == 1, f"expected one 'ipykernel install ... --name NAME' in scripts/setup.sh, found {found}"
    return found[0]


# -- the checks: each returns what is wrong with the notebook at ``path`` ------------------------------------
def scaffolding_problems(path: Path) -> list[str]:
    cells, problems = _load(path)["cells"], []
    head = [_source(c) for c in cells[:3] if c["cell_type"] == "markdown"]
    top = [s for s in head if all(w in s for w in ("**Objectives**", "**Prerequisites**", "**Time**"))]
    if not top:
        problems.append("no markdown cell with **Objectives**, **Prerequisites** and **Time** at the top")
    elif not re.search(r"\*\*Time\*\*[^\n]*\d+\s*min", top[0]):
        problems.append("**Time** gives no minutes")
    last = cells[-1]
    if not (last["cell_type"] == "markdown" and _source(last).lstrip().startswith("## Key points")):
        problems.append("the last cell must be markdown starting '## Key points'")
    elif not re.search(r"^\s*[*-] ", _source(last), flags=re.M):
        problems.append("key points without bullets")
    return problems


def exercise_problems(path: Path) -> list[str]:
    """What breaks the four-cell structure of the exercises (see the module's docstring)."""
    cells, problems, grouped = _load(path)["cells"], [], set()
    headings = [i for i, c in enumerate(cells) if _is_exercise_heading(c)]
    titles = [_source(cells[i]).strip().splitlines()[0] for i in headings]
    if len(headings) < 2:
        problems.append(f"{len(headings)} exercise(s), at least 2 expected")
    if not any("predict, then run" in t.lower() for t in titles):
        problems.append(f"no exercise titled 'Predict, then run' in {titles}")
    for k, (i, title) in enumerate(zip(headings, titles, strict=True), start=1):
        m = EXERCISE_TITLE.match(title)
        if not m or int(m.group(1)) != k:
            problems.append(f"{title!r}: expected '### Exercise {k} — <title>'")
        group = cells[i + 1 : i + 4]
        found = [(c["cell_type"], sorted(set(_tags(c)) & set(ROLES))) for c in group]
        if found != [("code", [role]) for role in ROLES]:
            problems.append(f"exercise {k}: not followed by code cells tagged exercise, check, solution: {found}")
            continue
        grouped.update(range(i + 1, i + 4))
        problems += _group_problems(path, k, *group)
    for j, cell in enumerate(cells):
        roles = sorted(set(_tags(cell)) & set(ROLES))
        if roles and j not in grouped:
            problems.append(f"cell {j} is tagged {roles} outside an exercise's four cells")
    return problems


def _group_problems(path: Path, k: int, answer: dict, check: dict, solution: dict) -> list[str]:
    problems = []
    placeholder = _source(answer)
    if not placeholder.lstrip().startswith("#"):
        problems.append(f"exercise {k}: the exercise cell's first line is not a comment saying what to write")
    if "..." not in placeholder and "None" not in placeholder:
        problems.append(f"exercise {k}: the exercise cell holds no placeholder (`...` or None)")
    for role, cell in (("exercise", answer), ("check", check)):  # nbval runs both: they ran when committed
        if cell.get("execution_count") is None:
            problems.append(f"exercise {k}: the {role} cell was not executed")
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            problems.append(f"exercise {k}: the {role} cell's committed output is an error")
    expected = made_up_lesson.NOT_ANSWERED.format(k=k)
    if expected not in _output_text(check).splitlines():
        problems.append(
            f"exercise {k}: the check cell's committed output is not {expected!r} (commit the learner's "
            f"version, the placeholder): {_output_text(check)[:200]!r}"
        )
    load = f"# %load solutions/{path.name[:2]}_ex{k}.py"
    if _source(solution).strip() != load:
        problems.append(f"exercise {k}: the solution cell must hold only {load!r}, not {_source(solution)[:200]!r}")
    if solution.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
        problems.append(f"exercise {k}: the solution cell is hidden: its one line tells the learner what to do")
    file = solution_path(path, k)
    if not file.exists():
        problems.append(f"exercise {k}: no solution file {file.parent.name}/{file.name}")
    elif file.read_text(encoding="utf-8").strip() == placeholder.strip():
        problems.append(f"exercise {k}: the solution file is the placeholder")
    return problems


# -- the course's notebooks ----------------------------------------------------------------------------------
def test_the_course_has_its_lessons():
    assert [p.name[:2] for p in PATH] == ["00", "01", "02", "03", "04", "05", "06", "07"]
    assert [p.name[:2] for p in LESSONS] == ["01", "02", "03", "04", "05", "06", "07", "08", "A1"]


def test_setup_installs_one_named_kernel():
    assert installed_kernel_name() == "zarrtorch"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_kernelspec_is_the_installed_kernel(path):
    spec = _load(path)["metadata"].get("kernelspec", {})
    assert spec.get("name") == installed_kernel_name(), f"{path.name}: kernelspec {spec}"
    assert spec.get("display_name") == "Python (zarrtorch)" and spec.get("language") == "python", spec


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_scaffolding(path):
    problems = scaffolding_problems(path)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_exercises_in_four_cells_with_the_solution_in_a_file(path):
    problems = exercise_problems(path)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", PATH, ids=lambda p: p.name)
def test_a_lesson_on_the_path_holds_at_most_most_words_of_markdown(path):
    words = markdown_words(nbformat.read(path, as_version=4))
    assert words <= MOST_WORDS, f"{path.name}: {words} words of markdown, at most {MOST_WORDS} on the day's path"


# -- the checks are not vacuous: a made-up lesson passes, and each broken rule is caught ---------------------
def _broken(tmp_path: Path, name: str, change) -> list[str]:
    cells = made_up_lesson.cells()
    change(cells)
    return exercise_problems(made_up_lesson.write(tmp_path / name, cells))


def _set(index: int, **fields):
    def change(cells):
        cells[index].update(copy.deepcopy(fields))

    return change


def test_the_structure_checks_pass_a_made_up_lesson_and_catch_each_broken_rule(tmp_path):
    good = made_up_lesson.write(tmp_path / "good")
    assert scaffolding_problems(good) == [] and exercise_problems(good) == []
    # cells of the made-up lesson: 0 title, 1 code, 2-5 exercise 1 (heading, exercise, check, solution), 6-9 exercise 2
    solution_and_code = {"source": "# %load solutions/01_ex1.py\nmy_prediction = 4\n"}
    cases = {
        "must hold only '# %load solutions/01_ex1.py'": _set(5, **solution_and_code),
        "committed output is not 'Exercise 1: not answered yet": _set(
            4, outputs=[{"output_type": "stream", "name": "stdout", "text": "Exercise 1: correct\n"}]
        ),
        "no exercise titled 'Predict, then run'": _set(2, source="### Exercise 1 — how many rows"),
        "expected '### Exercise 2 — <title>'": _set(6, source="### Exercise 3 — double every row"),
        "not followed by code cells tagged exercise, check, solution": lambda c: c.pop(4),
        "1 exercise(s), at least 2 expected": lambda c: [c.pop(6) for _ in range(4)],
        "tagged ['solution'] outside an exercise's four cells": lambda c: c.insert(1, c[5]),
        "holds no placeholder": _set(3, source="# write it\nmy_prediction = 4\n"),
        "the solution cell is hidden": _set(5, metadata={"tags": ["solution"], "jupyter": {"source_hidden": True}}),
        "the check cell was not executed": _set(4, execution_count=None),
    }
    for i, (message, change) in enumerate(cases.items()):
        problems = _broken(tmp_path, f"case{i}", change)
        assert any(message in p for p in problems), (message, problems)
    (tmp_path / "good" / "solutions" / "01_ex2.py").unlink()
    assert exercise_problems(good) == ["exercise 2: no solution file solutions/01_ex2.py"]
    cells = made_up_lesson.cells()
    cells[-1] = {"cell_type": "markdown", "metadata": {}, "source": "## Summary\n\n* x"}
    assert scaffolding_problems(made_up_lesson.write(tmp_path / "no_key_points", cells)) == [
        "the last cell must be markdown starting '## Key points'"
    ]


def test_the_words_check_counts_the_markdown_only(tmp_path):
    cells = made_up_lesson.cells()
    nb = nbformat.read(made_up_lesson.write(tmp_path / "w", cells), as_version=4)
    before = markdown_words(nb)
    nb.cells.append(nbformat.v4.new_markdown_cell(" ".join(["word"] * (MOST_WORDS + 1))))
    nb.cells.append(nbformat.v4.new_code_cell(" ".join(["x"] * 5000)))
    assert markdown_words(nb) == before + MOST_WORDS + 1 > MOST_WORDS


MACHINE_PATH = re.compile(r"(?<![\w$}])/(?:tmp|home|root|work|Users|private|var/folders)/[^\s'\"]+")


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_committed_outputs_name_no_machine_path(path):
    """An absolute path of the machine that ran the notebook (a temporary folder, a home) means nothing to a
    learner, and nbval only passes it because sanitize.cfg rewrites such paths."""
    found = [
        (i, m.group(0)) for i, c in enumerate(_load(path)["cells"]) for m in MACHINE_PATH.finditer(_output_text(c))
    ]
    assert not found, f"{path.name}: machine paths in outputs (cell, path): {found[:5]}"
