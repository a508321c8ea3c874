# `make test` on a fresh machine: create .venv, install the pinned versions, run the suite.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED := 0
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install test demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, so no resolver step can reach for a multi-GB CUDA build.
	$(PY) -m pip install --quiet -c constraints.txt torch
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	# DeepSpeed (the deepspeed extra) is a source distribution that imports torch to build: build it
	# against the torch above (--no-build-isolation), with no CUDA ops (DS_BUILD_OPS=0) but the CPU
	# shared-memory comm op compiled now, or DeepSpeed compiles it on first use in every fresh
	# environment. --no-cache-dir: a wheel cached from a build with other DS_BUILD_* flags would be reused.
	DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(PY) -m pip install --quiet --no-cache-dir --no-build-isolation -c constraints.txt deepspeed
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

demo: $(STAMP)
	$(PY) examples/pipeline_demo.py $(CURDIR)/demo_results

bench: $(STAMP)
	$(PY) -m benchmarks.bench $(BENCH_ARGS)

# flowtrain vs ray.train from 2 to 64 workers, one node and several (benchmarks/scale.py);
# e.g. make bench-scale BENCH_ARGS="--workers 2 4 --topologies single multi --quick"
.PHONY: bench-scale
bench-scale: $(STAMP)
	$(PY) -m benchmarks.scale $(BENCH_ARGS)

# Faults at seeded random points of real runs, invariants checked after each (benchmarks/chaos.py);
# e.g. make chaos CHAOS_ARGS="--faults 300 --seed 7 --out benchmarks/results/chaos-$$(date +%F)"
CHAOS_ARGS ?= --faults 30 --seed 1
.PHONY: chaos
chaos: $(STAMP)
	$(PY) -m benchmarks.chaos $(CHAOS_ARGS)
