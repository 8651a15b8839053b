"""The test files' order for ``make test`` (the root ``conftest.py``): longest first by a CI run's seconds, a file's
items kept together and in their order; ``scripts/file_seconds.py`` reads those seconds from a junit report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_files_go_longest_first_each_whole_and_in_its_own_order(tmp_path, monkeypatch):
    order = _module(ROOT / "conftest.py", "root_conftest_under_test")
    seconds = tmp_path / "file_seconds.json"
    seconds.write_text(json.dumps({"a.py": 1.0, "b.py": 30.0, "nb.ipynb": 10.0}))
    monkeypatch.setattr(order, "SECONDS", seconds)
    ids = ["a.py::t1", "a.py::t2", "new.py::t", "b.py::t2", "b.py::t1", "nb.ipynb::Cell 0", "nb.ipynb::Cell 1"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == [
        "b.py::t2",
        "b.py::t1",
        "new.py::t",  # not measured: the median, 10 s; at a tie, the file collected first goes first
        "nb.ipynb::Cell 0",
        "nb.ipynb::Cell 1",
        "a.py::t1",
        "a.py::t2",
    ]


def test_file_seconds_sums_a_junit_report_by_file(tmp_path):
    seconds = _module(ROOT / "scripts" / "file_seconds.py", "file_seconds_under_test")
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.core.test_x" name="a" time="1.5"/>'
        '<testcase classname="tests.core.test_x.TestY" name="b" time="2.0"/>'
        '<testcase classname="notebooks.01_first.ipynb" name="Cell 1" time="4.25"/>'
        "</testsuite></testsuites>"
    )
    assert seconds.file_seconds(str(report)) == {"notebooks/01_first.ipynb": 4.2, "tests/core/test_x.py": 3.5}


def test_every_file_the_order_names_exists():
    """A file renamed or removed since the seconds were measured: run scripts/file_seconds.py again."""
    named = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    assert named and [f for f in named if not (ROOT / f).exists()] == []
