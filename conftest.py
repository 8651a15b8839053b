"""The order in which ``make test`` hands test files to its processes: the longest first.

pytest-xdist (``--dist loadfile``) gives each process whole files, the next one in line whenever a process is
almost out of work. Handed out longest first, the files end at about the same time; in collection order (or
xdist's own, most tests first) the few-test, minute-long files (DDP and Lightning runs, Slurm jobs) came last and
one process ran them while the others had finished. The seconds come from a CI run's report
(``tests/file_seconds.json``, made by ``scripts/file_seconds.py``); a file not in it counts as the median. Only
the order changes: every test and every notebook cell runs as it did, a file's items in their own order."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

SECONDS = Path(__file__).parent / "tests" / "file_seconds.json"


@pytest.hookimpl(trylast=True)  # after nbval_solutions adds each exercise's solution items to its notebook
def pytest_collection_modifyitems(session, config, items) -> None:
    if not SECONDS.exists():
        return
    seconds = json.loads(SECONDS.read_text())
    typical = statistics.median(seconds.values()) if seconds else 0.0
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::", 1)[0], len(first_seen))

    def longest_first(item) -> tuple[float, int]:
        file = item.nodeid.split("::", 1)[0]
        return -seconds.get(file, typical), first_seen[file]

    items.sort(key=longest_first)  # stable: a file's items keep their order
