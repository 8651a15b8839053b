"""Small helpers every layer uses: arithmetic written once (``sizes``), what the current process is (CPUs,
its rank in a DDP job, ``process``), and buffers reused once nothing references them (``pool``).

Imports nothing of zarrtorch beyond its own modules and ``zarrtorch._compat`` (the process group's timeout).
"""
