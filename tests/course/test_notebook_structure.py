"""The course notebooks share one kernel and one lesson structure (issue 10): checked on the committed files.

Every numbered notebook uses the kernel that ``scripts/setup.sh`` installs. Lessons 01-06 (and any later or
appendix notebook that has exercises) open with objectives, prerequisites and time, end with key points, and
hold at least two exercises, each a markdown cell starting ``### Exercise``, then a code cell tagged
``exercise`` for the learner's answer, then a worked solution tagged ``solution`` and hidden in JupyterLab;
at least one exercise asks to predict before running.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
APPENDICES = sorted((ROOT / "notebooks").glob("A*.ipynb"))
LESSON_PREFIXES = ("01", "02", "03", "04", "05", "06")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _is_exercise_heading(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and _source(cell).lstrip().startswith("### Exercise")


def installed_kernel_name() -> str:
    """The ``--name`` that scripts/setup.sh gives ``ipykernel install``."""
    text = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    found = re.findall(r"ipykernel install[^\n]*--name[ =]([\w.-]+)", text)
    assert len(found) == 1, f"expected one 'ipykernel install ... --name NAME' in scripts/setup.sh, found {found}"
    return found[0]


def _lesson_like(path: Path) -> bool:
    """Lessons 01-06 always; later or appendix notebooks only when they hold exercises."""
    if path.name[:2] in LESSON_PREFIXES:
        return True
    if path.name[:2] == "00":
        return False
    return any(_is_exercise_heading(c) for c in _load(path)["cells"])


def test_the_course_has_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS][:7] == ["00", *LESSON_PREFIXES]


def test_setup_installs_one_named_kernel():
    assert installed_kernel_name() == "zarrtorch"


@pytest.mark.parametrize("path", NOTEBOOKS + APPENDICES, ids=lambda p: p.name)
def test_kernelspec_is_the_installed_kernel(path):
    spec = _load(path)["metadata"].get("kernelspec", {})
    assert spec.get("name") == installed_kernel_name(), f"{path.name}: kernelspec {spec}"
    assert spec.get("display_name") == "Python (zarrtorch)" and spec.get("language") == "python", spec


LESSONS = [p for p in NOTEBOOKS + APPENDICES if _lesson_like(p)]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_scaffolding(path):
    cells = _load(path)["cells"]
    head = [c for c in cells[:3] if c["cell_type"] == "markdown"]
    assert any(all(word in _source(c) for word in ("**Objectives**", "**Prerequisites**", "**Time**")) for c in head), (
        f"{path.name}: no markdown cell with **Objectives**, **Prerequisites** and **Time** at the top"
    )
    time_cell = next(_source(c) for c in head if "**Time**" in _source(c))
    assert re.search(r"\*\*Time\*\*[^\n]*\d+\s*min", time_cell), f"{path.name}: **Time** gives no minutes"
    last = cells[-1]
    assert last["cell_type"] == "markdown" and _source(last).lstrip().startswith("## Key points"), (
        f"{path.name}: the last cell must be markdown starting '## Key points'"
    )
    assert re.search(r"^\s*[*-] ", _source(last), flags=re.M), f"{path.name}: key points without bullets"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_exercises_have_an_answer_cell_and_a_hidden_solution(path):
    cells = _load(path)["cells"]
    headings = [i for i, c in enumerate(cells) if _is_exercise_heading(c)]
    assert len(headings) >= 2, f"{path.name}: {len(headings)} exercise(s), at least 2 expected"
    for i in headings:
        title = _source(cells[i]).strip().splitlines()[0]
        answer = cells[i + 1] if i + 1 < len(cells) else None
        solution = cells[i + 2] if i + 2 < len(cells) else None
        assert answer is not None and answer["cell_type"] == "code" and "exercise" in _tags(answer), (
            f"{path.name}: {title!r} is not followed by a code cell tagged 'exercise'"
        )
        assert "solution" not in _tags(answer)
        assert solution is not None and solution["cell_type"] == "code" and "solution" in _tags(solution), (
            f"{path.name}: {title!r}: the cell after the answer cell is not a code cell tagged 'solution'"
        )
        assert solution["metadata"].get("jupyter", {}).get("source_hidden") is True, (
            f"{path.name}: {title!r}: the solution is not hidden (metadata jupyter.source_hidden)"
        )
        assert solution["metadata"].get("jupyter", {}).get("outputs_hidden") is True, (
            f"{path.name}: {title!r}: the solution's printed answer shows under its collapsed code "
            "(metadata jupyter.outputs_hidden)"
        )
        for cell in (answer, solution):  # nbval runs both: they must have run when the notebook was saved
            assert cell.get("execution_count") is not None, f"{path.name}: {title!r}: a cell was not executed"
            assert not any(o.get("output_type") == "error" for o in cell.get("outputs", [])), title
    titles = [_source(cells[i]).strip().splitlines()[0] for i in headings]
    assert any("predict, then run" in t.lower() for t in titles), f"{path.name}: no 'Predict, then run' in {titles}"


def test_structure_check_notices_a_visible_solution(tmp_path):
    """The check above is not vacuous: a notebook whose solution is visible fails it."""

    def exercise(n, hidden):
        return [
            {"cell_type": "markdown", "metadata": {}, "source": f"### Exercise {n} — Predict, then run: x"},
            {
                "cell_type": "code",
                "metadata": {"tags": ["exercise"]},
                "source": "",
                "execution_count": 1,
                "outputs": [],
            },
            {
                "cell_type": "code",
                "metadata": {"tags": ["solution"], "jupyter": {"source_hidden": hidden, "outputs_hidden": hidden}},
                "source": "",
                "execution_count": 2,
                "outputs": [],
            },
        ]

    path = tmp_path / "01_fake.ipynb"
    path.write_text(json.dumps({"cells": exercise(1, True) + exercise(2, True), "metadata": {}}))
    test_exercises_have_an_answer_cell_and_a_hidden_solution(path)  # passes as built
    nb = {"cells": exercise(1, True) + exercise(2, False), "metadata": {}}
    path.write_text(json.dumps(nb))
    with pytest.raises(AssertionError, match="not hidden"):
        test_exercises_have_an_answer_cell_and_a_hidden_solution(path)


MACHINE_PATH = re.compile(r"(?<![\w$}])/(?:tmp|home|root|work|Users|private|var/folders)/[^\s'\"]+")


def _output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        parts.append("".join(out.get("data", {}).get("text/plain", "")))
        parts.append("\n".join(out.get("traceback", [])))
    return "\n".join(parts)


@pytest.mark.parametrize("path", NOTEBOOKS + APPENDICES, ids=lambda p: p.name)
def test_committed_outputs_name_no_machine_path(path):
    """An absolute path of the machine that ran the notebook (a temporary folder, a home) means nothing to a
    learner, and nbval only passes it because sanitize.cfg rewrites such paths."""
    found = [
        (i, m.group(0)) for i, c in enumerate(_load(path)["cells"]) for m in MACHINE_PATH.finditer(_output_text(c))
    ]
    assert not found, f"{path.name}: machine paths in outputs (cell, path): {found[:5]}"
