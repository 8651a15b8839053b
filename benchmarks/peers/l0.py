"""L0 on the peers' store: every chunk of ``x`` read once in order with plain zarr reads from 2 threads, data
dropped (``benchmarks/harness.py`` ``run_l0``, the decode limit ``make bench`` measures loaders against)."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

from zarrtorch.course.memory import MemorySampler  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    with MemorySampler() as sampler:
        epoch = harness.run_l0({"store": a.store, "threads": a.threads}, sampler)["epochs"][0]
    out = {"rows_per_s": epoch["samples_per_s"], "seconds": epoch["seconds"], "threads": a.threads}
    print("PEER-RESULT " + json.dumps(out), flush=True)
