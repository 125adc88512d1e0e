# attnbook: `make book` builds the website, `make test` runs every check. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The one torch pin. The CPU build is installed first so that the loose `torch>=2.2` requirement is already met
# (a plain `torch` would pull a multi-GB CUDA build). Override on a GPU machine: make book TORCH=torch
TORCH ?= torch==2.13.0
# The exact versions of everything else the tests passed with (Python 3.11, CPU); `make lock` rewrites it.
LOCK := requirements.lock
# timm for the test that builds a VisionTransformer with MoHAttention, without its requirements: its torchvision
# would be a CUDA build that does not load beside the CPU torch (tests/timm_stub.py stands in for it).
TIMM := timm==1.0.31
# Every chapter listed in the table of contents, in order.
CHAPTERS := $(shell grep -oE 'book/[0-9]+_[A-Za-z0-9_]+' _toc.yml | sed 's/$$/.ipynb/')
PYTEST_WORKERS ?= 2
# One thread per pytest worker: two workers with two threads each oversubscribe a 2-core machine. The same for
# inductor's compiling (the compile tests): in the worker itself, not in a pool of processes per worker.
PARALLEL := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1
CHROMIUM := /usr/bin/chromium
# pip without byte-compiling what it installs: compiling torch and Jupyter took most of each install (torch
# alone: 37 s against 11 s here); modules compile when first imported.
PIP_INSTALL = pip install --quiet --no-compile

# Byte-code caches on: this machine's environment sets PYTHONDONTWRITEBYTECODE=1, and with pip's --no-compile
# nothing would ever be cached, so every process would compile every module it imports (import torch: 4.3 s
# against 2.4 s here). Each module is now compiled on first import and reused by every later process.
unexport PYTHONDONTWRITEBYTECODE

ASSETS := _build/site-assets/vendor
EXECUTED := _executed
DIST := _build/dist
# Held while chapters run under nbmake (make notebooks, the Colab path), so that their kernels start apart.
KERNELS_LOCK := _build/.kernels.lock
# Seconds a cell may take under nbmake (the Colab path reads it too). At CI size the longest cell takes about
# 20 s. It also bounds a stall seen once: chapter 2's widget cell replied at once, the next cell began 599 s
# later (the timeout was 600 s) and the chapter still passed, so make test took 18 minutes instead of 9
# (jupyter/nbclient#312 reports cells with widgets that block until a timeout).
NBMAKE_TIMEOUT ?= 120
export NBMAKE_TIMEOUT
WHEEL_VENV := _build/wheel-venv
# The package's tests; the book's own (notebook structure, prose numbers, website, front-ends) run in .venv.
BOOK_TESTS := tests/test_notebooks.py tests/test_prose_numbers.py tests/browser tests/frontend
# The compile tests run beside the unit tests, in .venv, as a chain of their own (see test-compile).
COMPILE_TESTS := tests/test_compile.py
PACKAGE_TESTS := $(foreach t,$(BOOK_TESTS) $(COMPILE_TESTS),--ignore=$(t))

.PHONY: help venv assets book test test-book test-frontends test-compile steps lint unit wheel wheel-test notebooks book-strict browser browser-after-site compile compile-after-notebooks colab serve lock clean

help:
	@echo "make book       - set up .venv, execute every chapter and build the website into _build/html"
	@echo "make test       - every check: lint, the unit tests against the built wheel, every chapter (executed"
	@echo "                  once, with nbmake), the website with warnings as errors, browser and front-end tests"
	@echo "make serve      - serve _build/html on http://127.0.0.1:8000"
	@echo "make unit       - the unit tests against the editable checkout (quick, while developing)"
	@echo "make lint       - ruff, ruff format, mypy --strict on the library, import-linter, and nbstripout"
	@echo "make lock       - record the exact versions of .venv in $(LOCK) (after a green make test)"

