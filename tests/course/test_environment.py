"""environment.yml (for conda/JupyterHub users) lists the same packages, with the same version bounds, as
pyproject.toml's dependencies and all its extras; pip entries count, conda names map to PyPI names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}  # the interpreter and the installer, not dependencies


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def split(requirement: str) -> tuple[str, str]:
    """``"numpy>=1.26,<3"`` -> ``("numpy", ">=1.26,<3")`` (conda and pip write bounds the same way here)."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*?)\s*$", requirement)
    assert m, requirement
    return normalize(CONDA_TO_PYPI.get(m.group(1), m.group(1))), m.group(2).replace(" ", "")


def parse_environment(text: str) -> dict:
    """A tiny parser for the subset of YAML environment.yml uses: ``name``, ``channels`` and
    ``dependencies`` lists, one nested ``- pip:`` list. (PyYAML arrives only indirectly, through zarr's
    dependency donfig, so the test does not rely on it.)"""
    out: dict = {}
    key, in_pip = None, False
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        item = line.strip()
        if indent == 0:
            name, _, value = item.partition(":")
            key, in_pip = name.strip(), False
            out[key] = value.strip() or []
        elif item.startswith("- "):
            value = item[2:].strip()
            if value == "pip:":
                in_pip = True
                out[key].append({"pip": []})
            elif in_pip and indent > 4:
                out[key][-1]["pip"].append(value)
            else:
                in_pip = False
                out[key].append(value)
    return out


def environment_packages() -> dict[str, str]:
    env = parse_environment((ROOT / "environment.yml").read_text())
    packages = {}
    for entry in env["dependencies"]:
        for req in entry["pip"] if isinstance(entry, dict) else [entry]:
            if req.startswith("-e ") or req in (".", "-e ."):
                continue  # the project itself
            name, spec = split(req)
            if name not in NOT_PACKAGES:
                assert name not in packages, f"{name} listed twice in environment.yml"
                packages[name] = spec
    return packages


def pyproject_packages() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    packages = {}
    for req in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        name, spec = split(req)
        assert packages.get(name, spec) == spec, f"{name} has two different bounds in pyproject.toml"
        packages[name] = spec
    return packages


def test_same_packages():
    env, pyproject = environment_packages(), pyproject_packages()
    assert sorted(set(pyproject) - set(env)) == [], "in pyproject.toml but not in environment.yml"
    assert sorted(set(env) - set(pyproject)) == [], "in environment.yml but not in pyproject.toml"


def test_same_version_bounds():
    env, pyproject = environment_packages(), pyproject_packages()
    differ = {n: (pyproject[n], env[n]) for n in pyproject if n in env and pyproject[n] != env[n]}
    assert differ == {}, "version bounds differ (pyproject.toml, environment.yml)"


def test_python_bound_matches():
    env = parse_environment((ROOT / "environment.yml").read_text())
    python = [split(d)[1] for d in env["dependencies"] if isinstance(d, str) and split(d)[0] == "python"]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert len(python) == 1 and python[0].startswith(requires)


def test_tiny_parser_agrees_with_pyyaml():
    try:
        import yaml
    except ImportError:  # not a declared dependency: the hand parser above is what the other tests use
        return
    text = (ROOT / "environment.yml").read_text()
    assert parse_environment(text) == yaml.safe_load(text)


def test_split_and_names():
    assert split("pytorch>=2.4") == ("torch", ">=2.4")
    assert split("zarr-torch-dataset==0.0.9") == ("zarr-torch-dataset", "==0.0.9")
    assert split("Zarr_Torch.Dataset == 0.0.9") == ("zarr-torch-dataset", "==0.0.9")
    assert split("h5py") == ("h5py", "")


def test_make_lab_puts_the_course_environment_first_on_the_terminals_path():
    """A lesson's terminal commands (``torchrun ...``, ``python -m zarrtorch ...``) run in a terminal of the JupyterLab
    that ``make lab`` starts, which inherits the server's PATH: the environment's ``bin`` comes first there, and its
    ``torchrun`` and ``python`` are the ones a terminal finds (a learner who never activated ``.venv`` got "command
    not found")."""
    import os
    import shlex
    import shutil
    import subprocess

    import pytest

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    printed = subprocess.run(
        ["make", "-n", "lab", "SIZE=tiny"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    lab = next(line for line in printed if "jupyter lab" in line)
    words = shlex.split(lab)
    assert words[0].startswith("PATH=") and words[1].endswith("python"), lab
    first = words[0].removeprefix("PATH=").split(":")[0]
    assert Path(first) == Path(os.path.abspath(ROOT / words[1])).parent, lab  # the link, not where it points
    found = subprocess.run(
        ["bash", "-c", "command -v python torchrun"],
        env={**os.environ, "PATH": f"{first}:{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
    ).stdout.split()
    assert [Path(p).parent for p in found] == [Path(first)] * 2, found
