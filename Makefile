# `make test` on a fresh machine: create .venv, install the pinned versions, run the suite.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export RAY_USAGE_STATS_ENABLED := 0
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
# Material for MkDocs prints a banner about its successor on every build.
export NO_MKDOCS_2_WARNING := 1
# Python writes the bytecode of what it imports (.pyc, in the venv) for the next process to read.
# This machine's environment, like CI's, turns that off (PYTHONDONTWRITEBYTECODE=1), and the
# install compiles none (below): then every process compiled torch, sympy, Ray and Prefect from
# source again, about 5 s of CPU more per Ray worker, and the suite starts hundreds. Off for what
# make runs: tests/test_replace_ranks.py took 176 s with it set, 83 s on a fresh venv (its first
# imports writing the bytecode) and 72 s after (2026-11-29, 2 cores).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install test test-quick demo bench clean docs lint

install: $(STAMP)

# Cold (a fresh venv, empty pip, uv and DeepSpeed-wheel caches) on 2 shared cores, 2026-11-28:
# 5 min 52 s with the recipe before issue 49 (torch 33 s, the project and its extras 170 s,
# DeepSpeed 143 s), 3 min 25 s as below with the machine twice as loaded; 33 s with the caches
# warm. Step by step in benchmarks/README.md, "How long `make install` takes".
#
# The project and its extras install with uv, pinned and put into the venv by pip: it fetches and
# unpacks in parallel and compiles no .pyc (the project step 33-70 s; pip 170 s, 68 s with --no-compile).
# INSTALLER=pip installs with pip alone, as does a machine where uv cannot be had.
INSTALLER ?= uv
UV_VERSION ?= 0.13.9
INSTALL = $$(test "$(INSTALLER)" = uv -a -x $(VENV)/bin/uv && echo "$(VENV)/bin/uv pip install --python $(PY)" || echo "$(PY) -m pip install --no-compile")
# DeepSpeed wheels built here, one folder per DeepSpeed version, torch version, Python and machine,
# shared by every venv of this user: a fresh venv installs in seconds what the first one compiled.
DS_WHEELS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/flowtrain/deepspeed-wheels

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, with pip, so no resolver step can reach for a multi-GB CUDA build: pip reads
	# this machine's configuration, which offers the CPU build (uv reads none of it, and would download
	# the CUDA build). uv then keeps the torch it finds installed, which satisfies the pin.
	# --no-compile: no .pyc for torch's 2,300 modules now (pip's byte-compiling was three quarters of
	# the step's CPU); Python writes one on a module's first import (see PYTHONDONTWRITEBYTECODE
	# above), as for what uv installs.
	$(PY) -m pip install --quiet --no-compile -c constraints.txt torch
	test "$(INSTALLER)" != uv || $(PY) -m pip install --quiet 'uv==$(UV_VERSION)' || echo "uv could not be installed: pip installs all" >&2
	$(INSTALL) --quiet -c constraints.txt -e '.[test,docs,lint]'
	# DeepSpeed (the deepspeed extra) is a source distribution that imports torch to build: build it
	# against the torch above (--no-build-isolation), with no CUDA ops (DS_BUILD_OPS=0) but the CPU
	# shared-memory comm op compiled now, or DeepSpeed compiles it on first use in every fresh venv
	# (40 s, inside the first test's workers). Built once into $(DS_WHEELS), never from pip's or uv's
	# caches (--no-cache-dir: those key a wheel by its source alone, not by the DS_BUILD_* flags).
	# The op compiles with ninja, both files at once (DS_ENABLE_NINJA), and without debug information
	# (CFLAGS=-g0: Python's own CFLAGS carry -g, a 15 MB library for 0.3 MB of code): the wheel builds
	# in 67 s where the install took 143 s, and is most of what a cold install still waits for.
	key=$$(sed -n 's/^deepspeed==//p' constraints.txt)-$$($(PY) -c 'import platform, sys, torch; print(f"torch{torch.__version__}-{sys.implementation.cache_tag}-{platform.machine()}")')-shm && \
	if ! ls $(DS_WHEELS)/$$key/deepspeed-*.whl >/dev/null 2>&1; then \
	  mkdir -p $(DS_WHEELS) && build=$$(mktemp -d $(DS_WHEELS)/.build-XXXXXX) && \
	  PATH=$(abspath $(VENV))/bin:$$PATH DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_ENABLE_NINJA=1 MAX_JOBS=$$(nproc) CFLAGS=-g0 \
	    $(PY) -m pip wheel --quiet --no-deps --no-cache-dir --no-build-isolation -w $$build -c constraints.txt deepspeed && \
	  { mv -T $$build $(DS_WHEELS)/$$key 2>/dev/null || rm -rf $$build; }; \
	fi && \
	$(INSTALL) --quiet -c constraints.txt $(DS_WHEELS)/$$key/deepspeed-*.whl
	touch $(STAMP)

