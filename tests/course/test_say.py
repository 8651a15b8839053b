"""Lines from several unbuffered processes sharing one pipe stay whole (the Slurm scripts' set-up)."""

import os
import subprocess
import sys

WRITER = """
import sys
from zarrtorch.course.say import say
rank = int(sys.argv[1])
for i in range({n}):
    {call}
"""


def run_writers(call: str, n: int = 3000, processes: int = 4) -> list[str]:
    code = WRITER.format(n=n, call=call)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stderr=write, env=env) for r in range(processes)]
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    assert all(p.wait() == 0 for p in procs)
    return text.splitlines()


def test_say_keeps_every_line_whole():
    lines = run_writers('say(f"zarrtorch: rank {rank}: line {i} of a long enough message", sys.stderr)')
    expected = {f"zarrtorch: rank {r}: line {i} of a long enough message" for r in range(4) for i in range(3000)}
    assert len(lines) == len(expected) and set(lines) == expected
