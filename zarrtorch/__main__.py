"""``python -m zarrtorch``: the command line (its commands are the course's: make-data, train)."""

from zarrtorch.course.cli import main

raise SystemExit(main())
