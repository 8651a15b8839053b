"""A pytest plugin for nbval: every exercise's solution runs in the lesson's own kernel, right after its check.

For the k-th cell tagged ``check`` of a notebook, two cells are run after it, where a learner would load the
solution (``# %load solutions/NN_exk.py``) and run the check again:

1. the solution file (:func:`zarrtorch.course.lessons.solution_path`), its output not compared;
2. the check cell again, which must print the line ``Exercise k: correct`` (a wrong solution fails its
   assertion, with the check's message; a check that still says "not answered yet" fails here).

The solutions are thus tested in the state the lesson is in at that point, in the same run that compares the
lesson's outputs; the cells after the exercise run with the solution loaded, as a learner's would.
``notebooks/conftest.py`` takes the hook from here; ``pytest -p zarrtorch.course.nbval_solutions`` gives it to
any notebook (tests/course/test_solutions.py runs a made-up lesson that way).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from zarrtorch.course.lessons import solution_path

CORRECT = "Exercise {k}: correct\n"


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _solution_source(notebook: Path, k: int) -> str:
    path = solution_path(notebook, k)
    if not path.is_file():
        return f"raise FileNotFoundError({f'exercise {k} has no solution: write {path.name} in solutions/'!r})\n"
    return path.read_text(encoding="utf-8")


def checked_source(check_source: str, k: int) -> str:
    """Code that runs ``check_source`` in the notebook's namespace and fails unless it printed the line
    ``Exercise k: correct`` (what it printed is printed again)."""
    expected = CORRECT.format(k=k).strip()
    return (
        "from IPython.utils.capture import capture_output as _capture\n"
        "with _capture() as _printed:\n"
        f"    exec(compile({check_source!r}, 'check of exercise {k}', 'exec'), globals())\n"
        "print(_printed.stdout, end='')\n"
        f"assert {expected!r} in _printed.stdout.splitlines(), "
        f"'the check of exercise {k} did not say correct with its solution loaded: ' + repr(_printed.stdout)\n"
    )


def solved_items(check_item, k: int) -> list:
    """The two items run after ``check_item``, the k-th check cell of its notebook: its solution, then the check."""
    import nbformat
    from nbval.plugin import IPyNbCell

    parent = check_item.parent
    cells = {
        "solution": nbformat.v4.new_code_cell(_solution_source(Path(str(parent.fspath)), k)),
        "solved": nbformat.v4.new_code_cell(checked_source(check_item.cell.source, k)),
    }
    return [
        IPyNbCell.from_parent(
            parent,
            name=f"{check_item.name} {what} {k}",
            cell_num=check_item.cell_num,
            cell=cell,
            options=defaultdict(bool, check=False),  # what they print is not compared; their errors fail
        )
        for what, cell in cells.items()
    ]


def pytest_collection_modifyitems(session, config, items) -> None:
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval not installed: no notebook is collected either
        return
    checks: dict[object, int] = {}
    out = []
    for item in items:
        out.append(item)
        if isinstance(item, IPyNbCell) and "check" in _tags(item.cell):
            k = checks[item.parent] = checks.get(item.parent, 0) + 1
            out += solved_items(item, k)
    items[:] = out
