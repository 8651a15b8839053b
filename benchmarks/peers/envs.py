"""One virtual environment per peer under ``.peers/<name>/``, built from the registry and cached.

Why separate environments: several peers pin versions the course cannot take (MosaicML Streaming pins
``numpy<2.2``, anemoi-datasets ``zarr<=2.18.7``), and keeping every peer out of the project's ``.venv`` leaves
the course environment exactly what ``pyproject.toml`` says. Each build installs ``torch==2.13.0`` first (the
local CPU wheel), then the peer with a constraint pinning that torch, so pip can never pull a CUDA build; a
build that would still bring ``nvidia-*`` packages is refused. A stamp (hash of the recipe) makes a finished
build, or a failed one with its reason, a no-op until the recipe changes or ``--rebuild`` is given.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / ".peers"
TORCH = "torch==2.13.0"
ZARR = "zarr==3.1.6"  # the course's zarr: reads the benchmark store (Zarr v3) as the project does

# name -> the pip requirements installed after torch (the pins the issue found to install on CPU torch 2.13)
PACKAGES: dict[str, list[str]] = {
    "xbatcher": ["xbatcher==0.4.0", "xarray>=2025.1", "dask", ZARR],
    "litdata": ["litdata==0.2.76", ZARR],
    "torchdata": ["torchdata==0.11.0", ZARR],
    "grain": ["grain==0.2.18", ZARR],
    "mosaicml": ["mosaicml-streaming==0.13.0", ZARR],
    # anemoi builds its own dataset from NetCDF files; its create step needs earthkit-data's NetCDF reader
    "anemoi": ["anemoi-datasets[create]==0.5.47", "netCDF4", "xarray"],
    # beluga writes and reads its stores itself (numpy-only wheel); zarr only for reading the row numbers back
    "beluga": ["zarr-beluga==0.3.0", ZARR],
}

# name -> the module the peer's script imports: checked after the install (a wheel that installs may still not load)
IMPORTS = {
    "xbatcher": "xbatcher",
    "litdata": "litdata",
    "torchdata": "torchdata.stateful_dataloader",
    "grain": "grain",
    "mosaicml": "torchvision_stub; torchvision_stub.install(); import streaming",  # see torchvision_stub.py
    "anemoi": "anemoi.datasets",
    "beluga": "beluga",
}


def stamp_of(name: str) -> str:
    recipe = {"torch": TORCH, "packages": PACKAGES[name], "import": IMPORTS[name], "python": sys.version_info[:2]}
    return hashlib.sha1(json.dumps(recipe).encode()).hexdigest()[:12]


def python_of(name: str) -> Path:
    return PEERS_DIR / name / "venv" / "bin" / "python"


def _tail(path: Path, lines: int = 6) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    interesting = [t for t in text if "error" in t.lower() or "conflict" in t.lower()] or text
    return " | ".join(t.strip() for t in interesting[-lines:])[-600:]


def ensure_env(name: str, rebuild: bool = False) -> dict:
    """Build (or reuse) the peer's environment; returns ``{"ok", "python"}`` or ``{"ok": False, "reason"}``."""
    base = PEERS_DIR / name
    stamp, log = base / f"stamp-{stamp_of(name)}.json", base / "build.log"
    if stamp.exists() and not rebuild:
        return json.loads(stamp.read_text()) | {"built_now": False}
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob("stamp-*.json"):
        old.unlink()
    t0 = time.perf_counter()
    venv, py = base / "venv", python_of(name)
    constraint = base / "constraints.txt"
    constraint.write_text(TORCH + "\n")
    steps = [
        ["python3", "-m", "venv", "--clear", str(venv)],
        [str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(py), "-m", "pip", "install", "-q", TORCH],
        [str(py), "-m", "pip", "install", "-q", "-c", str(constraint), *PACKAGES[name]],
    ]
    result: dict = {"ok": True, "python": str(py)}
    with log.open("w") as out:
        for cmd in steps:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                result = {"ok": False, "reason": f"pip failed: {_tail(log)}"}
                break
    if result["ok"]:
        listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
        installed = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout or "[]")}
        cuda = sorted(p for p in installed if p.startswith("nvidia-"))
        if cuda:
            result = {"ok": False, "reason": f"would install CUDA packages ({', '.join(cuda[:3])}...)"}
        elif not installed.get("torch", "").startswith("2.13.0"):
            result = {"ok": False, "reason": f"torch replaced by {installed.get('torch')}"}
        elif (err := _import_error(py, IMPORTS[name])) is not None:
            result = {"ok": False, "reason": f"installs, but `import {IMPORTS[name]}` fails: {err}"}
        else:
            result["versions"] = {k: v for k, v in installed.items() if k.split("[")[0] in _names(name)}
    result["build_s"] = round(time.perf_counter() - t0, 1)
    stamp.write_text(json.dumps(result, indent=1))
    return result | {"built_now": True}


def _import_error(py: Path, module: str) -> str | None:
    """None if the module imports, else the last line of the error (e.g. a CUDA-only torchvision)."""
    here = Path(__file__).resolve().parent  # the peers' own helpers (torchvision_stub) import from here
    done = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True, text=True, cwd=here)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or ["?"])[-1][:300]


def _names(name: str) -> set[str]:
    pins = [p.split("[")[0].split("=")[0].split(">")[0].split("<")[0].lower() for p in PACKAGES[name]]
    return {*pins, "torch", "numpy", "zarr"}


if __name__ == "__main__":  # python benchmarks/peers/envs.py [names...]: build environments only
    for peer in sys.argv[1:] or list(PACKAGES):
        print(peer, json.dumps(ensure_env(peer)), flush=True)
