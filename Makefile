# `make demo`: set up .venv and train the demo ViT on the bundled digits. `make test`: the fast tests;
# `make test-all`: every test (CI).
PYTHON ?= python3.11
VENV := .venv
WORKDIR ?= workdirs/demo

.PHONY: install install-tpu install-cuda demo lint test test-all

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.lock
	$(VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

install: $(VENV)/.installed

# The same environment with JAX for accelerators (TPU VMs; NVIDIA GPUs with CUDA 13).
install-tpu: install
	$(VENV)/bin/pip install --quiet "jax[tpu]==0.10.2"

install-cuda: install
	$(VENV)/bin/pip install --quiet "jax[cuda13]==0.10.2"

demo: install
	$(VENV)/bin/python -m vit_jax.main --config=configs/demo.py --workdir=$(WORKDIR)

$(VENV)/.installed-test: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e ".[test]"
	touch $@

$(VENV)/.installed-test-all: $(VENV)/.installed-test
	$(VENV)/bin/pip install --quiet -e ".[test-all]"
	touch $@

# Two workers: most tests wait on compiles and subprocesses, so two cores run them 1.3x faster.
PYTEST := $(VENV)/bin/python -m pytest -q -n 2 --dist loadgroup

# The style (pyproject.toml's ruff and pyink settings); `$(VENV)/bin/pyink .` formats.
lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/pyink --check --quiet .

# The fast tier: the style, then every test not marked slow (tests/conftest.py marks tests/e2e and
# *_vs_torch.py slow). Its tests compile hundreds of tiny programs and run each a few steps, so
# compiling is most of their time: LLVM's optimisations are off (-O0: 1002 s -> 755 s on a 2-core
# Zen 3), and XLA's CPU backend emits fusions by its loop emitters, not the MLIR fusion emitters,
# which take longer to compile (523 s -> 458 s on a 2-core Zen 4; 988 s -> 782 s of test time). The
# same XLA semantics; the slow tier's trainings keep the defaults: -O0 runs the demo 1.7x slower.
FAST_TIER_XLA_FLAGS := --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false
test: lint
	XLA_FLAGS="$(FAST_TIER_XLA_FLAGS) $$XLA_FLAGS" $(PYTEST) -m "not slow"

# Everything: the fast tier, then the slow one (end-to-end runs, the torch-based comparisons).
test-all: test $(VENV)/.installed-test-all
	$(PYTEST) -m slow
