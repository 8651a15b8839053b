"""Every zarrtorch module, and every name in one, that the README, the lessons, the slides and the other
guides mention exists as written: a module moved or renamed fails here, not in a learner's hands."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "slurm" / "README.md",
        ROOT / "slides" / "workshop.md", *sorted((ROOT / "notebooks").glob("*.ipynb"))]  # fmt: skip
NOT_MODULES = {"zarrtorch.commands"}  # the entry-point group the course registers its commands under
DOTTED = re.compile(r"\bzarrtorch(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
FILES = re.compile(r"\bzarrtorch/[A-Za-z0-9_/]+\.py\b")


def texts():
    for doc in DOCS:
        if doc.suffix == ".ipynb":
            for i, cell in enumerate(json.loads(doc.read_text())["cells"]):
                yield f"{doc.relative_to(ROOT)}[{i}]", "".join(cell["source"])
        else:
            yield str(doc.relative_to(ROOT)), doc.read_text()


def mentioned() -> dict[str, str]:
    found: dict[str, str] = {}
    for where, text in texts():
        for name in DOTTED.findall(text):
            found.setdefault(name.rstrip("."), where)
        for path in FILES.findall(text):
            found.setdefault(path, where)
    return found


def resolves(name: str) -> bool:
    if "/" in name:
        return (ROOT / name).exists()
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


NAMES = mentioned()


def test_the_guides_mention_modules():
    assert len(NAMES) > 30 and "zarrtorch.plan" in NAMES


@pytest.mark.parametrize("name", sorted(set(NAMES) - NOT_MODULES))
def test_a_mentioned_module_or_name_exists(name):
    assert resolves(name), f"{NAMES[name]} names {name}, which does not exist"
