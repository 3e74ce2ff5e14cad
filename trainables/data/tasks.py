"""Prompt sets of a trial: the built-in task's splits, encoded once with the policy's chat template."""

from __future__ import annotations

from trainables.config import TaskConfig
from trainables.data.arithmetic import Problem, make_splits, prompt_messages


def load_task(cfg: TaskConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, validation) problems, disjoint, deterministic from the seed."""
    return make_splits(seed, cfg.levels, train_size=cfg.train_size, val_size=cfg.val_size)


def encode_prompt(tokenizer, problem: Problem) -> list[int]:
    """Token ids of the chat prompt, ending where the assistant starts to write."""
    ids = tokenizer.apply_chat_template(prompt_messages(problem), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in some versions
        ids = ids["input_ids"]
    return list(ids)