$(BIN)/.installed: pyproject.toml requirements.txt $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) "$(TORCH)"
	$(BIN)/$(PIP_INSTALL) -r $(LOCK)
	$(BIN)/$(PIP_INSTALL) --no-deps -e .
	@# timm's declared requirements are missing on purpose (see TIMM): pip check without it, then put it back
	$(BIN)/pip uninstall --quiet --yes timm 2>/dev/null || true
	$(BIN)/pip check
	@# after pip check: timm is installed without the requirements it declares (see TIMM)
	$(BIN)/$(PIP_INSTALL) --no-deps "$(TIMM)"
	touch $@

venv: $(BIN)/.installed

# The loose requirements (requirements.txt, pyproject.toml) resolved into exact versions, torch left to TORCH.
lock: venv
	$(BIN)/$(PIP_INSTALL) -r requirements.txt
	{ echo "# Exact versions the tests passed with (Python 3.11; torch itself comes from TORCH in the Makefile)."; \
	  echo "# Written by 'make lock' from requirements.txt and pyproject.toml: edit those, not this file."; \
	  $(BIN)/pip freeze --exclude-editable --exclude torch --exclude timm; } > $(LOCK)

# MathJax 3, require.js and the ipywidgets HTML manager come from the npm registry (versions locked in
# package-lock.json) and are served by the site itself: _config.yml copies _build/site-assets into the site
# root (html_extra_path), outside any _static/ folder, whose scripts Jupyter Book would inject everywhere.
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

