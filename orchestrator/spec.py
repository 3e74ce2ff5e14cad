"""The experiment spec: one YAML file, validated once here, passed down as one object.

Every field carries its help text once (``Field(description=...)``). Validation errors come out as
one line per problem, naming the key path and what was expected::

    search_spaces/ead.yaml: rollout.decoding.ead.tau_min: must be <= tau_max (got 1.5 > 1.2)
"""

from __future__ import annotations

import builtins
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.inputs import SpecError, check_trial_inputs
from orchestrator.preflight import PROMPT_TOKENS, memory_report, model_positions
from trainables.config import (
    AlgorithmConfig,
    CheckpointConfig,
    DecodingConfig,
    EADConfig,
    LearnerConfig,
    LoggingConfig,
    ModelConfig,
    RolloutConfig,
    Seed,
    TaskConfig,
    TinyModelConfig,
    TrialConfig,
    ValidationConfig,
)
from trainables.data.benchmarks import BenchmarkError, load_benchmark
from trainables.metrics import OBJECTIVE_NAMESPACES, unlogged


class SpecLoader(yaml.SafeLoader):
    """YAML as specs are read: safe, and `1e-4` a number as in YAML 1.2 (YAML 1.1 wants `1.0e-4`, and
    reads `1e-4` as text, which the strict check would refuse for a float field)."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)

BEST_SPEC = "best_trial.yaml"  # a sweep's best configuration, ready for `train --best-of`
# Counts that expand into runs, threads and Ray actors: bounded before anything is made.
MAX_SEEDS_PER_CONFIG = 64  # seeds of one configuration or arm (they train in one run), and confirmation pairs
MAX_CONFIGURATIONS = 10_000  # configurations of a sweep, and those running at once
Seeds = Annotated[int, Field(ge=1, le=MAX_SEEDS_PER_CONFIG)]
Configurations = Annotated[int, Field(ge=1, le=MAX_CONFIGURATIONS)]

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "DecodingConfig",
    "EADConfig",
    "LearnerConfig",
    "LoggingConfig",
    "ModelConfig",
    "RolloutConfig",
    "SpecError",
    "TaskConfig",
    "TinyModelConfig",
    "TrialConfig",
    "ValidationConfig",
    "apply_overrides",
    "format_validation_error",
    "load_sweep_spec",
    "load_trial_spec",
    "parse_overrides",
]


def _key_path(loc: tuple[Any, ...]) -> str:
    # pydantic puts the validator's name in the location of model-level errors; keep the field path.
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


def format_validation_error(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against the spec reference, docs/spec.md)"
        elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{source}: {_key_path(e['loc']) or '<top>'}: {msg}")
    return "\n".join(lines)


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["rollout.n=4", "learner.lr=1e-3"]`` -> ``{"rollout.n": 4, "learner.lr": 0.001}``.

    Values are parsed as YAML, so numbers, booleans, null and lists work as they do in the file.
    """
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set rollout.n=4")
        try:
            parsed[key.strip()] = yaml.load(raw, SpecLoader) if raw.strip() else None
        except yaml.YAMLError as e:
            raise SpecError(f"--set {key.strip()}: {raw!r} is not a YAML value ({getattr(e, 'problem', e)})") from None
    return parsed


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (a copy); unknown keys are caught later by validation."""
    out = _deep_copy(data)
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise SpecError(f"--set {dotted}: {where} is a value, not a section")
            node = child
        node[leaf] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), SpecLoader)
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte {e.start}); a spec is a YAML file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:  # `{}` asks for the defaults; an empty file is more likely a mistake
        raise SpecError(
            f"{path}: the file is empty (or only comments); a spec is a mapping of sections, "
            "e.g. search_spaces/ead.yaml (write {} for every default)"
        )
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of sections at the top, got {type(data).__name__}")
    return data


def validate_trial(data: dict[str, Any], source: str, check_files: bool = True) -> TrialConfig:
    """The trial spec, checked; `check_files=False` leaves the data files to the run (a dry run on a
    machine without the cluster's volumes)."""
    try:  # strict: every value of the field's own type (no bool for an int, no 2.0 for 2, no "5" for 5)
        trial = TrialConfig.model_validate(data, strict=True)
    except ValidationError as e:
        raise SpecError(format_validation_error(source, e)) from None
    check_metric(trial, trial.checkpoint.keep_best_by, f"{source}: checkpoint.keep_best_by")
    check_future(trial.checkpoint.save_by, f"{source}: checkpoint.save_by")
    if check_files:  # a file's own problems first, then what combines it with the model: the user's order of fixes
        check_trial_inputs(trial, source)
        check_benchmark_files(trial, source)
    check_positions(trial, source)
    return trial


def check_positions(trial: TrialConfig, source: str) -> None:
    """A response budget plus the task's prompt allowance must fit the policy's positions."""
    positions, where = model_positions(trial)
    needed = trial.rollout.max_new_tokens + PROMPT_TOKENS[trial.task.name]
    if positions is not None and needed > positions:
        raise SpecError(
            f"{source}: rollout.max_new_tokens: {trial.rollout.max_new_tokens} response tokens + a "
            f"prompt allowance of {PROMPT_TOKENS[trial.task.name]} exceed the model's {positions} "
            f"positions ({where}); at most {positions - PROMPT_TOKENS[trial.task.name]}"
        )


def check_future(moment: datetime | None, where: str) -> None:
    """A deadline must lie ahead: compared in its own zone, or in local time when it has no offset."""
    if moment is not None and moment <= datetime.now(moment.tzinfo):
        raise SpecError(f"{where}: {moment.isoformat()} is in the past; give a time ahead of now")


def check_metric(trial: TrialConfig, metric: str | None, where: str) -> None:
    """A metric named to rank or keep trials must be one a trial of this spec logs."""
    if metric and (why := unlogged(metric, trial)):
        raise SpecError(f"{where}: {metric} is {why}")


def check_benchmark_files(trial: TrialConfig, source: str) -> None:
    """Each validation benchmark file reads in its layout (bad rows are only counted, as in the trial)."""
    for name, path in trial.validation.benchmarks.items():
        if path:
            try:
                load_benchmark(name, path, limit=trial.validation.num_prompts, seed=trial.seed)
            except BenchmarkError as e:
                raise SpecError(f"{source}: validation.benchmarks.{name}: {e}") from None


def absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """A copy with the spec's local paths made absolute: trials run in their own working folders."""

    def absolute(path: Any) -> Any:  # anything but a local path string is left to validation
        return str(Path(path).expanduser().resolve()) if isinstance(path, str) and "://" not in path else path

    out = apply_overrides(data, {"cache_dir": absolute(data.get("cache_dir", ".cache"))})

    if isinstance(out.get("model"), dict) and out["model"].get("path"):
        out["model"]["path"] = absolute(out["model"]["path"])
    for source in (out.get("offline") or {}).get("files") or []:
        if isinstance(source, dict) and "path" in source:
            source["path"] = absolute(source["path"])
    benchmarks = (out.get("validation") or {}).get("benchmarks")
    if isinstance(benchmarks, dict):
        out["validation"]["benchmarks"] = {name: absolute(path) for name, path in benchmarks.items()}
    return out


def load_trial_spec(path: str | Path, overrides: list[str] | None = None, check_files: bool = True) -> TrialConfig:
    """Read, override and validate a spec file: the one edge where input is checked."""
    data = absolute_paths(apply_overrides(read_yaml(path), parse_overrides(overrides)))
    data.pop("search", None)  # the sweep's section; a single trial ignores it
    return validate_trial(data, str(path), check_files)


# -- the sweep's `search:` section -------------------------------------------------------------------
DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice", "value")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # every float finite


class Distribution(Section):
    """Exactly one of: uniform [lo, hi], loguniform [lo, hi], int [lo, hi], choice [...], value x."""

    uniform: tuple[float, float] | None = None
    loguniform: tuple[PositiveFloat, PositiveFloat] | None = None
    int: tuple[builtins.int, builtins.int] | None = None  # the key users write; the type is the builtin
    choice: list[Any] | None = None
    value: Any = None

    @field_validator("uniform", "loguniform", "int", mode="before")
    @classmethod
    def _bounds(cls, value: Any) -> Any:  # YAML has lists, not tuples (also under a strict check)
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        given = [k for k in DISTRIBUTIONS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(DISTRIBUTIONS)} (got {given or 'none'})")
        bounds = self.uniform or self.loguniform or self.int
        if bounds and bounds[0] >= bounds[1]:
            raise ValueError(f"{given[0]} bounds must be [low, high] with low < high (got {list(bounds)})")
        if self.choice is not None and not self.choice:
            raise ValueError("choice needs at least one value")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in DISTRIBUTIONS if getattr(self, k) is not None)

    def contains(self, value: Any) -> bool:
        """Whether `value` is a point of this distribution."""
        if self.kind in ("uniform", "loguniform", "int"):
            low, high = getattr(self, self.kind)
            number = isinstance(value, (builtins.int, float)) and not isinstance(value, bool)
            return number and low <= value <= high and (self.kind != "int" or float(value).is_integer())
        return value in self.choice if self.kind == "choice" else value == self.value

    def candidates(self) -> list[Any]:
        """Values that must each make a valid trial (bounds, choices, the fixed value)."""
        if self.kind in ("uniform", "loguniform", "int"):
            return list(getattr(self, self.kind))
        return self.choice if self.kind == "choice" else [self.value]


