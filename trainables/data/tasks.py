"""Prompt sets of a trial: the built-in task's splits, encoded once with the policy's chat template."""

from __future__ import annotations

from collections import Counter

from trainables.config import PromptConfig, TaskConfig, TrialConfig
from trainables.data.arithmetic import Problem, make_splits
from trainables.data.offline import OfflineStore, build_store, builtin_rows, read_rows
from trainables.data.prompts import PromptProblem, prompt_text
from trainables.rewards.verify import score_batch


def load_task(cfg: TaskConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, validation) problems, disjoint, deterministic from the seed."""
    return make_splits(seed, cfg.levels, train_size=cfg.train_size, val_size=cfg.val_size)


def train_problems(cfg: TrialConfig) -> list[Problem]:
    """The trial's training prompts: the built-in task's train split, or the distinct questions of the
    offline files with their ground truths (the first task.train_size, in file order)."""
    if cfg.task.name == "arithmetic":
        return load_task(cfg.task, cfg.task_seed)[0]
    first: dict[str, dict] = {}
    for source in cfg.offline.files:
        for row in read_rows(source.path, source.columns)[0]:
            first.setdefault(row["question"].strip(), row)  # as the store keys them; the first row's chat list
    questions = list(first)[: cfg.task.train_size]
    return [Problem(f"offline-{i}", question, first[question]["answer"].strip(), level=0,
                    messages=first[question].get("messages", ())) for i, question in enumerate(questions)]


def encode_prompt(tokenizer, problem: PromptProblem, prompt: PromptConfig | None = None) -> list[int]:
    """Token ids of the chat prompt (`prompt.template`), ending where the assistant starts to write, then
    the prefill: the tokens of the whole text, so a prefill merges with the template's last token as the
    tokenizer would merge them (as LUFFY tokenizes its templated prompts)."""
    prompt = prompt or PromptConfig()
    text = prompt_text(tokenizer, problem, prompt.template, prompt.prefill, prompt.user_format)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def load_offline_store(cfg: TrialConfig, tokenizer, train: list[Problem], score=score_batch) -> OfflineStore:
    """The trial's teacher trajectories: the built-in teachers on the train split, then any files,
    filtered by the policy-token cap and the verifier `score` (`trainables.data.offline`)."""
    off = cfg.offline
    rows = builtin_rows(train, teachers=off.teachers, seed=cfg.task_seed, wrong_rate=off.wrong_rate,
                        overlong_rate=off.overlong_rate) if off.teachers else []
    skipped: Counter = Counter()
    for source in off.files:
        file_rows, file_skipped = read_rows(source.path, source.columns)
        rows += file_rows
        skipped += file_skipped

    if off.teachers_used is not None:
        rows, skipped = used_teachers(rows, off.teachers_used, skipped)

    def count_tokens(text: str) -> int:  # with the EOS the learner appends
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1

    return build_store(rows, count_tokens=count_tokens, max_tokens=cfg.offline_max_tokens, score=score,
                       skipped=skipped)


def used_teachers(rows: list[dict], names: list[str], skipped: Counter) -> tuple[list[dict], Counter]:
    """The raw rows of the teachers in `names` (`offline.teachers_used`); the others counted as
    "teacher_unused". Raises ValueError naming a listed teacher that wrote no row."""
    present = {str(row.get("teacher", "")).strip() for row in rows if isinstance(row, dict)}
    missing = sorted(set(names) - present)
    if missing:
        raise ValueError(f"offline.teachers_used names {missing}, which wrote no trajectory here; the teachers "
                         f"present are {sorted(present)}")
    kept = [row for row in rows if isinstance(row, dict) and str(row.get("teacher", "")).strip() in names]
    return kept, skipped + Counter({"teacher_unused": len(rows) - len(kept)})
