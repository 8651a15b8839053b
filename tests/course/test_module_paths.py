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


CORE_TESTS = ROOT / "tests" / "core"
BEHAVIOUR = CORE_TESTS / "behaviour"  # promises kept across modules (DDP, damaged chunks...), named for them


def unit_test_files() -> list[Path]:
    """The core's test files that test one module each: every one under tests/core/ but the behaviour suites."""
    return sorted(path for path in CORE_TESTS.rglob("test_*.py") if BEHAVIOUR not in path.parents)


def mirrored_module(test_file: Path) -> Path:
    """The module a unit test file is named for: tests/core/<sub>/test_<m>.py tests zarrtorch/<sub>/<m>.py."""
    relative = test_file.relative_to(CORE_TESTS)
    return ROOT / "zarrtorch" / relative.parent / relative.name.removeprefix("test_")


def mirrored_test_file(module: Path) -> Path:
    """Where a module's unit tests belong: zarrtorch/<sub>/<m>.py is tested by tests/core/<sub>/test_<m>.py."""
    relative = module.relative_to(ROOT / "zarrtorch")
    return CORE_TESTS / relative.parent / f"test_{relative.name}"


def misplaced(test_file: Path) -> str | None:
    """Why a unit test file is not beside its module (None when it is), and where it belongs."""
    module = mirrored_module(test_file)
    if module.exists():
        return None
    where = test_file.relative_to(ROOT)
    namesakes = sorted(p for p in (ROOT / "zarrtorch").rglob(module.name) if "course" not in p.parts)
    if namesakes:
        modules = " or ".join(str(p.relative_to(ROOT)) for p in namesakes)
        mirrors = " or ".join(str(mirrored_test_file(p).relative_to(ROOT)) for p in namesakes)
        return (
            f"{where} is named for {modules}: move it to {mirrors}, or to "
            f"{BEHAVIOUR.relative_to(ROOT)}/ if it tests a promise kept across modules"
        )
    return (
        f"{where} names {module.relative_to(ROOT)}, which does not exist: rename it after the module it tests, "
        f"or move it to {BEHAVIOUR.relative_to(ROOT)}/ if it tests a promise kept across modules"
    )


def test_the_core_has_unit_test_files_to_check():
    files = {path.relative_to(CORE_TESTS).as_posix() for path in unit_test_files()}
    assert len(files) > 10 and "test_plan.py" in files and "_read/test_fetch.py" in files


def test_a_modules_unit_tests_sit_at_its_mirrored_path():
    """A unit test file sits at its module's path mirrored under tests/core/ (tests/core/_read/test_reader.py for
    zarrtorch/_read/reader.py), so a module's tests are found beside it, and a module renamed or moved without its
    tests fails here instead of leaving a test file named for nothing."""
    wrong = [reason for reason in map(misplaced, unit_test_files()) if reason]
    assert not wrong, "\n".join(wrong)
