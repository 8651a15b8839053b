#!/usr/bin/env bash
# Set up the Python environment for the course, idempotently.
# - uses the active virtual/conda environment if there is one, else creates ./.venv
# - installs torch==2.13.0 FIRST unless some torch is already importable (a hub's conda env keeps its own)
# - installs the package with its extras, pinned so that pip can never replace the torch that is there
# - --no-compile: pip would byte-compile every module of every package (torch alone: 36 s -> 13 s here without);
#   Python compiles the modules a process imports on first use instead and keeps them (the Makefile makes sure
#   PYTHONDONTWRITEBYTECODE does not stop it)
# Prints nothing but progress; the Makefile finds the interpreter with scripts/python.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/python.sh)
if [ "$PY" = ".venv/bin/python" ] && [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --no-compile --upgrade pip
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0 first (CPU wheel where one is provided locally)"
  "$PY" -m pip install -q --no-compile "torch==2.13.0"
fi
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
stamp_dir=$("$PY" -c "import sys; print(sys.prefix)")
stamp="$stamp_dir/.zarrtorch-setup-$(cat pyproject.toml | sha1sum | cut -c1-12)"
if [ -f "$stamp" ] && "$PY" -c "import zarrtorch" 2>/dev/null; then
  echo "[setup] environment up to date (torch $TORCH_VERSION)"
  exit 0
fi
echo "[setup] installing zarrtorch[course,test,bench] (torch pinned to $TORCH_VERSION)"
constraints=$(mktemp)
echo "torch==$TORCH_VERSION" > "$constraints"
"$PY" -m pip install -q --no-compile -c "$constraints" -e ".[course,test,bench]"
rm -f "$constraints"
"$PY" -m ipykernel install --sys-prefix --name zarrtorch --display-name "Python (zarrtorch)" >/dev/null
"$PY" -c "import torch, sys; assert torch.__version__ == '$TORCH_VERSION', 'torch was replaced: ' + torch.__version__"
touch "$stamp"
echo "[setup] done (torch $TORCH_VERSION)"
