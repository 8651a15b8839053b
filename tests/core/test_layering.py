"""The core is a library of its own: it never imports the course, imports no optional dependency at import
time, and ``import zarrtorch`` changes nothing in the user's process but ``sys.modules``."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import zarrtorch

PACKAGE = Path(zarrtorch.__file__).parent
CORE = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__main__.py")  # __main__ is the course's CLI
OPTIONAL = {"xarray", "dask", "lightning", "matplotlib", "tqdm", "h5py", "psutil", "pandas"}
NEEDS_LIGHTNING = {"lightning.py"}  # the DataModule module needs the `lightning` extra, by name


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level?) for every import statement of a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, id(node) in top)] + [(f"{node.module}.{a.name}", id(node) in top) for a in node.names]
    return out


def test_core_never_imports_course_code():
    offenders = [f"{p.name}: {m}" for p in CORE for m, _ in imports(p) if m.startswith("zarrtorch.course")]
    assert not offenders, offenders


def test_core_imports_optional_packages_only_lazily():
    offenders = [
        f"{p.name}: {m}"
        for p in CORE
        if p.name not in NEEDS_LIGHTNING
        for m, top in imports(p)
        if top and m.split(".")[0] in OPTIONAL
    ]
    assert not offenders, offenders


def test_core_modules_stay_small():
    sizes = {p.name: len(p.read_text().splitlines()) for p in CORE}
    assert max(sizes.values()) <= 260, sizes


def test_import_has_no_side_effects():
    code = """
import json, sys, warnings
import numpy, torch, zarr  # the dependencies add filters of their own
before = list(warnings.filters)
import zarrtorch
OPTIONAL = set(sys.argv[1].split(","))
print(json.dumps({
    "filters_added": len(warnings.filters) - len(before),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in OPTIONAL or m.startswith("zarrtorch.course")),
    "all": zarrtorch.__all__,
}))
"""
    watched = ",".join(sorted(OPTIONAL - {"tqdm"}))  # torch itself imports tqdm when it is installed
    run = subprocess.run([sys.executable, "-c", code, watched], capture_output=True, text=True, check=True)
    out = json.loads(run.stdout)
    assert out["filters_added"] == 0
    assert out["modules"] == []
    assert out["all"] == sorted(out["all"])
    assert all(hasattr(zarrtorch, name) for name in out["all"])
