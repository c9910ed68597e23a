# `make demo`: set up .venv and train the demo ViT on the bundled digits. `make test`: the test suite.
PYTHON ?= python3.11
VENV := .venv
WORKDIR ?= workdirs/demo

.PHONY: install install-tpu install-cuda demo test

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

# Two workers: most tests wait on compiles and subprocesses, so two cores run them 1.3x faster.
test: $(VENV)/.installed-test
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadgroup
