"""A trial checkpoint as a Hugging Face model folder: what `transformers` loads and vLLM serves.

The DeepSpeed engine state (any ZeRO stage) is gathered into one fp32 state dict, loaded into the
trial's base architecture and written with safetensors, its tokenizer and a generation config.
"""

from __future__ import annotations

from pathlib import Path

from trainables.runtime.checkpoint import TRIAL_STATE, TrialState, allow_deepspeed_records, load_engine, read_record


def checkpoint_model_path(checkpoint_dir: str | Path) -> str:
    """The base policy the checkpoint's trial started from."""
    return read_record(Path(checkpoint_dir) / TRIAL_STATE, TrialState).model_path


def export_policy(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the checkpoint's policy to `out_dir` (config, safetensors, tokenizer, generation config)."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    allow_deepspeed_records()
    base = checkpoint_model_path(checkpoint_dir)
    state = load_engine(
        lambda folder: get_fp32_state_dict_from_zero_checkpoint(str(folder), tag="engine"), checkpoint_dir
    )
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint_dir} does not match its base model {base}: "
            f"missing={missing[:3]} unexpected={unexpected[:3]}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.save_pretrained(out)
    generation = GenerationConfig.from_model_config(model.config)
    generation.eos_token_id, generation.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    generation.save_pretrained(out)
    return out