# The 25 slowest tests are listed at the end so that what makes the suite slow stays in sight.
# Modules can run on two pytest-xdist workers (tests/conftest.py keeps a module on one worker and
# starts the longest first): make test PYTEST_ARGS='$(XDIST) --durations=25'. Not the default: on
# 2026-11-29 such a fresh-clone run was 56% through after 37 minutes (little ahead of one process:
# the suite is CPU-bound on two cores) and met an order dependency the one-process order never
# shows (fixed); three workers were no faster at all (benchmarks/README.md, "Where the test
# suite's CPU goes").
PYTEST_ARGS ?= --durations=25
# Two workers, a module's tests on one of them, the groups in tests/conftest.py's order (xdist's
# own reorder would put the modules with the most tests first, not the longest).
XDIST = -n 2 --dist loadgroup --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# The edit loop's tier: every module's quickest tests, by a recorded full run's seconds
# (tests/quick_tier.py, tests/durations.json), leaving out tests that need a fixture of their
# module's own when the module has others.
test-quick: $(STAMP)
	$(PY) -m pytest --quick $(XDIST) $(PYTEST_ARGS)

# Lint, formatting and types, as configured in pyproject.toml ([tool.ruff], [tool.mypy]); .ci/run
# and .pre-commit-config.yaml run the same. `$(VENV)/bin/ruff format .` fixes the formatting.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build site *.egg-info

# The documentation site (mkdocs.yml) into site/; --strict fails on a broken link or a missing reference.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

demo: $(STAMP)
	$(PY) examples/pipeline_demo.py $(CURDIR)/demo_results

bench: $(STAMP)
	$(PY) -m benchmarks.bench $(BENCH_ARGS)

# flowtrain vs ray.train from 2 to 64 workers, one node and several (benchmarks/scale.py);
# e.g. make bench-scale BENCH_ARGS="--workers 2 4 --topologies single multi --quick"
.PHONY: bench-scale
bench-scale: $(STAMP)
	$(PY) -m benchmarks.scale $(BENCH_ARGS)

# flowtrain's GPU paths on this machine's CUDA GPUs (benchmarks/gpu_check.py): use_gpu with nccl,
# placement, a checkpoint resumed after a SIGKILL, FSDP, AMP, DeepSpeed ZeRO-2, and throughput
# against raw torch and ray.train. Without a GPU it says so and exits 0. Not part of `make test`.
# e.g. make gpu-check GPU_CHECK_ARGS="--only nccl fsdp"
.PHONY: gpu-check gpu-carry
GPU_CHECK_OUT ?= $(CURDIR)/gpu_check_results
gpu-check: $(STAMP)
	$(PY) -m benchmarks.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# For a GPU machine with no package registry: pack Ray, DeepSpeed and their missing dependencies
# into .gpu_carry/site.tar.xz; there, `bash benchmarks/gpu_check.sh` unpacks it and runs the checks.
gpu-carry: $(STAMP)
	PY=$(PY) bash benchmarks/gpu_carry.sh .gpu_carry

# Faults at seeded random points of real runs, invariants checked after each (benchmarks/chaos.py);
# e.g. make chaos CHAOS_ARGS="--faults 300 --seed 7 --out benchmarks/results/chaos-$$(date +%F)"
CHAOS_ARGS ?= --faults 30 --seed 1
.PHONY: chaos
chaos: $(STAMP)
	$(PY) -m benchmarks.chaos $(CHAOS_ARGS)
