"""Seconds each test file took in a run, from its junit report: what ``conftest.py`` orders the files by.

    .venv/bin/python -m pytest ... --junitxml=/tmp/report.xml
    .venv/bin/python scripts/file_seconds.py /tmp/report.xml > tests/file_seconds.json

Take the report of a ``make test`` run on CI's machine (2 cores, three processes): the figures only order the
files (longest first), so a run on another machine orders them about as well."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def file_seconds(report: str) -> dict[str, float]:
    """{test file (a path from the repository's root): its tests' seconds, setup and teardown included}."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        seconds[_file_of(case.get("classname", ""))] += float(case.get("time") or 0.0)
    return {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def _file_of(classname: str) -> str:
    """junit's dotted class name back to the file: ``tests.core.test_x.TestY`` -> ``tests/core/test_x.py``,
    ``notebooks.01_a.ipynb`` -> ``notebooks/01_a.ipynb``."""
    if ".ipynb" in classname:
        head, _ = classname.split(".ipynb", 1)
        return head.replace(".", "/", head.count(".")) + ".ipynb"
    parts = classname.split(".")
    while parts and parts[-1][:1].isupper():  # a test class's name
        parts.pop()
    return "/".join(parts) + ".py"


if __name__ == "__main__":
    json.dump(file_seconds(sys.argv[1]), sys.stdout, indent=1)
    sys.stdout.write("\n")
