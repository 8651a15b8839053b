"""Command line: ``zarrtorch COMMAND`` or ``python -m zarrtorch COMMAND``.

The core's commands (``audit``, ``roofline``, ``cache clear``) need numpy, zarr and torch only. Other packages add
commands through the ``zarrtorch.commands`` entry-point group: the course registers ``make-data`` and ``train``
(``pyproject.toml``), so the core never imports it, and a command whose extra is not installed says which.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import entry_points


def _audit(argv: list[str]) -> int:
    from zarrtorch.audit import main

    return main(argv)


def _roofline(argv: list[str]) -> int:
    from zarrtorch.roofline import main

    return main(argv)


def _cache(argv: list[str]) -> int:
    """``cache clear DIR``: empty the chunk cache a loader keeps in DIR (``ReadOptions(cache_dir=DIR)``)."""
    if len(argv) != 2 or argv[0] != "clear":
        print("usage: zarrtorch cache clear DIR   (empties the chunk cache of ReadOptions(cache_dir=DIR))")
        return 0 if argv in (["-h"], ["--help"]) else 2
    from zarrtorch._read.cache import clear_cache

    try:
        freed = clear_cache(argv[1])
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{argv[1]}: {freed / 2**20:.1f} MiB freed")
    return 0


CORE: dict[str, Callable[[list[str]], int]] = {"audit": _audit, "roofline": _roofline, "cache": _cache}


def commands() -> dict[str, Callable[[list[str]], int]]:
    """Every command: the core's, then those registered by installed packages (loaded when run)."""
    found = {ep.name: ep for ep in entry_points(group="zarrtorch.commands")}
    return {**CORE, **{name: _plugin(ep) for name, ep in found.items() if name not in CORE}}


def _plugin(ep) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        try:
            return ep.load()(argv)
        except ModuleNotFoundError as exc:  # the command imports its packages when it runs
            raise SystemExit(
                f"zarrtorch {ep.name} needs {exc.name or 'a package'}, which is not installed ({exc}): "
                "pip install 'zarrtorch[course]'"
            ) from None

    return run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in available:
        names = ",".join(available)
        print(f"usage: zarrtorch {{{names}}} [options]   (add --help after a command)")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command {argv[0]!r}", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return available[argv[0]](argv[1:])
