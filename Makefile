# runrelay — every command a developer or CI needs.
#
#   make demo   the main job: embedded PostgreSQL (unless DATABASE_URL), migrate, demo
#   make test   every test, on PostgreSQL 15 (system) and 18 (embedded wheel)
#   make docs   regenerate docs/errors.md and docs/sql-api.md
#   make chaos  the fault-injection scenarios, longer (DURATION=20m per scenario), with figures
#   make bench  the benchmark: floor, runrelay, peers, then the sharded install
#               (bench.scale_out; about 15 min in all; rewrites docs/benchmarks.md)
#               then the relay's delivery slots and the shipped loops
#   make bench-quick  the same at tiny sizes, a smoke test (also run by make test)

SHELL := /bin/bash
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
PY := $(BIN)/python
export PATH := $(BIN):$(PATH)

# Run a command against DATABASE_URL when set, else against a throwaway cluster.
WITH_PG = $(if $(DATABASE_URL),,$(PY) -m runrelay._pgcluster exec --flavor $(1) --)

.PHONY: demo test test-pg15 test-pg18 test-ts prereqs lint typecheck freeze migrate docs clean chaos bench bench-quick

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# runrelay demo migrates DATABASE_URL, or starts an embedded PostgreSQL without one.
demo: $(VENV)/.installed
	runrelay demo $(DEMO_ARGS)

# The two legs run side by side (scripts/test_legs.sh says why and how).
test: $(VENV)/.installed prereqs
	bash scripts/test_legs.sh

prereqs:
	bash scripts/ensure_prereqs.sh

# Every part of scripts/test_suite.sh on PostgreSQL 15; PG15_PARTS picks some,
# PG15_MARKS the tests (make test leaves the `package` ones to PostgreSQL 18).
PG15_PARTS ?= all
test-pg15: $(VENV)/.installed prereqs
	$(call WITH_PG,system) bash scripts/test_suite.sh $(PG15_PARTS) $(PG15_MARKS) $(PYTEST_ARGS)

# The TypeScript client's suite (clients/typescript): npm packages from its
# lock file into its node_modules, then Node's test runner. `make test` runs it
# inside the PostgreSQL 18 leg.
test-ts: $(VENV)/.installed
	$(call WITH_PG,system) bash scripts/test_ts.sh

# The pytest suite again on PostgreSQL 18 (embedded wheel), always a fresh cluster.
# The sharded suites start servers of their own from the system PostgreSQL
# (PL/Proxy has no build for the embedded one), so the PostgreSQL 15 leg runs them.
PG18_PARTS ?= migrations,pytest
test-pg18: $(VENV)/.installed
	$(PY) -m runrelay._pgcluster exec --flavor embedded -- \
		env -u PGDATABASE bash scripts/test_suite.sh $(PG18_PARTS) -m 'not sharded' $(PYTEST_ARGS)

lint: $(VENV)/.installed
	ruff check python_client migrations tests devtools scripts bench
	ruff format --check python_client migrations tests devtools scripts bench
	mypy

freeze: $(VENV)/.installed
	$(PY) -m devtools.sqlsource freeze

migrate: $(VENV)/.installed
	alembic upgrade head

# Regenerate docs/errors.md (from runrelay.errors), docs/sql-api.md and the
# client's SQL API table, python_client/runrelay/sql_api.json (both from a
# database migrated to head), and the TypeScript client's generated half
# (clients/typescript/src/generated, from that table); tests/python/test_docs.py,
# test_sql_api.py and test_typescript_api.py fail when they are stale.
docs: $(VENV)/.installed
	$(call WITH_PG,system) bash -c 'alembic upgrade head && $(PY) -m devtools.docs && $(PY) -m devtools.sqlapi && $(PY) -m devtools.tsapi'

# Benchmarks start their own durable PostgreSQL (fsync and synchronous_commit
# on), whatever DATABASE_URL says. The full run installs the peers (PyPI into
# bench/.venv-peers, PgQ from Debian); the quick one installs nothing. The full
# run then measures the sharded install (bench.scale_out: a proxy and shards of
# its own); its quick form is tests/python/test_bench_scale_out.py.
bench: $(VENV)/.installed
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.relay_concurrency
	$(PY) -m bench.shipped

bench-quick: $(VENV)/.installed
	$(PY) -m bench.run --quick $(BENCH_ARGS)
	$(PY) -m bench.shipped --quick

# The scenarios of tests/python/test_faults.py, each run for DURATION (seconds,
# or with an s/m suffix) with more connections, then a table of operations,
# faults injected and violations. Fails if any scenario does.
DURATION ?= 20m
CHAOS_REPORT ?= $(abspath .runrelay/chaos-report.jsonl)
chaos: $(VENV)/.installed
	mkdir -p $(dir $(CHAOS_REPORT)) && rm -f $(CHAOS_REPORT)
	$(call WITH_PG,system) env RUNRELAY_CHAOS_SECONDS=$(DURATION) \
		RUNRELAY_CHAOS_REPORT=$(CHAOS_REPORT) \
		bash -c 'pytest -q -o timeout=0 tests/python/test_faults.py $(PYTEST_ARGS); status=$$?; \
			$(PY) tests/python/faults.py report $(CHAOS_REPORT); exit $$status'

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench/.venv-peers
