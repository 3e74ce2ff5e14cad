"""The embedded default policy's warm start: what it imitates, and the base it leaves."""

import random

from trainables.data.arithmetic import TEACHERS, make_splits, teacher_solution
from trainables.data.bootstrap import unbox
from trainables.rewards.verify import verify_response


def test_unboxed_solutions_keep_the_answer_but_fail_the_format():
    problems, _ = make_splits(3, [1, 2, 3, 4], train_size=12, val_size=0)
    rng = random.Random(0)
    for problem in problems:
        for teacher in TEACHERS:
            solution, _ = teacher_solution(teacher, problem, rng, wrong_rate=0.0, overlong_rate=0.0)
            plain = unbox(solution)
            assert verify_response(solution, problem.answer).reason == "correct"
            assert verify_response(plain, problem.answer).reason == "no_boxed"
            assert "\\boxed" not in plain and plain.rstrip(".").endswith(problem.answer)


def test_config_overrides_make_a_cached_copy_with_the_same_weights(tiny_model_path, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainables.config import ModelConfig
    from trainables.data.models import resolve_model_path

    # A transformers 5 config nests the RoPE base; the override sets it and keeps its sibling keys.
    overrides = {"rope_parameters": {"rope_theta": 40000.0}, "max_position_embeddings": 16384}
    model_cfg = ModelConfig(path=str(tiny_model_path), config_overrides=overrides)
    folder = resolve_model_path(model_cfg, tmp_path)
    assert folder != tiny_model_path and resolve_model_path(model_cfg, tmp_path) == folder  # built once
    config = AutoConfig.from_pretrained(folder)
    assert config.max_position_embeddings == 16384
    assert config.rope_parameters == {"rope_theta": 40000.0, "rope_type": "default"}
    original, copy = (AutoModelForCausalLM.from_pretrained(f) for f in (tiny_model_path, folder))
    assert all(torch.equal(a, b) for a, b in zip(original.state_dict().values(), copy.state_dict().values()))
    assert (folder / "model.safetensors").is_symlink()  # the weights are not copied
