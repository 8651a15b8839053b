"""nbval settings shared by every notebook: outputs that legitimately vary are not compared."""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        # HTML reprs hold random ids; stderr holds warnings and progress bars; widgets are state.
        collector.skip_compare += (
            "text/html",
            "application/javascript",
            "stderr",
            "application/vnd.jupyter.widget-view+json",
        )


# every exercise's solution runs in the lesson's kernel right after its check (zarrtorch/course/nbval_solutions.py)
from zarrtorch.course.nbval_solutions import pytest_collection_modifyitems  # noqa: E402, F401
