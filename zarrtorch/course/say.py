"""One line of a rank's log, written whole.

Slurm scripts export ``PYTHONUNBUFFERED=1`` so each rank's lines appear as they happen. Unbuffered, ``print``
writes the text and its newline in two system calls, and two ranks sharing one log can interleave between
them: ``...step 1zarrtorch: rank 1: ...`` on one line, a line that a reader (or a test) can no longer split.
One ``write`` of text and newline together is one system call, and a pipe keeps writes of up to 4 KiB whole.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` and its newline in one call, then flush (stdout unless ``stream`` is given)."""
    out = sys.stdout if stream is None else stream
    out.write(text + "\n")
    out.flush()