$(ASSETS)/.copied: node_modules/.package-lock.json
	rm -rf $(ASSETS) && mkdir -p $(ASSETS)/widgets
	cp -r node_modules/mathjax/es5 $(ASSETS)/mathjax
	cp node_modules/requirejs/require.js $(ASSETS)/require.js
	cp node_modules/@jupyter-widgets/html-manager/dist/*-amd.js $(ASSETS)/widgets/
	find node_modules/@jupyter-widgets/html-manager/dist -regex '.*\.\(woff2?\|ttf\|eot\|svg\)' \
	  -exec cp {} $(ASSETS)/widgets/ \;
	touch $@

assets: $(ASSETS)/.copied

book: venv assets
	$(BIN)/jupyter-book build .

# make test: three setups side by side from the start (the venv's pip installs, the npm assets, and the pip
# installs of the front-end environments, which need no .venv: pip mostly keeps one core busy, so one setup
# alone left the other core idle), then three chains side by side, each as soon as its setups are done: the
# book's (lint, the chapters, the website, the unit tests against the wheel), the front-ends' (the Colab path,
# the explorers in JupyterLab and the classic notebook, the website's browser tests) and the compile tests'. On
# two cores they finish minutes before one after the other would. Each chain's log is printed whole when it ends
# (--output-sync), with the seconds every step took. The chains never build into the checkout at the same
# time: the front-end chain builds from private copies of the source (tests/frontend/envs.py: package_source).
test:
	@rm -f _build/html/.site-ready _build/.chain-failed _build/.notebooks-done
	@$(MAKE) --no-print-directory -j6 --output-sync=recurse test-book test-frontends test-compile
	@echo "make test: every check passed"

# The chapters run first, beside the Colab path (pip installs and widget tests, no Jupyter server), so that
# their timings are those of a chapter run, not of a machine shared with Jupyter servers. The unit tests (two
# workers) run last: when the other chain is done they keep both cores busy, where the browser tests (one
# browser) would leave one idle.
test-book: venv assets $(CHROMIUM)
	@$(MAKE) --no-print-directory -j1 STEPS="lint notebooks book-strict wheel-test" steps

# The website's browser tests run at the end of the front-end chain, as soon as book-strict has built the site
# (it is long built by then): on the book chain they kept the unit tests waiting, whose two workers then ran
# alone for seven minutes while the front-end chain was done (make test took 15 min 42 s).
test-frontends: venv frontend-setup $(CHROMIUM)
	@$(MAKE) --no-print-directory -j1 STEPS="frontend-envs colab frontend browser-after-site" steps

# The compile tests (inductor generates and builds C++: on a fresh machine its cache is empty, and its 23 cases
# took 623 s beside a two-worker job, about 100 s warm: most of the unit tests' time) run as a third chain, once
# the chapters have run (their timings are those of a chapter run), beside the unit tests against the wheel and
# the front-end chain, which leaves a core idle much of the time (make test used 1.4 of the 2 cores on average
# when they ran in the wheel's unit tests, and took 18 minutes with a cold cache).
test-compile: venv
	@$(MAKE) --no-print-directory -j1 STEPS="compile-after-notebooks" steps

compile-after-notebooks:
	@$(call wait_for,_build/.notebooks-done,compile: the chapters did not run)
	@$(MAKE) --no-print-directory compile

compile: venv
	$(PARALLEL) $(BIN)/pytest -q -n $(PYTEST_WORKERS) -p no:cacheprovider --durations=10 $(COMPILE_TESTS)

# $(call wait_for,FILE,MESSAGE): wait until another chain's step has written FILE (at most 15 minutes; at once
# when a chain failed), or stop with MESSAGE.
wait_for = for i in $$(seq 900); do [ -f $(1) ] || [ -f _build/.chain-failed ] && break; sleep 1; done; \
	[ -f $(1) ] || { echo "$(2)"; exit 1; }

steps:
	@for step in $(STEPS); do \
	  start=$$(date +%s); \
	  $(MAKE) --no-print-directory -j1 $$step || { echo "== make $$step failed after $$(( $$(date +%s) - start )) s"; \
	    mkdir -p _build && touch _build/.chain-failed; exit 1; }; \
	  echo "== make $$step: $$(( $$(date +%s) - start )) s"; \
	done

lint: venv
	$(BIN)/ruff check src tests benchmarks book
	$(BIN)/ruff format --check src tests benchmarks book
	$(BIN)/mypy
	$(BIN)/lint-imports  # the package's layers and no import cycle ([tool.importlinter] in pyproject.toml)
	$(BIN)/nbstripout --verify --keep-id $(wildcard book/*.ipynb)

unit: venv
	$(PARALLEL) $(BIN)/pytest -q -n $(PYTEST_WORKERS) -m "not browser" tests

# The wheel and the sdist, the wheel built from the sdist (so the sdist is known to be complete).
wheel: venv
	rm -rf $(DIST)
	$(BIN)/python -m build --outdir $(DIST) . > /dev/null
	@ls $(DIST)

# The unit tests against the wheel installed into a fresh venv (not editable): missing package data or a broken
# pyproject.toml fail here. tests/conftest.py checks that attnbook was imported from that venv.
wheel-test: wheel
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	@# torch: the front-end environments' CPU build through a .pth file when it is this pin, else installed here
	TORCH="$(TORCH)" $(WHEEL_VENV)/bin/python tests/frontend/envs.py --share-torch $(WHEEL_VENV) \
	  || $(WHEEL_VENV)/bin/$(PIP_INSTALL) "$(TORCH)"
	@# the wheel with the book's extra (the tests of attnbook.viz need it), and timm without its requirements;
	@# mypy for tests/test_typing.py, which type-checks a user's file against the installed wheel
	$(WHEEL_VENV)/bin/$(PIP_INSTALL) -c $(LOCK) "$$(ls $(DIST)/*.whl)[book]" pytest pytest-xdist hypothesis mypy
	$(WHEEL_VENV)/bin/$(PIP_INSTALL) --no-deps "$(TIMM)"
	ATTNBOOK_TEST_INSTALLED=1 $(PARALLEL) $(WHEEL_VENV)/bin/pytest -q -n $(PYTEST_WORKERS) -m "not browser" \
	  -p no:cacheprovider --durations=15 $(PACKAGE_TESTS) tests

# Each chapter is executed once per `make test`. nbmake runs copies of the chapters in $(EXECUTED) (one report
# per chapter) and writes their outputs into the copies; book-strict renders those copies without executing
# anything again. (`make book` executes the chapters itself, from book/.)
notebooks: venv assets
	rm -rf $(EXECUTED) && mkdir -p $(EXECUTED)/_build
	cp -r book _toc.yml $(EXECUTED)/
	sed 's/^  execute_notebooks: .*/  execute_notebooks: "off"  # executed by nbmake (make notebooks)/' _config.yml \
	  > $(EXECUTED)/_config.yml
	grep -q 'execute_notebooks: "off"' $(EXECUTED)/_config.yml
	ln -s ../../_build/site-assets $(EXECUTED)/_build/site-assets
	ln -s ../src $(EXECUTED)/src  # the chapters' literalinclude folds read ../src
	$(BIN)/pytest -q tests/test_notebooks.py tests/test_prose_numbers.py
	@# the kernels' lock: jupyter_client picks a kernel's TCP ports by probing for free ones, and a kernel that
	@# the Colab path starts at the same moment can take one first ("Address already in use")
	flock $(KERNELS_LOCK) env $(PARALLEL) ATTNBOOK_FAST=1 $(BIN)/pytest -q -n $(PYTEST_WORKERS) --nbmake --overwrite --nbmake-timeout=$(NBMAKE_TIMEOUT) \
	  $(addprefix $(EXECUTED)/,$(CHAPTERS))
	mkdir -p _build && touch _build/.notebooks-done

