# Two commands do everything on a fresh machine:
#   make demo   installs, then runs the demo benchmark against the bundled reference server
#   make test   installs (with the test extras), then runs the project's own tests
#   make lint   ruff (style, imports, bug-prone patterns) and mypy (strict for core/ and engine/)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs dist install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

# The compatibility matrix (tests/plugin/test_compat.py) runs these third-party pytest plugins
# next to the plugin, from a folder of their own (PYTHONPATH=$(COMPAT_DIR) in its subprocesses):
# installed into the venv, pytest-sugar, pytest-randomly and the others would change every
# pytester run of the project's own tests. --no-deps keeps the venv's pytest the only pytest;
# the plugins' other dependencies are pinned here with them.
COMPAT_DIR := .compat-plugins
COMPAT_PLUGINS := pytest-rerunfailures==16.7 pytest-json-report==1.5.0 pytest-metadata==3.1.1 \
	pytest-html==4.2.0 jinja2==3.1.6 markupsafe==3.0.4 pytest-timeout==2.4.0 pytest-randomly==5.1.0 \
	pytest-sugar==1.1.1 termcolor==3.3.0 pytest-cov==7.1.0 coverage==7.17.5 pytest-repeat==0.9.4 \
	pytest-benchmark==5.3.1 py-cpuinfo2==10.1.1

# The tests need One-D-Piece's torch + torchvision + timm (the pair this machine serves from
# local disk), the test extra (an independent HTTP client for the reference server's tests),
# the compatibility matrix's plugins, mkdocs (the docs extra: tests/test_docs.py builds the site),
# the dist extra (tests/test_wheel.py) and the trackers (tests/report/test_trackers.py logs to
# MLflow's SQLite store and W&B's offline mode).
install-test: install
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[onedpiece,test,docs,dist,mlflow,wandb]'
	rm -rf $(COMPAT_DIR)
	$(BIN)/pip install -q --no-deps --target $(COMPAT_DIR) $(COMPAT_PLUGINS)

demo: install
	$(BIN)/pytest benchmarks -k demo --servers builtin --recon jpeg:quality=10 -q

# Two xdist workers, a test file each at a time (--dist loadfile: a module's fixtures, such as
# the compatibility matrix's runs, are built once): most tests wait on servers and subprocesses,
# so on 2 cores the suite takes 9.6 min instead of 18-21 (2026-12-02, docs/development.md).
test: install-test
	$(BIN)/pytest -q -n 2 --dist loadfile

# The documentation site (mkdocs.yml, docs/) into build/site/; --strict fails on a broken link.
docs: install
	$(BIN)/pip install -q -e '.[docs]'
	$(BIN)/mkdocs build --strict

# The release files into dist/: the sdist and the wheel (python -m build), then twine's check of
# their metadata (the README as PyPI shows it). tests/test_wheel.py installs such a wheel into a
# clean venv and runs the demo, satbench-server and the CLIs from it.
dist: install
	$(BIN)/pip install -q -e '.[dist]'
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

# Lint: ruff and mypy, pinned (a new release adds rules and checks: bump them here, on purpose).
# Their settings are pyproject.toml's [tool.ruff] and [tool.mypy]; .ci/run runs this before the tests,
# and .pre-commit-config.yaml runs the same two from the venv. mypy reads the packages the code
# imports (torch for the One-D-Piece codec), hence the test install.
LINT_TOOLS := ruff==0.17.6 mypy==2.4.1

lint: install-test
	$(BIN)/pip install -q $(LINT_TOOLS)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/.pytest_cache reports/*/ $(COMPAT_DIR) build/site dist .mypy_cache .ruff_cache
