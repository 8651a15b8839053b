"""A made-up lesson in the course's exercise structure, small enough to run in a second: the tests of that
structure (``test_notebook_structure.py``, ``test_solutions.py``) show on it that they pass on a lesson that
follows the rules and fail on one that breaks them, whatever state the course's own lessons are in.

The structure, for exercise ``k`` of notebook ``NN``: a markdown cell ``### Exercise k — <title>``; a code cell
tagged ``exercise`` (the learner's placeholder, first line a comment); a code cell tagged ``check`` that prints
``Exercise k: not answered yet (...)`` for the placeholder, else asserts the answer and prints ``Exercise k:
correct``; a code cell tagged ``solution`` holding only ``# %load solutions/NN_exk.py``; and that file.
"""

from __future__ import annotations

import json
from pathlib import Path

NOT_ANSWERED = "Exercise {k}: not answered yet (write your answer above, or load the solution below)"
CORRECT = "Exercise {k}: correct"


def _code(source: str, tags: list[str] | None = None, output: str | None = None) -> dict:
    cell = {"cell_type": "code", "metadata": {}, "source": source, "execution_count": 1, "outputs": []}
    if tags:
        cell["metadata"]["tags"] = tags
    if output is not None:
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": output}]
    return cell


def _markdown(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


# (title, the learner's placeholder, the check, the solution)
EXERCISES = [
    (
        "Predict, then run: how many rows",
        "# write your prediction: how many rows the list holds\nmy_prediction = ...\n",
        "if my_prediction is ... or my_prediction is None:\n"
        "    print({not_answered!r})\n"
        "else:\n"
        "    assert my_prediction == len(rows), f'{{my_prediction}} rows? count them: len(rows)'\n"
        "    print({correct!r})\n",
        "my_prediction = 4\n",
    ),
    (
        "double every row",
        "# write double(rows): a list with every row times 2\ndef double(rows):\n    ...\n",
        "if double(rows) is None:\n"
        "    print({not_answered!r})\n"
        "else:\n"
        "    assert double(rows) == [2, 4, 6, 8], f'double(rows) gave {{double(rows)}}'\n"
        "    print({correct!r})\n",
        "def double(rows):\n    return [2 * r for r in rows]\n",
    ),
]


def cells(prefix: str = "01") -> list[dict]:
    """The made-up lesson's cells, with the outputs of the learner's version (every check: not answered yet)."""
    out = [
        _markdown(
            "# 01 — A made-up lesson\n\n**Objectives**: count.\n\n**Prerequisites**: none.\n\n"
            "**Time**: about 5 minutes."
        ),
        _code("rows = [1, 2, 3, 4]\n"),
    ]
    for k, (title, placeholder, check, _) in enumerate(EXERCISES, start=1):
        not_answered, correct = NOT_ANSWERED.format(k=k), CORRECT.format(k=k)
        out += [
            _markdown(f"### Exercise {k} — {title}\n\nWrite it in the cell below, then run the check."),
            _code(placeholder, ["exercise"]),
            _code(check.format(not_answered=not_answered, correct=correct), ["check"], not_answered + "\n"),
            _code(f"# %load solutions/{prefix}_ex{k}.py", ["solution"]),
        ]
    out.append(_markdown("## Key points\n\n* rows can be counted."))
    return out


def write(folder: Path, nb_cells: list[dict] | None = None, prefix: str = "01", solutions: bool = True) -> Path:
    """Write the lesson (``nb_cells``, default :func:`cells`) as ``folder/NN_made_up.ipynb``, with its solution
    files in ``folder/solutions/``; return the notebook's path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}_made_up.ipynb"
    metadata = {"kernelspec": {"name": "zarrtorch", "display_name": "Python (zarrtorch)", "language": "python"}}
    nb = {"cells": nb_cells if nb_cells is not None else cells(prefix), "metadata": metadata}
    nb.update(nbformat=4, nbformat_minor=5)
    for i, cell in enumerate(nb["cells"]):
        cell.setdefault("id", f"cell-{i}")
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    if solutions:
        (folder / "solutions").mkdir(exist_ok=True)
        for k, (*_, solution) in enumerate(EXERCISES, start=1):
            (folder / "solutions" / f"{prefix}_ex{k}.py").write_text(solution, encoding="utf-8")
    return path
