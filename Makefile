# Two commands do everything on a fresh machine:
#   make demo   installs, then runs the demo benchmark against the bundled reference server
#   make test   installs (with the test extras), then runs the project's own tests
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

# The tests need One-D-Piece's torch + torchvision + timm (the pair this machine serves from
# local disk) and the test extra (an independent HTTP client for the reference server's tests).
install-test: install
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[onedpiece,test]'

demo: install
	$(BIN)/pytest benchmarks -k demo --servers builtin --recon jpeg:quality=10 -q

test: install-test
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/.pytest_cache reports/*/
