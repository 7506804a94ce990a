# fairshare developer entry points. `make install && make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OPENB ?= $(firstword $(wildcard ../shared/data/openb) $(wildcard $(HOME)/openb))

.PHONY: install build test test-pure test-unit lint docs docs-check demo bench bench-quality bench-kernels bench-cluster bench-gangs \
        soak cluster-bins clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -c "import _native; print('fairshare kernels:', _native.IMPLEMENTATION)"
	-bash tools/install-chromium.sh
	touch $@

# Recompile the Cython kernels in place after editing a .pyx.
build: install
	$(PY) setup.py build_ext --inplace --quiet

# The tests need the control-plane binaries, promtool and helm: build them (seconds when
# cached). Strict by default (FAIRSHARE_STRICT=1): a tool that cannot be built fails here,
# naming it, and no test may skip for want of it. `make test STRICT=0` (a machine without
# Go): the build failures are warnings and those tests skip saying why.
STRICT ?= 1
test: export FAIRSHARE_STRICT := $(STRICT)
test: install build lint docs-check
	bash tools/build-test-tools.sh
	@echo "== pure-Python kernel twins (FAIRSHARE_NO_EXTENSIONS=1): native + unit suites"
	FAIRSHARE_NO_EXTENSIONS=1 $(PY) -m pytest tests/native tests/unit -q
	@echo "== the whole suite on the compiled kernels (e2e last)"
	$(PY) -m pytest --durations=10

test-pure: install
	FAIRSHARE_NO_EXTENSIONS=1 $(PY) -m pytest -q

test-unit: install build
	$(PY) -m pytest tests/unit tests/native -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy fairshare _native
	$(VENV)/bin/mypy --strict webhook extender serving fairshare_cli
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs-material; mkdocs.yml, pages under docs/), built into
# site/ (git-ignored). --strict: a broken link or anchor, a page missing from the nav or a
# nav entry without its page fails the build. `make docs` first regenerates
# docs/config-reference.md from the config schema (tests/unit/test_docs.py fails while the
# checked-in copy is stale); `make docs-check` is the build alone, as `make test` runs it.
# While editing: $(VENV)/bin/mkdocs serve (http://127.0.0.1:8000).
SITE_DIR ?= site
docs: install
	$(PY) -m fairshare.config.reference > docs/config-reference.md.tmp
	mv docs/config-reference.md.tmp docs/config-reference.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(SITE_DIR)
	@echo "docs: site built in $(SITE_DIR)/"

docs-check: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(SITE_DIR)

demo: install build
	$(VENV)/bin/fairshare simulate --demo

# All benchmarks in one run (kernels, servers, memory, gangs, the real control plane);
# figures only.
# The [bench] extra brings py-spy for `bench-cluster PROFILE=1`.
bench: install build
	-$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m tests.bench

# The real control plane alone: default profile / fairshare / HAMi's extender (built from
# its sources, cached in ~/.cache/fairshare/hami-scheduler), the per-pod budget, admission.
# NODES=5000, PODS=..., REPS=..., QUICK=1, PROFILE=1 (CPU profiles during a fairshare round).
bench-cluster: install build
	-$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m tests.bench.bench_cluster $(if $(QUICK),--quick) $(if $(NODES),--nodes $(NODES)) \
	  $(if $(PODS),--pods $(PODS)) $(if $(REPS),--reps $(REPS)) $(if $(PROFILE),--profile)

bench-kernels: install build
	$(PY) -m tests.bench.bench_kernels

# The extender's verbs for the members of a 64-pod group at 1,000 nodes (in process).
bench-gangs: install build
	$(PY) -m tests.bench.bench_gangs $(if $(QUICK),--quick)

# The webhook soak at a steady load for 10 minutes (bounded; loopback only).
soak: install build
	SOAK_SECONDS=600 $(PY) -m pytest tests/reliability/test_soak.py -q -s

# openb: 11 pod lists x 3 policies x 10 seeds, plus the fairness-at-saturation runs.
# matplotlib (the [bench] extra) draws the PNG; without it only the tables are written.
# QUICK=1: --quick, 3 pod lists (default, gpuspec20, multigpu20) x 3 seeds, for development.
# Runs are spread over all cores (--workers). RUNS_DIR=DIR keeps each finished run there and
# reuses those already there (resume a cut-off run); empty it when the simulator changes.
bench-quality: install build
	-$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m tests.bench.bench_quality --trace "$(OPENB)" $(if $(QUICK),--quick) \
	  $(if $(RUNS_DIR),--runs-dir "$(RUNS_DIR)")

cluster-bins:
	bash tools/e2e/build-bins.sh

include tools/e2e/e2e.mk
-include tools/make/ship.mk

clean:
	rm -rf build _native/*.c _native/*.so *.egg-info
