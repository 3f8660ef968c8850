# memplan: two commands on a fresh machine -- `make demo`, `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.memplan-setup
# The CPU build of torch is pinned first: on these machines this exact version
# installs from local disk; any other request pulls a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

# The zoo models (torchvision, transformers) need a torchvision that matches
# torch; PyPI's torchvision does not import beside the 2.13.0 pin, so the
# shipped traces are regenerated in a separate venv with torch 2.14.1 +
# torchvision 0.29.1 (both on local disk here) and transformers from PyPI.
ZOO_VENV  := .venv-zoo
ZOO_PY    := $(ZOO_VENV)/bin/python
ZOO_STAMP := $(ZOO_VENV)/.memplan-setup
ZOO_PINS  := torch==2.14.1 torchvision==0.29.1

.PHONY: setup demo test test-slow lint traces bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/memplan compare zoo:resnet50 --gpu rtx-a6000 --budget 60% --fallback dtr --planners all --option squeeze.time_limit_s=10 --out report/

# The suite runs on TEST_WORKERS processes (pytest-xdist): 2, the cores of
# the machines it is sized for; `make test TEST_WORKERS=0` runs it in one
# process, without workers. The checks marked slow (long randomized runs,
# the whole shipped regression suite, ray, the installed wheel) are left to
# `make test-slow`, which `make test` and CI do not run.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest -q -m "not cuda and not slow" -n $(TEST_WORKERS) tests

test-slow: setup
	$(PY) -m pytest -q -m "slow and not cuda" -n $(TEST_WORKERS) tests

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

$(ZOO_STAMP): pyproject.toml
	test -x $(ZOO_PY) || $(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_PY) -m pip install -q $(ZOO_PINS)
	$(ZOO_PY) -m pip install -q -e '.[zoo,bo]'
	touch $(ZOO_STAMP)

traces: $(ZOO_STAMP)
	$(ZOO_PY) -m memplan.traces.regenerate --out traces/data

bench: setup
	status=0; for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || status=1; done; exit $$status

clean:
	rm -rf $(VENV) $(ZOO_VENV) report build *.egg-info
