"""Every zarrtorch module, and every name in one, that the README, the lessons, the slides, the reference pages
and the other guides mention exists as written: a module moved or renamed fails here, not in a learner's hands."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ["README.md", "benchmarks/README.md", "data/README.md", "slides/workshop.md"]
GUIDES += [f"slurm/{name}" for name in ("README.md", "CHECKLIST.md", "WALKTHROUGH.md")]
DOCS = [ROOT / name for name in GUIDES] + sorted((ROOT / "docs").glob("*.md"))  # the reference pages
DOCS += sorted((ROOT / "notebooks").glob("*.ipynb"))
NOT_MODULES = {"zarrtorch.commands"}  # the entry-point group the course registers its commands under
DOTTED = re.compile(r"\bzarrtorch(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
COURSE = re.compile(r"`(course(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")  # `course.layouts`: the course package's modules
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
        for name in COURSE.findall(text):
            found.setdefault("zarrtorch." + name.rstrip("."), where)
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


def test_the_readme_layout_names_every_module():
    """The README's tree of the repository names every module of the package (a module added later is listed)."""
    readme = (ROOT / "README.md").read_text()
    tree = readme.split("## Repository layout", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed = set(re.findall(r"\b([A-Za-z0-9_]+\.py)\b", tree))
    package = ROOT / "zarrtorch"
    missing = sorted(str(p.relative_to(ROOT)) for p in package.rglob("*.py") if p.name not in listed)
    assert not missing, f"README.md's repository layout does not name {missing}"
