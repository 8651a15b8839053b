"""The core is a library of its own: it never imports the course, imports no optional dependency at import
time, and ``import zarrtorch`` changes nothing in the user's process but ``sys.modules``. Its layers import in
one direction: the modules the lessons build (top level) may use the machinery (``_read``, ``_workers``),
the helpers (``_util``) and the upstream libraries' private parts (``_compat``); the machinery uses only the
helpers, ``_compat`` and its own subpackage; the helpers use only ``_compat``; ``_compat`` uses nothing of
zarrtorch; nothing forms a cycle."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import zarrtorch

PACKAGE = Path(zarrtorch.__file__).parent
CORE = sorted(p for p in PACKAGE.rglob("*.py") if "course" not in p.relative_to(PACKAGE).parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """``lesson`` (top level), ``_read``/``_workers`` (machinery), ``_util`` (helpers) or ``_compat`` (upstream
    private parts)."""
    parts = module.split(".")
    return (
        parts[1]
        if len(parts) > 2 or (len(parts) == 2 and parts[1].startswith("_") and parts[1] != "__main__")
        else "lesson"
    )


OPTIONAL = {"xarray", "dask", "lightning", "matplotlib", "tqdm", "h5py", "psutil", "pandas"}
NEEDS_LIGHTNING = {"lightning.py"}  # the DataModule module needs the `lightning` extra, by name


def absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module a ``from ... import`` names, with a relative one (``from ._util import x``) resolved against
    the file's package, so that no import escapes the layer checks by being relative."""
    if node.level == 0:
        return node.module
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at module level?) for every import statement of a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module, at_top = absolute(node, path), id(node) in top
            out += [(module, at_top)] + [(f"{module}.{a.name}", at_top) for a in node.names]
    return out


def test_relative_imports_are_resolved(tmp_path):
    """A relative import counts as the module it names (so ``from .._read import x`` in ``_util`` is seen)."""
    target = PACKAGE / "_util" / "sizes.py"
    tree = ast.parse("from .._read import reader\nfrom . import pool\nfrom .process import cpu_share\n")
    assert [absolute(node, target) for node in tree.body] == [
        "zarrtorch._read",
        "zarrtorch._util",
        "zarrtorch._util.process",
    ]


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


ALLOWED = {  # layer -> the layers it may import
    "lesson": {"lesson", "_read", "_workers", "_util", "_compat"},
    "_read": {"_read", "_util", "_compat"},
    "_workers": {"_workers", "_util", "_compat"},
    "_util": {"_util", "_compat"},
    "_compat": {"_compat"},
}


def zarrtorch_imports(path: Path) -> set[str]:
    """The zarrtorch modules a file imports (``from zarrtorch.x import y`` counts as ``zarrtorch.x``, and as
    ``zarrtorch.x.y`` when that is a module)."""
    found = set()
    for name, _ in imports(path):
        if name == "zarrtorch" or not name.startswith("zarrtorch."):
            continue
        parts = name.split(".")
        while parts and not (
            PACKAGE.parent.joinpath(*parts).with_suffix(".py").exists()
            or (PACKAGE.parent.joinpath(*parts) / "__init__.py").exists()
        ):
            parts.pop()
        if parts:
            found.add(".".join(parts))
    return found


def test_the_layers_import_in_one_direction():
    graph = {module_name(p): zarrtorch_imports(p) for p in CORE}
    offenders = [
        f"{mod} ({layer(mod)}) imports {dep} ({layer(dep)})"
        for mod, deps in graph.items()
        for dep in deps
        if layer(dep) not in ALLOWED[layer(mod)]
    ]
    assert not offenders, offenders
    assert set(ALLOWED) == {layer(m) for m in graph}, "a module outside the known layers"


INTERNAL = ("zarr.core",)  # upstream modules that are internal without an underscore in their name


def test_upstream_private_parts_are_imported_only_in_compat():
    """A private upstream module or name (``torch.utils.data._utils``, ``from x import _y``, ``zarr.core``) is
    imported by ``zarrtorch._compat`` alone, where a guard test checks it; private attributes are ruff's SLF001."""
    offenders = [
        f"{module_name(p)}: {m}"
        for p in CORE
        if layer(module_name(p)) != "_compat"
        for m, _ in imports(p)
        if not m.startswith("zarrtorch")
        and (any(part.startswith("_") and part != "__future__" for part in m.split(".")) or m.startswith(INTERNAL))
    ]
    assert not offenders, offenders


def test_no_import_cycle():
    graph = {module_name(p): {d for d in zarrtorch_imports(p) if d != module_name(p)} for p in CORE}
    done, stack = set(), []

    def visit(node):
        if node in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(node) :] + [node]))
        if node in done:
            return
        stack.append(node)
        for dep in graph.get(node, ()):
            if not dep.endswith("__init__") and dep != "zarrtorch":
                visit(dep)
        stack.pop()
        done.add(node)

    for node in graph:
        if node != "zarrtorch":
            visit(node)


def test_every_subpackage_says_what_it_is_for_and_who_imports_it():
    for init in PACKAGE.glob("_*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Import" in doc and len(doc) > 150, f"{init.relative_to(PACKAGE)}: say what it is for and who imports it"


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


def test_no_line_is_packed_past_the_formatter():
    """Lines are laid out by ``ruff format`` alone: no formatter opt-out comment (once used to pack calls under
    the 260-line cap the layering test replaced)."""
    root = PACKAGE.parent
    sources = [
        p for folder in ("zarrtorch", "tests", "benchmarks", "scripts", "slides") for p in (root / folder).rglob("*.py")
    ]
    marker = "fmt: " + "skip"  # spelled in two parts so this file does not hold it
    packed = [
        f"{p.relative_to(root)}:{i}"
        for p in sources
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if marker in line
    ]
    assert not packed, packed
