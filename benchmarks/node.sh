#!/usr/bin/env bash
# The measurements still owed on a many-core node (issue 24 first; issue 25's windows last), in one call that fits a
# 15-minute loan.
#
# A node of this workplace has Python 3.12 with torch, aiohttp and fsspec, but not zarr: carry its wheels.
# Once, here, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 crc32c google-crc32c
# Then run it with carry [".whl"] and a timeout of 590 s:
#   bash benchmarks/node.sh
# Each part has its own time limit and writes its JSON and log under $OUT (or benchmarks/results/node when
# OUT is unset), so a part that runs long leaves the others' figures. Nothing here decides a pass or a fail.
# WINDOW_ROWS and REMOTE_ROWS make the stores smaller (a quick look: 600 and 2000).
set -u
OUT=${OUT:-benchmarks/results/node}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -d .whl ] && ! $PY -c "import zarr" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
{
  echo "cpus: $(nproc)"
  $PY -c "import sys, torch, zarr, numcodecs; print(sys.version.split()[0], torch.__version__, zarr.__version__, numcodecs.__version__)"
} 2>&1 | tee "$OUT/versions.txt"
DATA=$(mktemp -d /tmp/zarrtorch-bench.XXXX)

# issue 24: rows/s at 0, 20 and 100 ms per request, 0 and 2 workers, with default settings; then a bare aiohttp
# client with 256 and 512 requests at once against the same servers: what the server gives, without the loader
timeout 270 $PY benchmarks/remote.py --rows "${REMOTE_ROWS:-100000}" --delay-ms 0 20 100 --in-flight --workers 0 2 --repeats 3 \
  --plain-client 256 512 --verbose --json "$OUT/remote.json" 2>&1 | tee "$OUT/remote.log"

# issue 24: reads handed out in order against a latency tail (no server): held = level against 2-4 x the level
timeout 100 $PY benchmarks/head_of_line.py --pieces 6000 --repeats 3 2>&1 | tee "$OUT/head_of_line.log"

# issue 25: windows/s against the decode limit, one-step and 16-step chunks, epochs of 20,000 steps
# and with 0 workers in 4 and 8 decode threads besides the default (the CPUs: does one process's GIL limit it?)
timeout 180 $PY benchmarks/windows.py --rows "${WINDOW_ROWS:-20000}" --chunks 1 16 --repeats 3 --blocks 16 --trade-steps 8760 \
  --decode-threads 4 8 --data-dir "$DATA" --out "$OUT/windows.json" 2>&1 | tee "$OUT/windows.log"

rm -rf "$DATA"
