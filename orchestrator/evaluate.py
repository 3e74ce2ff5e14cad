"""python -m orchestrator.evaluate MODEL_OR_TRIAL --benchmarks NAME[=FILE],... [--samples K]
[--temperature T | --ead TAU_MAX,TAU_MIN,D | --temperatures START:STOP:STEP] [--answer-format F]
[--template NAME] [--spec SPEC] [--max-new-tokens N] [--limit N] [--seed S] [--out RESULTS.json] [--tracking-uri URI]

Evaluates a policy the way the papers report it: K samples per problem from the rollout service
(the engine trials train with), correctness decided by math-verify (math) or the option letter
(multiple choice), and per benchmark avg@K, pass@k and maj@k (k = 1, 2, 4, ..., K) and worst@K,
with their macro average over benchmarks. MODEL_OR_TRIAL is a Hugging Face model folder, a model
preset (tiny, smollm2-135m-instruct), or a trial's folder (<storage>/<name>) whose latest intact
checkpoint is exported to a model folder first; a trial's evaluation is an MLflow run nested under
the trial's own. Benchmarks are local files in their public layouts (trainables/data/benchmarks.py);
`arithmetic` is the built-in validation split. `--ead` decodes with the annealed schedule at a fixed
decay d (EAD at inference); maj@k against k is its inference-time scaling curve. Prompts are built as
the trial trained (its `prompt` section: template and prefill; the verifier reads prefill + response)
unless `--template` names another (`none`: no system prompt, the OGER paper's out-of-domain setting).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel
from rich.progress import Progress
from rich.table import Table

from orchestrator.cli import later
from orchestrator.console import console, number_table
from orchestrator.inputs import check_model_folder, check_tracking_uri
from orchestrator.spec import MAX_SEEDS_PER_CONFIG, SpecError, load_trial_spec
from trainables.config import MAX_SAMPLES, DecodingConfig, EADConfig, ModelConfig, Name, PromptConfig, TrialConfig
from trainables.data.benchmarks import BENCHMARK_NAMES, BUILTIN, BenchmarkError, BenchmarkProblem, check_name
from trainables.data.prompts import TEMPLATES
from trainables.evaluation import ANSWER_FORMATS, judge, macro_row, metric_key, summarize
from trainables.names import MODEL_PRESETS
from trainables.runtime.seal import seal_key
from trainables.tasks import encode_prompt, load_benchmarks

# MLflow, torch and the model's libraries load once the arguments have passed their checks.
tracking, checkpoint = later("orchestrator.tracking"), later("trainables.runtime.checkpoint")
models = later("trainables.data.models")
PROMPTS_PER_CALL = 16  # prompts per generate call: bounds the engine's batch (prompts x samples)
MAX_DECODINGS = 100  # temperatures one --temperatures range may make


@dataclass(frozen=True)
class Decoding:
    label: str  # "T0.6", "ead-1.2-0.1-25": the prefix of its metrics
    config: DecodingConfig


def decodings(args) -> list[Decoding]:
    """The decoding modes asked for: one fixed temperature, EAD, or a range of temperatures."""
    if args.ead:
        try:
            tau_max, tau_min, d = (float(x) for x in args.ead.split(","))
            ead = EADConfig(tau_max=tau_max, tau_min=tau_min, d0=d)
        except ValueError as e:
            raise SpecError(
                f"--ead: expected TAU_MAX,TAU_MIN,D with 0 < TAU_MIN <= TAU_MAX and D > 0 "
                f"(got {args.ead!r}: {str(e).splitlines()[0]})"
            ) from None
        return [Decoding(f"ead-{tau_max:g}-{tau_min:g}-{d:g}", DecodingConfig(schedule="ead", ead=ead))]
    if args.temperatures:
        try:
            start, stop, step = (float(x) for x in args.temperatures.split(":"))
            assert all(map(math.isfinite, (start, stop, step))) and 0 < start <= stop and step > 0
        except (ValueError, AssertionError):
            raise SpecError(
                f"--temperatures: expected START:STOP:STEP with 0 < START <= STOP and STEP > 0 "
                f"(got {args.temperatures!r})"
            ) from None
        if (count := math.floor((stop - start) / step) + 1) > MAX_DECODINGS:
            raise SpecError(f"--temperatures: {args.temperatures} makes {count} temperatures; at most {MAX_DECODINGS}")
        temps = np.round(np.arange(start, stop + step / 2, step), 6)
        return [fixed(float(t)) for t in temps]
    if args.temperature <= 0:
        raise SpecError(f"--temperature must be > 0 (got {args.temperature})")
    return [fixed(args.temperature)]


def fixed(temperature: float) -> Decoding:
    """A fixed temperature (`DecodingConfig` bounds it)."""
    try:
        return Decoding(f"T{temperature:g}", DecodingConfig(schedule="fixed", temperature=temperature))
    except ValueError as e:
        raise SpecError(f"temperature {temperature:g}: {str(e).splitlines()[-1].strip()}") from None


def parse_benchmarks(text: str, limit: int | None, cfg: TrialConfig) -> dict[str, list[BenchmarkProblem]]:
    """ "aime24=/data/aime24.parquet,arithmetic" -> {name: problems}; skipped rows are printed."""
    files = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, path = item.partition("=")
        try:
            check_name(name)
        except BenchmarkError as e:
            raise SpecError(f"--benchmarks: {e}") from None
        if name != BUILTIN and not path:
            raise SpecError(f"--benchmarks: {name} needs its file, as {name}=PATH")
        files[name] = path or None
    if not files:
        raise SpecError("--benchmarks: name at least one benchmark, e.g. arithmetic or math500=FILE")
    try:
        sets, skipped = load_benchmarks(files, cfg.task, cfg.task_seed, limit)
    except BenchmarkError as e:
        raise SpecError(f"--benchmarks: {e}") from None
    for name, counts in skipped.items():
        if counts:
            console.print(f"{name}: skipped {sum(counts.values())} rows ({dict(counts)})")
    return sets


class RaySnapshot(BaseModel):
    """The part of Ray Train's checkpoint_manager_snapshot.json read here: each checkpoint's folder name,
    one path component inside the trial folder."""

    class Entry(BaseModel):
        checkpoint_dir_name: Name

    checkpoint_results: list[Entry]
    latest_checkpoint_result: Entry | None = None


def unusable(folder: str, problem: str, seen: list[str] | None = None) -> None:
    console.print(f"[yellow]checkpoint {folder} is unusable:[/yellow] {problem}; trying the one before it")
    if seen is not None:
        seen.append(f"{folder}: {problem}")


def trial_checkpoints(target: Path) -> list[str]:
    """The trial folder's checkpoint folders, the latest first, as its Ray Train snapshot names them:
    one path component each, and none that links out of the folder (never read)."""
    try:
        state = checkpoint.read_record(target / "checkpoint_manager_snapshot.json", RaySnapshot)
    except ValueError as e:
        raise SpecError(f"MODEL_OR_TRIAL: {target}: {e}") from None
    names = [r.checkpoint_dir_name for r in state.checkpoint_results]
    latest = state.latest_checkpoint_result.checkpoint_dir_name if state.latest_checkpoint_result else None
    inside = [n for n in names if (target / n).resolve().is_relative_to(target.resolve())]
    for name in sorted(set(names) - set(inside)):
        unusable(name, "a link out of the trial folder")
    return sorted(inside, key=lambda n: (n == latest, n), reverse=True)


def seed_part(folder: Path, seed_index: int) -> tuple[Path, str]:
    """(the folder holding one seed's checkpoint, the name its export takes): the checkpoint itself for a
    trial's run, its `seed_<index>/` for a configuration's run of several seeds (trainables/group.py)."""
    if not (folder / "seed_0").is_dir():
        return folder, folder.name
    part = folder / f"seed_{seed_index}"
    if not part.is_dir():
        seeds = len(list(folder.glob("seed_*")))
        raise ValueError(f"it holds {seeds} seeds' parts (seed_0 ... seed_{seeds - 1}): no seed_{seed_index}")
    return part, f"{folder.name}-seed_{seed_index}"


def resolve_policy(target: Path, cache_dir: str, seed_index: int = 0, trust: bool = False) -> tuple[Path, dict | None]:
    """(model folder, the trial's spec or None) for a model folder, a trial folder (a configuration's run:
    the seed at `seed_index`) or a model preset."""
    if (target / "config.json").is_file():
        return target, None
    if not target.exists() and target.name in MODEL_PRESETS:
        return models.resolve_model_path(ModelConfig(preset=target.name), cache_dir), None
    if not (target / "checkpoint_manager_snapshot.json").is_file():
        raise SpecError(
            f"MODEL_OR_TRIAL: {target} is neither a Hugging Face model folder (config.json), "
            f"a trial folder (checkpoint_manager_snapshot.json) nor a preset ({', '.join(MODEL_PRESETS)})"
        )
    from trainables.export import export_policy

    def export(folder: Path) -> tuple[Path, dict]:
        # Each of these raises a ValueError (SpecError and ValidationError are ones) that makes the checkpoint unusable.
        part, name = seed_part(folder, seed_index)
        state_file = part / checkpoint.TRIAL_STATE
        trial_state = checkpoint.read_record(state_file, checkpoint.TrialState)
        check_model_folder(trial_state.model_path, f"{state_file}: model_path")
        TrialConfig.model_validate(trial_state.trial)  # its spec, used below
        exported = target / "export" / name
        if not (exported / "config.json").is_file():
            console.print(f"exporting {part} -> {exported}")
            export_policy(part, exported)
        return exported, trial_state.trial

    seen: list[str] = []
    found = checkpoint.first_intact(
        ((str(target / n), nullcontext(target / n)) for n in trial_checkpoints(target)),
        lambda _, folder: checkpoint.saved_world_size(folder) or 1,
        export,
        lambda folder, problem: unusable(folder, problem, seen),
        None if trust else seal_key(),
    )
    if found is None:
        latest = f"; the latest, {seen[0]}" if seen else " (it lists none)"
        raise SpecError(f"MODEL_OR_TRIAL: no intact checkpoint in {target}{latest}")
    return found[1]


def evaluate(
    service,
    tokenizer,
    problems: list[BenchmarkProblem],
    decoding: Decoding,
    *,
    samples: int,
    max_new_tokens: int,
    seed: int,
    answer_format: str,
    prompt: PromptConfig,
    progress: Progress,
    title: str,
) -> tuple[dict[str, float], list[dict]]:
    """One benchmark under one decoding: its summary row and per-problem results."""
    import ray

    rows, task = [], progress.add_task(title, total=len(problems))
    for start in range(0, len(problems), PROMPTS_PER_CALL):
        chunk = problems[start : start + PROMPTS_PER_CALL]
        spec = decoding.config.sampling(max_new_tokens, step=0, seed=seed * 1_000_003 + start)
        batch = ray.get(service.generate.remote([encode_prompt(tokenizer, p, prompt) for p in chunk], samples, spec))
        for i, problem in enumerate(chunk):
            texts = [prompt.completion(text) for text in batch.texts[i * samples : (i + 1) * samples]]
            correct, answers = judge(texts, problem.answer, bool(problem.choices), answer_format)
            rows.append(
                {
                    "uid": problem.uid,
                    "question": problem.question,
                    "gold": problem.answer,
                    "answers": answers,
                    "correct": correct,
                    "responses": texts,
                }
            )
        progress.advance(task, len(chunk))
    summary = summarize([r["correct"] for r in rows], [r["answers"] for r in rows], [r["gold"] for r in rows])
    return summary, rows


def results_table(results: dict[str, dict[str, dict[str, float]]]) -> Table:
    columns = list(next(iter(next(iter(results.values())).values())))
    table = number_table("evaluation", ["decoding", "benchmark", *columns])
    for label, per_benchmark in results.items():
        for bench, row in per_benchmark.items():
            table.add_row(label, bench, *(f"{row[c]:.4f}" for c in columns))
    return table


def evaluate_all(
    cfg: TrialConfig,
    model_path: Path,
    modes: list[Decoding],
    benchmarks: dict,
    args,
    max_new_tokens: int,
    prompt: PromptConfig,
) -> tuple[dict, dict]:
    """Every benchmark under every decoding on one rollout engine: ({decoding: {benchmark: row}} with a
    macro row over several benchmarks, {decoding: {benchmark: per-problem results}})."""
    import ray
    from transformers import AutoTokenizer

    from orchestrator.launch import init_ray
    from trainables.rollout.service import start_rollout_service

    init_ray(2)
    service = start_rollout_service(cfg.rollout, model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    results: dict[str, dict[str, dict[str, float]]] = {}
    per_problem: dict[str, dict[str, list[dict]]] = {}
    try:
        with Progress(console=console, transient=True) as progress:
            for mode in modes:
                results[mode.label], per_problem[mode.label] = {}, {}
                for name, problems in benchmarks.items():
                    row, rows = evaluate(
                        service,
                        tokenizer,
                        problems,
                        mode,
                        samples=args.samples,
                        max_new_tokens=max_new_tokens,
                        seed=args.seed,
                        answer_format=args.answer_format,
                        prompt=prompt,
                        progress=progress,
                        title=f"{mode.label} {name} ({len(problems)} problems x {args.samples})",
                    )
                    results[mode.label][name], per_problem[mode.label][name] = row, rows
                if len(benchmarks) > 1:
                    results[mode.label]["macro"] = macro_row(results[mode.label])
    finally:
        ray.kill(service)
    return results, per_problem


def run(args) -> dict:
    start = time.perf_counter()
    modes = decodings(args)
    target = Path(args.model_or_trial).expanduser().resolve()
    base = load_trial_spec(args.spec) if args.spec else TrialConfig()
    model_path, trial_spec = resolve_policy(target, base.cache_dir, args.seed_index, args.trust_unsealed)
    cfg = base if args.spec or not trial_spec else TrialConfig.model_validate(trial_spec)
    benchmarks = parse_benchmarks(args.benchmarks, args.limit, cfg)
    max_new_tokens = args.max_new_tokens or cfg.rollout.max_new_tokens
    prompt = cfg.prompt.model_copy(update={"template": args.template}) if args.template else cfg.prompt

    results, per_problem = evaluate_all(cfg, model_path, modes, benchmarks, args, max_new_tokens, prompt)
    console.print(results_table(results))
    record = {
        "model": str(model_path),
        "target": str(target),
        "samples": args.samples,
        "seed": args.seed,
        "answer_format": args.answer_format,
        "template": prompt.template,
        "prefill": prompt.prefill,
        "max_new_tokens": max_new_tokens,
        "results": results,
        "problems": per_problem,
    }
    out = Path(args.out) if args.out else (target / "evaluation.json" if trial_spec else Path("evaluation.json"))
    out.write_text(json.dumps(record, indent=1))
    console.print(f"per-problem results: {out}")
    log_run(args, target, trial_spec, results, out, record)
    console.print(f"evaluated in {time.perf_counter() - start:.0f} s")
    return results


def log_run(args, target: Path, trial_spec: dict | None, results: dict, out: Path, record: dict) -> None:
    """An MLflow run of the evaluation, nested under the trial's run when given a trial."""
    logging = (trial_spec or {}).get("logging", {})
    storage = str(target.parent) if trial_spec else "runs"  # a model folder: where trials record by default
    # Never the tracking URI the trial's files name: a folder from someone else must not send results elsewhere.
    uri = args.tracking_uri or tracking.default_tracking_uri(storage)
    tracker = tracking.Tracker(uri, logging.get("experiment", "rlvr-explore"))
    parent = tracker.find_trial_run(str(target)) if trial_spec else None
    metrics = {
        f"eval/{label}/{bench}/{metric_key(key)}": value
        for label, per in results.items()
        for bench, row in per.items()
        for key, value in row.items()
    }
    params = {
        "model": record["model"],
        "benchmarks": args.benchmarks,
        "samples": args.samples,
        "answer_format": args.answer_format,
        "template": record["template"],
        "decodings": ",".join(results),
        "seed": args.seed,
        "max_new_tokens": record["max_new_tokens"],
    }
    run_id = tracker.log_evaluation(
        f"eval-{target.name}", params=params, metrics=metrics, artifact=out, parent_run_id=parent
    )
    if run_id:
        console.print(f"MLflow run {run_id} in {uri}")


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.evaluate",
        description=__doc__.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model_or_trial",
        help="a Hugging Face model folder, a trial folder <storage>/<name>, "
        "or a model preset (" + ", ".join(MODEL_PRESETS) + ")",
    )
    parser.add_argument(
        "--benchmarks",
        default=BUILTIN,
        help="comma-separated NAME=FILE (or arithmetic); names: " + ", ".join(BENCHMARK_NAMES),
    )
    parser.add_argument("--samples", type=int, default=8, help="samples per problem (K)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--temperature", type=float, default=0.6, help="fixed sampling temperature")
    mode.add_argument("--ead", help="EAD at inference: TAU_MAX,TAU_MIN,D (e.g. 1.2,0.1,25)")
    mode.add_argument("--temperatures", help="a range of fixed temperatures, START:STOP:STEP (e.g. 0.1:1.0:0.1)")
    parser.add_argument(
        "--answer-format",
        choices=ANSWER_FORMATS,
        default="think",
        help="think: the trained format (<think>...</think> then \\boxed{}); boxed: the last box "
        "anywhere; last_number: the box, else the last number (chat models that rarely box)",
    )
    parser.add_argument(
        "--template",
        choices=sorted(TEMPLATES),
        help="prompt template (default: the trial's, else the spec's; none: no system prompt)",
    )
    parser.add_argument("--spec", help="take the task (for arithmetic), rollout settings and cache from this spec")
    parser.add_argument("--max-new-tokens", type=int, help="response cap (default: the spec's)")
    parser.add_argument("--limit", type=int, help="first N problems of each benchmark")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument(
        "--trust-unsealed",
        action="store_true",
        help="take a checkpoint this product did not "
        "seal (one from before seals, or a colleague's); only for checkpoints you trust",
    )
    parser.add_argument(
        "--seed-index",
        type=int,
        default=0,
        help="a configuration's folder of a sweep (several seeds in one run): which seed's policy, 0-based (default 0)",
    )
    parser.add_argument(
        "--out", help="JSON of all per-problem results (default: next to the trial, or ./evaluation.json)"
    )
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: the sqlite store beside the trial "
        "folder; a tracking URI named in the trial's own files is never used)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    try:
        if args.tracking_uri is not None:
            check_tracking_uri(args.tracking_uri, "--tracking-uri")
        if not 0 <= args.seed_index < MAX_SEEDS_PER_CONFIG:
            raise SpecError(f"--seed-index must be between 0 and {MAX_SEEDS_PER_CONFIG - 1} (got {args.seed_index})")
        if not 1 <= args.samples <= MAX_SAMPLES:
            raise SpecError(f"--samples must be between 1 and {MAX_SAMPLES} (got {args.samples})")
        run(args)
    except (SpecError, FileNotFoundError) as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
