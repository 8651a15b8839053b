# The course's commands. SIZE selects the generated dataset for the whole course: tiny | small | workshop.
SIZE ?= small
PY := $(shell bash scripts/python.sh)
export ZARRTORCH_SIZE := $(SIZE)
# Python caches the package's compiled modules (__pycache__, ignored by git). A machine that sets
# PYTHONDONTWRITEBYTECODE (CI's does) would otherwise compile them again in each of the test suite's ~1,300
# processes: 0.4 s of CPU each for `import zarrtorch` from a clean clone, minutes of a 2-core run
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup data course test test-fast notebooks-check fuzz lint fmt lab bench bench-peers slides clean-data hub-rehearsal

setup:
	@bash scripts/setup.sh

data: setup
	$(PY) -m zarrtorch make-data --size $(SIZE)

## (a) set up, generate the data, execute every notebook in order, print times
course: setup
	$(PY) scripts/run_course.py --size $(SIZE)

## (b) the tests: lint, package tests + every notebook under nbval (on the tiny data), in TEST_PROCS processes
## (pytest-xdist; --dist loadfile keeps a notebook's cells, and a test file, in one process, in order). Three on
## CI's 2 cores: two kept the cores busy 1.55 of 2 on average, the rest waiting on subprocesses, servers and sleeps.
## A test (or notebook cell) still running after TEST_TIMEOUT seconds fails with every thread's stack: a hang is
## a failure that says where, never a CI run that stops at its limit (the slowest test takes about a minute)
TEST_PROCS ?= 3
TEST_TIMEOUT ?= 600
# how nbval runs the notebooks (in this environment's kernel, outputs compared after notebooks/sanitize.cfg)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg
test: setup lint
	@bash scripts/install_browser.sh
	ZARRTORCH_SIZE=tiny $(PY) -m zarrtorch make-data --size tiny --no-progress
	ZARRTORCH_SIZE=tiny $(PY) -m pytest tests notebooks $(NBVAL) --durations=15 \
		-n $(TEST_PROCS) --dist loadfile --timeout $(TEST_TIMEOUT) $(PYTEST_ARGS)

## the notebooks under nbval, each exercise's solution run after its check, on data/$(SIZE): the committed outputs
## come from small, and CI checks them (and the solutions) on tiny only; this checks them at the size a learner uses
notebooks-check: setup
	$(PY) -m zarrtorch make-data --size $(SIZE) --no-progress
	$(PY) -m pytest notebooks $(NBVAL) -n $(TEST_PROCS) --dist loadfile --timeout $(TEST_TIMEOUT) $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## the loader against its reference model, many more random call sequences than CI runs (FUZZ=examples)
FUZZ ?= 400
fuzz: setup
	ZARRTORCH_FUZZ_EXAMPLES=$(FUZZ) $(PY) -m pytest tests/core/behaviour/test_model.py -p no:randomly --hypothesis-show-statistics $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest tests -m "not slow" $(PYTEST_ARGS)

## JupyterLab's terminals inherit its PATH: the environment's commands first, so a lesson's `torchrun ...` and
## `python -m zarrtorch ...` run in the course's environment without activating it
lab: setup
	$(PY) -m zarrtorch make-data --size $(SIZE)
	PATH="$(abspath $(dir $(PY))):$$PATH" $(PY) -m jupyter lab notebooks/00_index.ipynb

## every benchmark in one run: the loader table, a plan's and a resume's cost at scale, requests in flight vs latency,
## the node-local chunk cache (cold and warm epochs over HTTP), forecast windows (reads per chunk, windows/s, block
## length), store layouts (zarr's path vs the direct decode), two stores mixed (MixedLoader) vs one store of the same bytes
bench: setup
	$(PY) benchmarks/run.py $(BENCH_ARGS)
	$(PY) benchmarks/scale.py
	$(PY) benchmarks/resume_first_batch.py
	$(PY) benchmarks/remote.py
	$(PY) benchmarks/cache.py
	$(PY) benchmarks/head_of_line.py
	$(PY) benchmarks/windows.py --figure benchmarks/windows.png
	$(PY) benchmarks/layouts.py
	$(PY) benchmarks/mix.py

## zarrtorch against the loaders its users would pick instead (LitData, MosaicML Streaming, xbatcher, torchdata,
## Grain, anemoi-datasets, zarr-torch-dataset): each peer in its own environment under .peers/, built on first use
## then the reference page docs/peers.md and its figure, generated from the run's JSON (benchmarks/peers.json)
bench-peers: setup
	$(PY) benchmarks/peers/run.py --md benchmarks/peers.md $(PEERS_ARGS)
	$(PY) -m zarrtorch.course.peers_table --md docs/peers.md --png docs/peers.png

## rehearse the day on a hub (needs root and cgroup v1): KERNELS kernels at once, each limited to 2 GiB and 1 CPU,
## reading one read-only copy of data/$(SIZE); PER_KERNEL lessons each (empty: all of 01-07); report in docs/hub-rehearsal.md
KERNELS ?= 6
PER_KERNEL ?=
hub-rehearsal: setup
	$(PY) -m zarrtorch make-data --size $(SIZE) --no-progress
	$(PY) scripts/hub_rehearsal.py --kernels $(KERNELS) --size $(SIZE) $(if $(PER_KERNEL),--per-kernel $(PER_KERNEL)) \
		--json docs/hub-rehearsal.json --md docs/hub-rehearsal.md $(HUB_ARGS)

slides: setup
	$(PY) slides/build.py

clean-data:
	rm -rf data/tiny data/small data/workshop
