"""Re-execute the committed notebooks in place on the default size (``small``), in this Python: the outputs a
reader of the repository sees are those a learner's run prints. nbval then runs them on ``tiny`` in CI and
compares every output that does not depend on the size (the cells whose output does are tagged
``nbval-ignore-output``, and their claims are asserted in code at every size).

    python scripts/refresh_notebooks.py             # every notebook
    python scripts/refresh_notebooks.py 02 06 A1    # those whose names start so
    ZARRTORCH_SIZE=tiny python scripts/refresh_notebooks.py 02   # another size, to look at, not to commit

For maintainers, after a change that alters a notebook's outputs; ``make course`` runs copies instead.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    size = os.environ.setdefault("ZARRTORCH_SIZE", "small")
    import nbformat

    from zarrtorch.course.lessons import run_notebook
    from zarrtorch.course.synthetic import make_data

    make_data(size, progress=False)
    failed = 0
    for path in sorted((ROOT / "notebooks").glob("[0-9A-Z][0-9]_*.ipynb")):
        if argv and not any(path.name.startswith(prefix) for prefix in argv):
            continue
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        try:
            run_notebook(nb, path, timeout=1800)
            status = "ok"
        except Exception as exc:  # keep going: report every failing notebook
            failed += 1
            status = f"FAILED: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - start:.0f} s {status}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
