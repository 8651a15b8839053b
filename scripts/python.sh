#!/usr/bin/env bash
# Print the interpreter the course uses: the active virtual or conda environment, else ./.venv.
if [ -n "${VIRTUAL_ENV:-}" ]; then echo "$VIRTUAL_ENV/bin/python"
elif [ -n "${CONDA_PREFIX:-}" ] && [ -x "${CONDA_PREFIX}/bin/python" ]; then echo "$CONDA_PREFIX/bin/python"
else echo ".venv/bin/python"; fi
