# llm-kernel-map — `make help` lists the targets.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
FIXTURE ?= fixtures/h200-llama3-8b-dense/trace.json.gz

.PHONY: help venv install demo test test-fast lint golden baselines bench clean cases

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python  ## install the tool (editable) into .venv
	$(BIN)/pip install -q -e .

demo: install  ## analyze a bundled real trace; writes reports/demo.json (+ reports/demo.html)
	@mkdir -p reports
	$(BIN)/llm-kernel-map analyze $(FIXTURE) --json reports/demo.json --html reports/demo.html

test: $(BIN)/python  ## install test dependencies (incl. headless Chromium, CPU torch) and run every test
	$(BIN)/pip install -q -e '.[test]'
	@# torch 2.13.0 is a local CPU build on machines of this kind; an unpinned torch would pull GBs
	@# transformers 5.17.0 is what the zoo was captured with; with CI=true a failed install fails the run
	$(BIN)/pip install -q torch==2.13.0 transformers==5.17.0 || { if [ "$$CI" = true ]; then echo "torch/transformers not installable (CI=true)"; exit 1; fi; echo "torch/transformers not installable: capture tests will skip"; }
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser tests will skip"
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

test-fast: install  ## tests without the browser ones
	$(BIN)/python -m pytest -m "not browser"

lint: install  ## ruff lint + format check
	$(BIN)/ruff check analyzer tests benchmarks
	$(BIN)/ruff format --check analyzer tests benchmarks

cases: install  ## re-cut the structure-rule cases of tests/cases/manifest.toml, then the derived ones
	$(BIN)/python tests/cases/regenerate.py
	$(BIN)/python tests/cases/derive.py

golden: install  ## regenerate the golden summaries under fixtures/*/expected
	$(BIN)/python -m pytest tests/test_golden.py --update-golden

BASELINE_FIXTURES ?= fixtures/h200-llama3-8b-dense fixtures/h200-qwen3-30b-a3b-moe fixtures/h200-tp2-llama3-8b-graph
baselines: install  ## regenerate fixtures/*/baseline.json (the gate's reference runs)
	for d in $(BASELINE_FIXTURES); do $(BIN)/llm-kernel-map baseline $$d -o $$d/baseline.json || exit 1; done

bench: install  ## measure speed and memory on scaled traces (see benchmarks/README.md)
	$(BIN)/python benchmarks/run.py

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
