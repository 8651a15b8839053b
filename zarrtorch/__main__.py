"""``python -m zarrtorch``: the command line (:mod:`zarrtorch.cli`)."""

from zarrtorch.cli import main

raise SystemExit(main())
