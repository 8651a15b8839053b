#!/usr/bin/env bash
# The measurements owed on a loaned GPU node, in one call that fits a 15-minute loan. STEPS picks the parts, run in
# this order; the default is the three GPU questions, whose time limits (150 + 200 + 150 s) fit one 600 s call:
#   workers  the course's workers rule on a GPU: benchmarks/gpu_feed.py, windows trained with 0 and 2 workers
#   lesson05 lesson 05 run on the GPU (benchmarks/run_lesson.py) on tiny data generated there first: needs
#            lightning, matplotlib, xarray and pandas (the node's image has them) and dask, partd, locket and h5netcdf
#            carried as wheels (below); skipped, saying so, without
#   pinned   batches in pinned slots (issue 43 item 7, benchmarks/pinned_feed.py): host-to-device GB/s from the
#            loader's pinned slots against DataLoader's pin copy and the card's own rate, and the training step's
#            wait for data with 0 and 2 workers (on gpu_feed.py's store, made once by whichever part runs first)
#   train    `python -m zarrtorch train` (as zarrtorch.course.train: nothing is installed there) on the tiny data,
#            0 and 2 workers, then under torchrun with one process (NCCL): the course's command on a GPU
#   copies   the card's host-to-device rate from pinned memory by copy size (pinned_feed.py --copy-sizes): is
#            the slots' rate the card's rate at a batch's size?
#   remote   rows/s at 0, 20 and 100 ms per request (issue 24), then head_of_line.py
#   windows  windows/s against the decode limit (issue 25)
# e.g. STEPS="remote windows" bash benchmarks/node.sh     # the older CPU-side questions, in a second call
#
# A node of this workplace has Python 3.12 with torch, aiohttp and fsspec, but not zarr: carry its wheels.
# Once, here, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 crc32c google-crc32c
# For lesson05 also the data generator's wheels (the node's image has lightning, matplotlib, xarray and pandas):
#   python3 -m pip download ... (the same flags) -d .whl dask==2026.7.1 partd==1.4.2 locket==1.0.0 h5netcdf==1.8.2
# The course's data is generated on the node (`make_data("tiny")`, about 10 s): a carried data/tiny/train.zarr with
# the wheels is over the 64 MiB carry limit, and ensure_data() wants every file of the size, not the store alone.
# Then run it with carry [".whl"] and a timeout of 450 s (the parts' limits, 150 + 200 + 150 s, are ceilings):
#   bash benchmarks/node.sh
# Each part has its own time limit and writes its JSON and log under $OUT (or benchmarks/results/node when
# OUT is unset), so a part that runs long leaves the others' figures. Nothing here decides a pass or a fail.
# WINDOW_ROWS, FEED_ROWS (workers and pinned) and REMOTE_ROWS make the stores smaller (a quick look: 600, 600 and
# 2000).
set -u
OUT=${OUT:-benchmarks/results/node}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -d .whl ] && ! $PY -c "import zarr" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
# the package from this checkout, not installed: the scripts put it on sys.path themselves, a lesson does not
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
{
  echo "cpus: $(nproc)"
  $PY -c "import sys, torch, zarr, numcodecs; print(sys.version.split()[0], torch.__version__, zarr.__version__, numcodecs.__version__)"
} 2>&1 | tee "$OUT/versions.txt"
DATA=$(mktemp -d /tmp/zarrtorch-bench.XXXX)
STEPS=${STEPS:-workers lesson05 pinned}
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# the workers rule: windows/s trained on the GPU with 0 and 2 DataLoader workers (pin_memory, non_blocking copies)
want workers && timeout 150 $PY benchmarks/gpu_feed.py --rows "${FEED_ROWS:-4000}" --epochs 3 --workers 0 2 \
  --data-dir "$DATA" 2>&1 | tee "$OUT/gpu_feed.log"

# the course's tiny data, made here (the lesson and the training command read it)
tiny_data() {
  if ! [ -f data/tiny/.complete ] && $PY -c "import dask, h5netcdf" 2>/dev/null; then
    ZARRTORCH_SIZE=tiny timeout 120 $PY -c "from zarrtorch.course.synthetic import make_data; make_data('tiny', progress=False)" \
      2>&1 | tee "$OUT/tiny_data.log"
  fi
}

# lesson 05 on the GPU, cell by cell (its Trainer takes the GPU with accelerator="auto")
if want lesson05; then
  tiny_data
  if [ -f data/tiny/.complete ] && $PY -c "import lightning, matplotlib, xarray" 2>/dev/null; then
    ZARRTORCH_SIZE=tiny timeout 200 $PY benchmarks/run_lesson.py notebooks/05_training.ipynb \
      --out "$OUT/lesson05.json" 2>&1 | tee "$OUT/lesson05.log"
  else
    echo "lesson05 skipped: it needs the tiny data (dask and h5netcdf to make it) and lightning, matplotlib and xarray (see the header)" \
      | tee "$OUT/lesson05.log"
  fi
fi

# issue 43 item 7: host-to-device GB/s from the pinned slots (no copy on the host) against DataLoader's pin copy,
# pageable memory and the card's own rate; then the training step's wait for data with 0 and 2 workers
want pinned && timeout 150 $PY benchmarks/pinned_feed.py --rows "${FEED_ROWS:-4000}" --epochs 3 --workers 0 2 \
  --data-dir "$DATA" --out "$OUT/pinned_feed.json" 2>&1 | tee "$OUT/pinned_feed.log"

# the course's training command on the GPU: 2 epochs with 0 and 2 workers, then one epoch under torchrun (NCCL)
if want train; then
  tiny_data
  for w in 0 2; do
    ZARRTORCH_SIZE=tiny timeout 120 $PY -m zarrtorch.course.train --size tiny --epochs 2 --workers "$w" \
      --out "$DATA/train-w$w" 2>&1 | tail -5 | tee "$OUT/train_w$w.log"
  done
  ZARRTORCH_SIZE=tiny timeout 120 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m zarrtorch.course.train --size tiny --epochs 1 --workers 2 --out "$DATA/train-torchrun" 2>&1 | tail -5 \
    | tee "$OUT/train_torchrun.log"
fi

want copies && timeout 60 $PY benchmarks/pinned_feed.py --copy-sizes 2>&1 | tee "$OUT/copy_sizes.log"

# issue 24: rows/s at 0, 20 and 100 ms per request, 0 and 2 workers, with default settings; then a bare aiohttp
# client with 256 and 512 requests at once against the same servers: what the server gives, without the loader
want remote && timeout 270 $PY benchmarks/remote.py --rows "${REMOTE_ROWS:-100000}" --delay-ms 0 20 100 --in-flight --workers 0 2 --repeats 3 \
  --plain-client 256 512 --verbose --json "$OUT/remote.json" 2>&1 | tee "$OUT/remote.log"

# issue 24: reads handed out in order against a latency tail (no server): held = level against 2-4 x the level
want remote && timeout 100 $PY benchmarks/head_of_line.py --pieces 6000 --repeats 3 2>&1 | tee "$OUT/head_of_line.log"

# issue 25: windows/s against the decode limit, one-step and 16-step chunks, epochs of 20,000 steps
# and with 0 workers in 4 and 8 decode threads besides the default (the CPUs: does one process's GIL limit it?)
want windows && timeout 180 $PY benchmarks/windows.py --rows "${WINDOW_ROWS:-20000}" --chunks 1 16 --repeats 3 --blocks 16 --trade-steps 8760 \
  --decode-threads 4 8 --data-dir "$DATA" --out "$OUT/windows.json" 2>&1 | tee "$OUT/windows.log"

rm -rf "$DATA"
