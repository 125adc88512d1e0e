# attnbook: `make book` builds the website, `make test` runs every check. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch is installed first so that the loose `torch>=2.2` requirement is already met
# (a plain `torch` would pull a multi-GB CUDA build). Override on a GPU machine: make book TORCH=torch
TORCH ?= torch==2.13.0
# Every chapter listed in the table of contents, in order.
CHAPTERS := $(shell grep -oE 'book/[0-9]+_[A-Za-z0-9_]+' _toc.yml | sed 's/$$/.ipynb/')
PYTEST_WORKERS ?= 2
# One thread per pytest worker: two workers with two threads each oversubscribe a 2-core machine.
PARALLEL := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

ASSETS := _build/site-assets/vendor

.PHONY: help venv assets book test lint unit notebooks book-strict browser colab serve clean

help:
	@echo "make book   - set up .venv, execute every chapter and build the website into _build/html"
	@echo "make test   - lint, unit tests, every chapter with nbmake, the website with warnings as errors"
	@echo "make serve  - serve _build/html on http://127.0.0.1:8000"
	@echo "make browser - the website's browser tests (needs a build and /usr/bin/chromium)"

$(BIN)/.installed: pyproject.toml requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -r requirements.txt -e .
	touch $@

venv: $(BIN)/.installed

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

test: lint unit notebooks book-strict browser colab frontend

lint: venv
	$(BIN)/ruff check src tests benchmarks book
	$(BIN)/nbstripout --verify --keep-id $(wildcard book/*.ipynb)

unit: venv
	$(PARALLEL) $(BIN)/pytest -q -n $(PYTEST_WORKERS) -m "not browser" tests

notebooks: venv
	$(PARALLEL) ATTNBOOK_FAST=1 $(BIN)/pytest -q -n $(PYTEST_WORKERS) --nbmake --nbmake-timeout=600 $(CHAPTERS)

book-strict: venv assets
	ATTNBOOK_FAST=1 $(BIN)/jupyter-book build . --all --warningiserror --keep-going

# The built site in Debian's chromium (Playwright), served on 127.0.0.1; screenshots in _build/screenshots.
browser: venv
	$(BIN)/pytest -q -m browser tests/browser

# A Colab-like environment (ipywidgets 7.7.1, torch already there), the install cell, one widget chapter.
colab: venv
	$(BIN)/python tests/colab/run_colab_path.py

# The explorers in real front-ends, clicked in chromium (tests/frontend): JupyterLab 4 and Notebook 7 with
# ipywidgets 8, the classic notebook 6.5 with ipywidgets 7.7.1 (Colab's). Their environments are built under
# _build/frontend-envs (from tests/frontend/requirements-*.txt, CPU torch first) and reused until those change;
# one pytest worker per front-end's server; the table of every action goes to _build/frontend-report/report.md.
.PHONY: frontend
frontend: venv
	$(BIN)/python tests/frontend/envs.py
	$(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/frontend

serve:
	@test -d _build/html || { echo "no _build/html yet: run 'make book' first"; exit 1; }
	$(BIN)/python -m http.server 8000 --bind 127.0.0.1 --directory _build/html

clean:
	rm -rf _build
