# make studio    : create or reuse .venv, install the project, open the studio on a bundled example
# make test      : same set-up, then the whole CPU test suite
# make gpu-test  : the GPU-marked tests, with only what the GPU image has (no installs)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
EXAMPLE ?= resources/examples/mlp_block.py

.PHONY: venv studio test gpu-test clean

venv: $(STAMP)

# torch is pinned to the CPU build that lies on this machine's disk; an unpinned torch pulls CUDA.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[studio,test,cluster]"
	touch $(STAMP)

studio: $(STAMP)
	$(VENV)/bin/stitchcuda studio $(EXAMPLE)

# two pytest-xdist workers: CI has two cores, and the export builds take minutes of one
test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -p no:cacheprovider -n 2 --durations=15

gpu-test:
	PYTHONPATH=. python3 -m pytest -q -p no:cacheprovider -m gpu

clean:
	rm -rf $(VENV) test-output .pytest_cache