class SchedulerConfig(Section):
    name: Literal["intervals", "asha", "none"] = Field(
        "intervals",
        description="Early stopping of weak configurations: `intervals` stops one only when its upper "
        "bound at a rung lies below the rung's best lower bound (seed SD pooled over the rung; "
        "orchestrator.decisions.prune); `asha` is Ray's rung rule on the means (keep the top 1/reduction_factor).",
    )
    grace_period: PositiveInt = Field(
        10, description="RL steps before a configuration can be stopped (the first rung)."
    )
    reduction_factor: float = Field(
        2.0, gt=1.0, description="Rungs at grace_period x reduction_factor^k; ASHA keeps 1/reduction_factor at each."
    )
    level: float = Field(0.95, gt=0.5, lt=1.0, description="`intervals`: the two-sided level of the bounds.")


class SamplerConfig(Section):
    name: Literal["tpe", "random"] = Field("tpe", description="Optuna's sampler: TPE, or random search.")
    n_startup_trials: PositiveInt = Field(
        2,
        description="TPE: trials (points_to_evaluate included) before it models; random until then. Optuna's "
        "default of 10 would make a sweep of fewer configurations random search.",
    )


class ConfirmConfig(Section):
    """Confirmation: the winner and the baseline on fresh seeds, a group-sequential paired test."""

    seeds: Seeds = Field(3, description="Seed pairs at the first look.")
    add: Seeds = Field(3, description="Seed pairs added at each further look.")
    max_seeds: Seeds = Field(6, description="Seed pairs at the last look: inconclusive there if undecided.")
    margin: PositiveFloat | None = Field(
        None,
        description="Equivalence margin in the objective's units (TOST): "
        "`equivalent within +-margin`; none: no equivalence verdict.",
    )
    alpha: float = Field(0.05, gt=0, lt=0.5, description="Family-wise error of the sequential test, over all looks.")
    spending: Literal["obrien-fleming", "pocock"] = Field(
        "obrien-fleming", description="How alpha is spent over the looks (Lan-DeMets spending functions)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> ConfirmConfig:
        if self.max_seeds < self.seeds:
            raise ValueError(f"max_seeds must be >= seeds (got {self.max_seeds} < {self.seeds})")
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2: one pair measures no seed spread (got {self.seeds})")
        return self


class SearchConfig(Section):
    """The search over trial fields: Optuna proposes, the scheduler stops early, the confirmation decides,
    MLflow records."""

    space: dict[str, Distribution] = Field(description="Dotted trial field -> distribution.")
    metric: str = Field("val/accuracy", description="Objective, a reported trial metric.")
    mode: Literal["max", "min"] = Field("max")
    second_metric: str | None = Field(None, description="A second objective: Optuna's multi-objective search.")
    second_mode: Literal["max", "min"] = Field("max")
    num_samples: Configurations = Field(4, description="Trials.")
    max_concurrent_trials: Configurations = Field(1, description="Trials running at once (each is a Ray Train group).")
    seed: Seed = Field(0, description="Seeds Optuna's sampler.")
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    confirm: ConfirmConfig | None = Field(
        None,
        description="After the search, the winner and the baseline on fresh seeds (none of the search's), "
        "paired, looked at sequentially: the verdict comes from these runs only.",
    )
    points_to_evaluate: list[dict[str, Any]] = Field(
        default_factory=list, description="Settings tried first (e.g. the papers')."
    )
    final: dict[str, Any] = Field(
        default_factory=dict,
        description="Dotted trial field -> value for the final model, applied over the "
        "best trial's settings in best_trial.yaml (`train --best-of`): longer, more learner workers, GPUs.",
    )
    seeds: Seeds = Field(
        1,
        description="Seeds per configuration (the spec's seed + 0, 1, ...), trained side by side in one Tune "
        "trial: the searcher and the scheduler see their mean; every number comes with a 95% interval over them.",
    )
    seed_runs: Seeds = Field(
        2,
        description="Ray Train runs a configuration's seeds are split over (a run's seeds take their steps in "
        "turn on one worker group and engine set; a seed's values are the same in any split): 2 keeps two cores "
        "busy, 1 spends the least CPU. A confirmation look trains its two arms at once, each over half of them. "
        "GPU learners take one run a seed.",
    )
    baseline: dict[str, Any] | None = Field(
        None,
        description="The configuration the best one is compared with (paired over the same seeds); "
        "default: the first of points_to_evaluate. Evaluated first.",
    )

    @model_validator(mode="after")
    def _check(self) -> SearchConfig:
        if self.baseline is None and self.points_to_evaluate:
            self.baseline = dict(self.points_to_evaluate[0])
        if self.baseline is not None:
            if unknown := sorted(set(self.baseline) - set(self.space)):
                raise ValueError(f"baseline: {unknown} not in space; name searched fields only")
            if self.baseline not in self.points_to_evaluate:
                self.points_to_evaluate.insert(0, dict(self.baseline))
        for i, point in enumerate(self.points_to_evaluate):
            if unknown := sorted(set(point) - set(self.space)):
                raise ValueError(f"points_to_evaluate[{i}]: {unknown} not in space; name searched fields only")
            for key, value in point.items():
                if not self.space[key].contains(value):
                    raise ValueError(
                        f"points_to_evaluate[{i}]: {key} = {value!r} is outside its space "
                        f"{self.space[key].model_dump(exclude_none=True)}"
                    )
        if not self.space:
            raise ValueError("space is empty: name at least one trial field, e.g. rollout.decoding.ead.tau_max")
        for metric in filter(None, (self.metric, self.second_metric)):
            if not metric.startswith(OBJECTIVE_NAMESPACES):
                raise ValueError(
                    f"metric {metric!r} is not a trial metric; use one of the names in docs/metrics.md "
                    f"(namespaces {', '.join(OBJECTIVE_NAMESPACES)})"
                )
        if self.second_metric and self.scheduler.name != "none":
            raise ValueError("a second objective needs scheduler.name: none (a scheduler stops on one metric)")
        if self.confirm and (self.second_metric or self.baseline is None):
            raise ValueError("confirm needs one objective and a baseline (search.baseline or points_to_evaluate)")
        return self

    @property
    def all_seeds(self) -> int:
        """Seeds the sweep trains per configuration at most: the search's, then the confirmation's."""
        return self.seeds + (self.confirm.max_seeds if self.confirm else 0)


def load_sweep_spec(
    path: str | Path, overrides: list[str] | None = None, check_files: bool = True
) -> tuple[TrialConfig, SearchConfig, dict]:
    """(base trial, search, base trial data) from a spec with a `search:` section, all checked here:
    every searched field must make a valid trial at each bound or choice."""
    data = absolute_paths(apply_overrides(read_yaml(path), parse_overrides(overrides)))
    raw_search = data.pop("search", None)
    if raw_search is None:
        raise SpecError(f"{path}: search: missing; a sweep spec needs a search section (see search_spaces/ead.yaml)")
    trial = validate_trial(data, str(path), check_files)
    try:
        search = SearchConfig.model_validate(raw_search, strict=True)
    except ValidationError as e:
        raise SpecError(format_validation_error(f"{path}: search", e)) from None
    for key, dist in search.space.items():
        for value in dist.candidates():
            try:
                TrialConfig.model_validate(apply_overrides(data, {key: value}), strict=True)
            except (ValidationError, SpecError) as e:
                first = format_validation_error("", e).splitlines()[0] if isinstance(e, ValidationError) else str(e)
                raise SpecError(
                    f"{path}: search.space.{key}: {value!r} does not make a valid trial ({first.removeprefix(': ')})"
                ) from None
    try:
        TrialConfig.model_validate(apply_overrides(data, search.final), strict=True)
    except (ValidationError, SpecError) as e:
        first = format_validation_error("", e).splitlines()[0] if isinstance(e, ValidationError) else str(e)
        raise SpecError(f"{path}: search.final: does not make a valid trial ({first.removeprefix(': ')})") from None
    if search.metric.startswith("val/") and not trial.validation.every:
        raise SpecError(f"{path}: search.metric: {search.metric} needs validation.every > 0")
    check_metric(trial, search.metric, f"{path}: search.metric")
    check_metric(trial, search.second_metric, f"{path}: search.second_metric")
    return trial, search, data


def derived_numbers(trial: TrialConfig, search: SearchConfig | None = None) -> str:
    """What a spec amounts to, one line each: batch sizes, optimizer steps, GPUs, the objective, and the
    memory pre-flight (`--dry-run`)."""
    lr, ro = trial.learner, trial.rollout
    per_trial = trial.gpus
    engine = (
        "colocated with the learner (sleep mode)"
        if ro.colocate
        else f"{ro.num_gpus:g} GPU(s) each, tensor parallel {ro.tensor_parallel_size}"
        if ro.num_gpus
        else "CPU"
    )
    return "\n".join(
        [
            f"per RL step: {lr.prompts_per_step} prompts x {ro.group_size} rollouts = "
            f"{lr.prompts_per_step * ro.group_size} sequences of <= {ro.max_new_tokens} new tokens, "
            f"{lr.minibatches} optimizer step(s) of {lr.prompts_per_step // lr.minibatches} prompts",
            f"per trial: {lr.steps} RL steps = {lr.steps * lr.minibatches} optimizer steps, "
            f"{lr.steps * lr.prompts_per_step * ro.group_size} rollouts",
            f"resources per trial: {lr.num_workers} learner rank(s) on {'GPUs' if lr.use_gpu else 'CPUs'} "
            f"(ZeRO-{lr.zero_stage}), {ro.num_engines} rollout engine(s) ({ro.backend}) on {engine}: "
            f"{per_trial:g} GPU(s)",
            recipe_line(trial),
            memory_report(trial),
            *(
                [
                    f"sweep: {search.num_samples} configurations x {search.seeds} seed(s), "
                    f"{search.max_concurrent_trials} configuration(s) at once: "
                    f"{per_trial * search.max_concurrent_trials * search.seeds:g} GPUs busy"
                ]
                if search
                else []
            ),
        ]
    )


def recipe_line(trial: TrialConfig) -> str:
    """The objective as resolved from the preset and the spec, the prompt, and EAD's decay over the run."""
    from trainables.rollout.ead import ead_decay  # torch: only once the spec is valid

    algo, ro, ead = trial.algorithm, trial.rollout, trial.rollout.decoding.ead
    clip = "no clip" if algo.clip_low is None and algo.clip_high is None else f"clip {algo.clip_low}/{algo.clip_high}"
    norm = f" / {trial.loss_norm_len}" if algo.loss_agg == "seq-mean-token-sum-norm" else ""
    decay = (
        f"; EAD d_s {ead_decay(1, d0=ead.d0):g} at RL step 1 to {ead_decay(trial.learner.steps, d0=ead.d0):g}"
        if ro.decoding.schedule == "ead"
        else ""
    )
    return (
        f"objective: {algo.name}, std {'on' if algo.use_std else 'off'}, {clip}"
        f"{f', dual clip {algo.dual_clip:g}' if algo.dual_clip else ''}, {algo.loss_agg}{norm}; learner log-probs "
        f"at {'the rollout temperature' if trial.logprob_temperature == 'rollout' else 'T = 1'}; TIS "
        f"{f'{ro.tis_level} cap {ro.tis_cap:g}' if ro.tis_cap else 'off'}; prompt {trial.prompt.template}"
        f"{f' + prefill {trial.prompt.prefill!r}' if trial.prompt.prefill else ''}{decay}"
    )
