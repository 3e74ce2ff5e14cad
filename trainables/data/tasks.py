"""Prompt sets of a trial: the built-in task's splits, encoded once with the policy's chat template."""

from __future__ import annotations

from collections import Counter

from trainables.config import TaskConfig, TrialConfig
from trainables.data.arithmetic import Problem, make_splits, prompt_messages
from trainables.data.offline import OfflineStore, build_store, builtin_rows, read_rows


def load_task(cfg: TaskConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, validation) problems, disjoint, deterministic from the seed."""
    return make_splits(seed, cfg.levels, train_size=cfg.train_size, val_size=cfg.val_size)


def train_problems(cfg: TrialConfig) -> list[Problem]:
    """The trial's training prompts: the built-in task's train split, or the distinct questions of the
    offline files with their ground truths (the first task.train_size, in file order)."""
    if cfg.task.name == "arithmetic":
        return load_task(cfg.task, cfg.seed)[0]
    answers: dict[str, str] = {}
    for source in cfg.offline.files:
        for row in read_rows(source.path, source.columns)[0]:
            answers.setdefault(row["question"].strip(), row["answer"].strip())  # as the store keys them
    questions = list(answers)[: cfg.task.train_size]
    return [Problem(f"offline-{i}", question, answers[question], level=0) for i, question in enumerate(questions)]


def encode_prompt(tokenizer, problem: Problem) -> list[int]:
    """Token ids of the chat prompt, ending where the assistant starts to write."""
    ids = tokenizer.apply_chat_template(prompt_messages(problem), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in some versions
        ids = ids["input_ids"]
    return list(ids)


def load_offline_store(cfg: TrialConfig, tokenizer, train: list[Problem]) -> OfflineStore:
    """The trial's teacher trajectories: the built-in teachers on the train split, then any files,
    filtered by the policy-token cap and the verifier (`trainables.data.offline`)."""
    off = cfg.offline
    rows = builtin_rows(train, teachers=off.teachers, seed=cfg.seed, wrong_rate=off.wrong_rate,
                        overlong_rate=off.overlong_rate) if off.teachers else []
    skipped: Counter = Counter()
    for source in off.files:
        file_rows, file_skipped = read_rows(source.path, source.columns)
        rows += file_rows
        skipped += file_skipped

    def count_tokens(text: str) -> int:  # with the EOS the learner appends
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1

    return build_store(rows, count_tokens=count_tokens, max_tokens=cfg.offline_max_tokens, skipped=skipped)
