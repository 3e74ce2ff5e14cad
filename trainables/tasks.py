"""Prompt sets of a trial, from its config: the one module that unpacks TaskConfig, PromptConfig and
TrialConfig into the plain arguments of the data modules (arithmetic, benchmarks, offline, prompts),
which know nothing of the config."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from trainables.config import PromptConfig, TaskConfig, TrialConfig
from trainables.data.arithmetic import Problem, make_splits
from trainables.data.benchmarks import BUILTIN, BenchmarkProblem, as_benchmark, read_benchmarks
from trainables.data.offline import OfflineStore, build_store, builtin_rows, offline_problems, read_rows
from trainables.data.prompts import PromptProblem, prompt_ids
from trainables.rewards.verify import score_batch


def load_task(cfg: TaskConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, validation) problems, disjoint, deterministic from the seed."""
    return make_splits(seed, cfg.levels, train_size=cfg.train_size, val_size=cfg.val_size)


def train_problems(cfg: TrialConfig) -> list[Problem]:
    """The trial's training prompts: the built-in task's train split, or the distinct questions of the
    offline files with their ground truths (the first task.train_size, in file order)."""
    if cfg.task.name == "arithmetic":
        return load_task(cfg.task, cfg.task_seed)[0]
    return offline_problems([(source.path, source.columns) for source in cfg.offline.files], cfg.task.train_size)


def builtin_validation(task_cfg: TaskConfig, seed: int) -> list[BenchmarkProblem]:
    """The built-in arithmetic task's validation split (`load_task`'s), as benchmark problems."""
    return as_benchmark(load_task(task_cfg, seed)[1])


def load_benchmarks(
    files: Mapping[str, str | None], task_cfg: TaskConfig, seed: int, limit: int | None = None
) -> tuple[dict[str, list[BenchmarkProblem]], dict[str, Counter]]:
    """{name: its first `limit` problems} for {name: file} (`arithmetic`: the built-in split, no file),
    and the rows skipped in each file (its reasons counted)."""
    builtin = builtin_validation(task_cfg, seed) if BUILTIN in files else []
    return read_benchmarks(files, builtin, seed=seed, limit=limit)


def encode_prompt(tokenizer, problem: PromptProblem, prompt: PromptConfig | None = None) -> list[int]:
    """Token ids of the chat prompt (`prompt.template`), ending where the assistant starts to write, then
    the prefill (`trainables.data.prompts.prompt_ids`)."""
    prompt = prompt or PromptConfig()
    return prompt_ids(tokenizer, problem, prompt.template, prompt.prefill, prompt.user_format)


def within_context(problems: list, tokenizer, prompt: PromptConfig, budget: float) -> tuple[list, int]:
    """(the problems whose prompt, templated with its prefill, has at most `budget` tokens, in order; how many
    had more): a prompt past the policy's context would reach an engine that cannot hold it."""
    kept = [p for p in problems if len(encode_prompt(tokenizer, p, prompt)) <= budget]
    return kept, len(problems) - len(kept)


def load_offline_store(cfg: TrialConfig, tokenizer, train: list[Problem], score=score_batch) -> OfflineStore:
    """The trial's teacher trajectories: the built-in teachers on the train split, then any files,
    filtered by the policy-token cap and the verifier `score` (`trainables.data.offline`)."""
    off = cfg.offline
    rows = (
        builtin_rows(
            train, teachers=off.teachers, seed=cfg.task_seed, wrong_rate=off.wrong_rate, overlong_rate=off.overlong_rate
        )
        if off.teachers
        else []
    )
    skipped: Counter = Counter()
    for source in off.files:
        file_rows, file_skipped = read_rows(source.path, source.columns)
        rows += file_rows
        skipped += file_skipped

    if off.teachers_used is not None:
        rows, skipped = used_teachers(rows, off.teachers_used, skipped)

    def count_tokens(text: str) -> int:  # with the EOS the learner appends
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1

    return build_store(rows, count_tokens=count_tokens, max_tokens=cfg.offline_max_tokens, score=score, skipped=skipped)


def used_teachers(rows: list[dict], names: list[str], skipped: Counter) -> tuple[list[dict], Counter]:
    """The raw rows of the teachers in `names` (`offline.teachers_used`); the others counted as
    "teacher_unused". Raises ValueError naming a listed teacher that wrote no row."""
    present = {str(row.get("teacher", "")).strip() for row in rows if isinstance(row, dict)}
    missing = sorted(set(names) - present)
    if missing:
        raise ValueError(
            f"offline.teachers_used names {missing}, which wrote no trajectory here; the teachers "
            f"present are {sorted(present)}"
        )
    kept = [row for row in rows if isinstance(row, dict) and str(row.get("teacher", "")).strip() in names]
    return kept, skipped + Counter({"teacher_unused": len(rows) - len(kept)})
