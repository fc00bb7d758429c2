# Two commands do everything on a fresh machine:
#   make demo   installs, then runs the demo benchmark against the bundled reference server
#   make test   installs (with the test extras), then runs the project's own tests
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-torch clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

# One-D-Piece needs torch + torchvision + timm: the pair this machine serves from local disk.
install-torch: install
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[onedpiece]'

demo: install
	$(BIN)/pytest benchmarks -k demo --servers builtin --recon jpeg:quality=10 -q

test: install-torch
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/.pytest_cache reports/*/
