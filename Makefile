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

.PHONY: help venv book test lint unit notebooks book-strict serve clean

help:
	@echo "make book   - set up .venv, execute every chapter and build the website into _build/html"
	@echo "make test   - lint, unit tests, every chapter with nbmake, the website with warnings as errors"
	@echo "make serve  - serve _build/html on http://127.0.0.1:8000"

$(BIN)/.installed: pyproject.toml requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -r requirements.txt -e .
	touch $@

venv: $(BIN)/.installed

book: venv
	$(BIN)/jupyter-book build .

test: lint unit notebooks book-strict

lint: venv
	$(BIN)/ruff check src tests benchmarks book
	$(BIN)/nbstripout --verify --keep-id $(wildcard book/*.ipynb)

unit: venv
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) tests

notebooks: venv
	ATTNBOOK_FAST=1 $(BIN)/pytest -q -n $(PYTEST_WORKERS) --nbmake --nbmake-timeout=600 $(CHAPTERS)

book-strict: venv
	ATTNBOOK_FAST=1 $(BIN)/jupyter-book build . --all --warningiserror --keep-going

serve:
	@test -d _build/html || { echo "no _build/html yet: run 'make book' first"; exit 1; }
	$(BIN)/python -m http.server 8000 --bind 127.0.0.1 --directory _build/html

clean:
	rm -rf _build
