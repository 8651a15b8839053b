"""The private part of dask zarrtorch relies on: the arguments and values a graph's tasks hold.

``tests/core/_compat/test_dask.py`` checks it against the installed dask (an optional dependency, for
``prepare_zarr``; nothing here imports it).
"""

from __future__ import annotations


def graph_tasks(obj) -> list | None:
    """The tasks of a dask collection's graph, or ``None`` for anything else (``__dask_graph__`` is public)."""
    graph = getattr(obj, "__dask_graph__", None)
    if not callable(graph) or not type(obj).__module__.startswith("dask"):
        return None
    return list(dict(graph()).values())


def task_parts(task) -> list:
    """What a task of a dask graph holds: its arguments (``args``) or its value (``value``); ``None`` for either
    it lacks.

    Why: ``prepare_zarr`` follows a dask array down to the zarr array it reads, to refuse overwriting the store it
    reads from; the task classes (``dask._task_spec``: ``Task.args``, ``DataNode.value``) are dask's internals."""
    return [getattr(task, "args", None), getattr(task, "value", None)]
