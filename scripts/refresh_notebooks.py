"""Re-execute the committed notebooks in place on the tiny data (what nbval then checks), in this Python.

    python scripts/refresh_notebooks.py             # every notebook
    python scripts/refresh_notebooks.py 02 06 A1    # those whose names start so (lessons 00-06, appendices A1...)

For maintainers, after a change that alters a notebook's outputs; ``make course`` runs copies instead.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    os.environ["ZARRTORCH_SIZE"] = "tiny"
    import nbformat
    from nbclient import NotebookClient

    from zarrtorch.course.synthetic import make_data

    make_data("tiny", progress=False)
    failed = 0
    for path in sorted((ROOT / "notebooks").glob("[0-9A-Z][0-9]_*.ipynb")):
        if argv and not any(path.name.startswith(prefix) for prefix in argv):
            continue
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        client = NotebookClient(
            nb, timeout=1800, kernel_name="zarrtorch", resources={"metadata": {"path": str(path.parent)}}
        )
        try:
            client.execute()
            status = "ok"
        except Exception as exc:  # keep going: report every failing notebook
            failed += 1
            status = f"FAILED: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - start:.0f} s {status}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