book-strict: venv assets
	@test -d $(EXECUTED)/book || { echo "book-strict renders the chapters executed by 'make notebooks': run it first"; exit 1; }
	rm -rf _build/html _build/jupyter_execute _build/.doctrees
	$(BIN)/jupyter-book build $(EXECUTED) --path-output . --all --warningiserror --keep-going
	touch _build/html/.site-ready

# Debian's chromium for the browser and front-end tests (Playwright cannot download browsers here): installed when
# this runs as root with apt-get, otherwise make stops and says what to install. `make test` installs it with the
# other setups, before either chain starts: when only `browser` asked for it, the front-end chain once reached
# its browser first, on a machine without chromium.
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null; \
	else \
	  echo "The browser tests need Debian's chromium at $(CHROMIUM). Install it with:"; \
	  echo "    sudo apt-get install chromium"; \
	  exit 1; \
	fi

# The built site in Debian's chromium (Playwright), served on 127.0.0.1; screenshots in _build/screenshots.
browser: venv $(CHROMIUM)
	$(BIN)/pytest -q -m browser tests/browser

# make test's browser step: waits for book-strict's site (at most 15 minutes; at once if the other chain failed).
browser-after-site:
	@$(call wait_for,_build/html/.site-ready,browser: no site built by book-strict)
	@$(MAKE) --no-print-directory browser

# A Colab-like environment (ipywidgets 7.7.1, torch already there), the install cell, one widget chapter.
colab: venv
	$(BIN)/python tests/colab/run_colab_path.py

# The explorers in real front-ends, clicked in chromium (tests/frontend): JupyterLab 4 and Notebook 7 with
# ipywidgets 8, the classic notebook 6.5 with ipywidgets 7.7.1 (Colab's). Their environments are built under
# _build/frontend-envs (from tests/frontend/requirements-*.txt, CPU torch first) and reused until those change;
# one pytest worker per front-end's server; the table of every action goes to _build/frontend-report/report.md.
.PHONY: frontend frontend-envs frontend-setup
frontend-envs: venv
	$(BIN)/python tests/frontend/envs.py

# The environments without the package (which needs .venv to build its wheel): `make test` runs this beside
# the setup of .venv, with the Python that builds .venv.
frontend-setup:
	$(PYTHON) tests/frontend/envs.py --no-package

frontend: frontend-envs $(CHROMIUM)
	$(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/frontend

serve:
	@test -d _build/html || { echo "no _build/html yet: run 'make book' first"; exit 1; }
	$(BIN)/python -m http.server 8000 --bind 127.0.0.1 --directory _build/html

clean:
	rm -rf _build $(EXECUTED)
