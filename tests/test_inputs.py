"""Bad input, by kind, is stopped at the edge: exit code 2, one line naming the key (or flag) and the
file, no traceback, and nothing started. Each kind is tried on several inputs."""

from __future__ import annotations

import json
import re
import struct
from datetime import UTC

import pytest

from orchestrator import experiment, study, sweep, train

EAD = "search_spaces/ead.yaml"


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch):
    """An input that passes the checks would start Ray: fail at once instead."""

    def started(*args, **kwargs):
        raise AssertionError("the input was accepted: Ray was about to start")

    monkeypatch.setattr(train, "run", started)
    monkeypatch.setattr(experiment, "start_cluster", started)
    monkeypatch.setattr(experiment.Tracker, "start_sweep_run", started)


def refused(capsys, main, args: list[str], *named: str) -> str:
    assert main(args) == 2
    out = capsys.readouterr()
    lines = [line for line in out.out.splitlines() if line.strip()]
    assert len(lines) == 1, out.out
    assert "Traceback" not in out.out + out.err
    for name in named:
        assert name in lines[0], lines[0]
    return lines[0]


def train_with(capsys, tmp_path, *sets: str, named: tuple[str, ...], spec: str = EAD) -> str:
    args = [spec, "--set", f"storage={tmp_path / 'runs'}", "--set", f"cache_dir={tmp_path / 'cache'}"]
    for item in sets:
        args += ["--set", item]
    return refused(capsys, train.main, args, *named)


@pytest.mark.parametrize(
    "item, key",
    [
        ("learner.lr=.inf", "learner.lr"),
        ("learner.lr=.nan", "learner.lr"),
        ("algorithm.entropy_coef=.nan", "algorithm.entropy_coef"),
        ("rollout.decoding.ead.tau_max=-.inf", "rollout.decoding.ead.tau_max"),
        ("rollout.tis_cap=.inf", "rollout.tis_cap"),
        ("offline.wrong_rate=.nan", "offline.wrong_rate"),
    ],
)
def test_non_finite_numbers(capsys, tmp_path, item, key):
    train_with(capsys, tmp_path, item, named=(key,))


@pytest.mark.parametrize(
    "item, key",
    [
        ("rollout.decoding.ead.tau_min=1e-9", "tau_min"),
        ("validation.decoding.temperature=0.0001", "temperature"),
        ("seed=-1", "seed"),
        ("seed=4294967296", "seed"),
        ("model.tiny.seed=-5", "model.tiny.seed"),
        ("learner.lr=5.0", "learner.lr"),
        ("learner.steps=0", "learner.steps"),
        ("task.seed=-2", "task.seed"),
    ],
)
def test_absurd_numbers(capsys, tmp_path, item, key):
    train_with(capsys, tmp_path, item, named=(key,))


def test_zero_steps_flag(capsys, tmp_path):
    refused(capsys, train.main, [EAD, "--steps", "0", "--set", f"storage={tmp_path}"], "learner.steps")


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".", "..", "x" * 200, "with space", "~home", "nul\x00"])
def test_names_are_one_path_component(capsys, tmp_path, name):
    train_with(capsys, tmp_path, f"name={json.dumps(name)}", named=("name",))
    refused(capsys, sweep.main, [EAD, "--name", name, "--storage", str(tmp_path)], "name")


@pytest.mark.parametrize(
    "sets, key",
    [
        (("task.train_size=1000",), "task"),
        (("task.levels=[1]", "task.train_size=390", "task.val_size=20"), "task"),
        (("validation.num_prompts=400",), "validation.num_prompts"),
    ],
)
def test_sizes_the_task_cannot_meet(capsys, tmp_path, sets, key):
    train_with(capsys, tmp_path, *sets, named=(key,))


@pytest.mark.parametrize(
    "point, named",
    [
        ("{rollout.decoding.ead.tau_maxx: 1.2}", ("points_to_evaluate[1]", "tau_maxx")),
        ("{rollout.decoding.ead.tau_max: 9.0}", ("points_to_evaluate[1]", "outside")),
        ("{rollout.decoding.ead.d0: -1}", ("points_to_evaluate[1]", "d0")),
        ("{rollout.decoding.ead.tau_max: high}", ("points_to_evaluate[1]", "tau_max")),
    ],
)
def test_points_outside_the_space(capsys, tmp_path, point, named):
    baseline = "    - {rollout.decoding.ead.tau_max: 1.2, rollout.decoding.ead.d0: 25}\n"
    spec = tmp_path / "sweep.yaml"
    spec.write_text(open(EAD).read().replace(baseline, f"{baseline}    - {point}\n"))
    refused(capsys, sweep.main, [str(spec), "--storage", str(tmp_path)], *named)


def safetensors(path, declared_end: int, actual: int) -> None:
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [declared_end // 4], "data_offsets": [0, declared_end]}}
    ).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * actual)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda d: None, "not a folder"),
        (lambda d: d.mkdir(), "config.json"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{not json")), "unreadable"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{}")), "no weights"),
        (
            lambda d: (
                d.mkdir(),
                (d / "config.json").write_text("{}"),
                safetensors(d / "model.safetensors", 4096, 100),
            ),
            "truncated",
        ),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text("{}"), (d / "model.safetensors").write_bytes(b"")),
            "model.safetensors",
        ),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text("{}"), safetensors(d / "model.safetensors", 16, 16)),
            "tokenizer",
        ),
    ],
)
def test_model_folders_that_are_not_whole(capsys, tmp_path, make, expected):
    folder = tmp_path / "model"
    make(folder)
    train_with(capsys, tmp_path, f"model.path={folder}", named=("model.path", expected))


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "empty (0 bytes)"),
        (b"\xff\xfe\x00garbage\n", "not utf-8"),
        (b'{"prompt": "1+1", "nothing": "else"}\n', "no usable row"),
        (b"not json at all\n", "no usable row"),
    ],
)
def test_offline_files_that_yield_nothing(capsys, tmp_path, content, expected):
    data = tmp_path / "teachers.jsonl"
    data.write_bytes(content)
    line = train_with(
        capsys,
        tmp_path,
        f"offline.files=[{{path: {data}}}]",
        named=("offline.files[0].path",),
        spec="search_spaces/oger.yaml",
    )
    assert str(data) in line and expected in line.lower()


def test_a_data_files_own_problem_is_reported_before_what_combines_it_with_the_model(capsys, tmp_path):
    """offline_prompts on the tiny model also exceeds its positions (a prompt allowance of 1024): the user
    is told first what is wrong with the file, which they fix first."""
    data, bench = tmp_path / "prompts.jsonl", tmp_path / "math500.jsonl"
    data.write_bytes(b"\xff\xfe not text\n")
    bench.write_text(json.dumps({"problem": "1+1", "answer": "2", "unique_id": "a"}) + "\n")
    line = train_with(
        capsys,
        tmp_path,
        "task.name=offline_prompts",
        "offline.teachers=[]",
        f"validation.benchmarks={{math500: {bench}}}",
        f"offline.files=[{{path: {data}}}]",
        named=("offline.files[0].path", "not UTF-8"),
    )
    assert "max_new_tokens" not in line


def test_offline_file_missing_or_of_unknown_kind(capsys, tmp_path):
    for path in (tmp_path / "absent.jsonl", tmp_path / "teachers.txt"):
        train_with(
            capsys,
            tmp_path,
            f"offline.files=[{{path: {path}}}]",
            named=("offline.files[0].path", path.name),
            spec="search_spaces/oger.yaml",
        )


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"rollout: [unclosed\n", "not valid YAML"),
        (b"\xff\xfe\xfa\n", "not UTF-8"),
        (b"- a list\n", "mapping"),
        (b"", "the file is empty"),
        (b"# a comment\n\n   \n", "the file is empty"),
        (b"---\n...\n", "the file is empty"),
    ],
)
def test_specs_that_are_not_yaml_mappings(capsys, tmp_path, content, expected):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(content)
    refused(capsys, train.main, [str(spec)], str(spec), expected)
    refused(capsys, sweep.main, [str(spec)], str(spec))
    refused(capsys, study.main, [str(spec)], str(spec))


@pytest.mark.parametrize("item", ["learner.lr=[1, 2", "rollout.group_size={a: ", "seed=@x"])
def test_set_values_that_are_not_yaml(capsys, tmp_path, item):
    train_with(capsys, tmp_path, item, named=("--set", item.split("=")[0]))


@pytest.mark.parametrize(
    "uri", ["not a uri", "http://", "ftp://host/x", "sqlite://relative.db", "http://host:port", "sqlite:///"]
)
def test_malformed_tracking_uris(capsys, tmp_path, uri):
    train_with(capsys, tmp_path, f"logging.tracking_uri={json.dumps(uri)}", named=("logging.tracking_uri",))
    refused(capsys, sweep.main, [EAD, "--tracking-uri", uri, "--storage", str(tmp_path)], "--tracking-uri")


@pytest.mark.parametrize("key", ["storage", "cache_dir"])
def test_paths_that_are_files(capsys, tmp_path, key):
    file = tmp_path / "a-file"
    file.write_text("x")
    args = [EAD, "--set", f"{key}={file}"] + ([] if key == "storage" else ["--set", f"storage={tmp_path / 'r'}"])
    refused(capsys, train.main, args, key, str(file))
    refused(
        capsys,
        sweep.main,
        [EAD, "--set", f"{key}={file}", "--storage", str(tmp_path / "s")]
        if key == "cache_dir"
        else [EAD, "--storage", str(file)],
        str(file),
    )


@pytest.mark.parametrize(
    ("storage", "hosts", "fstype", "refused"),
    [
        ("/home/me/runs", {"head", "gpu-1"}, "ext4", True),  # a folder only the head sees
        ("/home/me/runs", {"head", "gpu-1", "gpu-2"}, "", True),  # unknown filesystem: not shown to be shared
        ("/mnt/team/runs", {"head", "gpu-1"}, "nfs4", False),  # every node mounts it
        ("/mnt/bucket/runs", {"head", "gpu-1"}, "fuse.s3fs", False),
        ("s3://bucket/runs", {"head", "gpu-1"}, "", False),
        ("/home/me/runs", {"laptop"}, "ext4", False),  # one machine, however many raylets
    ],
)
def test_a_local_storage_is_refused_on_a_cluster_of_several_hosts(storage, hosts, fstype, refused):
    from orchestrator.launch import storage_problem

    problem = storage_problem(storage, hosts, fstype)
    assert (problem is not None) == refused
    if refused:
        assert problem.startswith(f"storage: {storage}") and "URI" in problem and "\n" not in problem


def test_the_filesystem_of_a_folder_is_read_from_the_mounts(tmp_path):
    from orchestrator.launch import filesystem_type

    assert filesystem_type("/proc/self") == "proc" and filesystem_type(str(tmp_path))


@pytest.mark.parametrize(
    "item, key",
    [
        ("learner.steps=true", "learner.steps"),
        ("learner.steps=5.0", "learner.steps"),
        ("learner.steps='5'", "learner.steps"),
        ("rollout.group_size=8.0", "rollout.group_size"),
        ("learner.zero_stage=1.0", "learner.zero_stage"),
        ("algorithm.use_std=1", "algorithm.use_std"),
        ("validation.samples=false", "validation.samples"),
        ("learner.lr='1e-4'", "learner.lr"),
        ("task.levels=[1.0]", "task.levels"),
        ("rollout.decoding.ead.tau_max=true", "tau_max"),
    ],
)
def test_set_values_take_the_fields_exact_type(capsys, tmp_path, item, key):
    train_with(capsys, tmp_path, item, named=(key,))


@pytest.mark.parametrize("field, value", [("num_samples", "4.0"), ("seeds", "true"), ("max_concurrent_trials", "'1'")])
def test_search_fields_take_their_exact_type(capsys, tmp_path, field, value):
    spec = tmp_path / "sweep.yaml"
    text = re.sub(rf"^  {field}: .*$", f"  {field}: {value}", open(EAD).read(), count=1, flags=re.M)
    spec.write_text(
        text if f"  {field}: {value}" in text else text.replace("search:\n", f"search:\n  {field}: {value}\n")
    )
    refused(capsys, sweep.main, [str(spec), "--storage", str(tmp_path)], f"search: {field}")


def test_a_search_space_of_floats_over_an_integer_field(capsys, tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        open(EAD)
        .read()
        .replace(
            "    rollout.decoding.ead.d0: {loguniform: [5, 200]}",
            "    rollout.decoding.ead.d0: {loguniform: [5, 200]}\n    learner.steps: {uniform: [10, 20]}",
        )
    )
    refused(capsys, sweep.main, [str(spec), "--storage", str(tmp_path)], "search.space.learner.steps")


@pytest.mark.parametrize(
    "item, why",
    [
        ("checkpoint.keep_best_by=policy/entropyy", "not a step metric"),
        ("checkpoint.keep_best_by=val/accuracy_base", "not a step metric"),
        ("checkpoint.keep_best_by=timing/step", "namespaces"),
        ("checkpoint.keep_best_by=oger/divergence_mean", "oger"),  # the spec's GRPO computes no divergence
        ("checkpoint.keep_best_by=offline/accuracy", "teacher"),
        ("checkpoint.keep_best_by=val/pass_at_64", "validation metric"),
    ],
)
def test_metric_names_a_trial_of_the_spec_never_logs(capsys, tmp_path, item, why):
    line = train_with(capsys, tmp_path, item, named=("checkpoint.keep_best_by",))
    assert why in line


def test_a_metric_the_fixed_schedule_never_logs(capsys, tmp_path):
    train_with(
        capsys,
        tmp_path,
        "rollout.decoding.schedule=fixed",
        "checkpoint.keep_best_by=rollout/ead_decay",
        named=("checkpoint.keep_best_by", "schedule: ead"),
    )


def test_a_study_metric_one_arm_never_logs(capsys, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text(
        open("search_spaces/studies/oger_ablation.yaml")
        .read()
        .replace("metric: val/accuracy ", "metric: oger/exploration_mean ")
    )
    refused(capsys, study.main, [str(spec)], "study.metric", "arm grpo")


@pytest.mark.parametrize(
    "moment", ["2020-01-01T00:00:00", "2020-01-01T00:00:00+00:00", "'2020-01-01T10:00'", "2020-01-01"]
)
def test_deadlines_in_the_past(capsys, tmp_path, moment):
    train_with(capsys, tmp_path, f"checkpoint.save_by={moment}", named=("checkpoint.save_by",))


def test_a_deadline_ahead_is_taken_in_its_own_zone(tmp_path):
    from datetime import datetime, timedelta

    from orchestrator.spec import load_trial_spec

    ahead = (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="minutes")
    cfg = load_trial_spec(EAD, [f"checkpoint.save_by='{ahead}'", f"storage={tmp_path}"])
    assert cfg.checkpoint.save_by.tzinfo is not None and cfg.checkpoint.save_by > datetime.now(UTC)


@pytest.mark.parametrize(
    "item, key",
    [
        ("validation.samples=100000000", "validation.samples"),
        ("rollout.group_size=1000000", "rollout.group_size"),
        ("validation.samples_by_benchmark={arithmetic: 99999}", "validation.samples_by_benchmark"),
    ],
)
def test_sizes_that_expand_are_bounded(capsys, tmp_path, item, key):
    train_with(capsys, tmp_path, item, named=(key,))


def test_a_response_budget_beyond_the_models_positions(capsys, tmp_path):
    line = train_with(capsys, tmp_path, "rollout.max_new_tokens=400", named=("rollout.max_new_tokens", "512"))
    assert "at most 384" in line
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 100}))
    safetensors(folder / "model.safetensors", 16, 16)  # a whole folder: its own problems are reported first
    (folder / "tokenizer.json").write_text("{}")
    train_with(capsys, tmp_path, f"model.path={folder}", named=("rollout.max_new_tokens", str(folder / "config.json")))


def test_json_nested_deeper_than_the_stack(capsys, tmp_path):
    """A whole file nested too deeply is a one-line refusal; one such line among rows is a skipped row."""
    deep = "[" * 50_000 + "]" * 50_000
    (array := tmp_path / "math500.json").write_text(deep)
    train_with(
        capsys,
        tmp_path,
        f"validation.benchmarks={{math500: {array}}}",
        named=("validation.benchmarks.math500", "nested too deeply"),
    )
    (lines := tmp_path / "teachers.jsonl").write_text(deep + "\n")
    train_with(
        capsys,
        tmp_path,
        f"offline.files=[{{path: {lines}}}]",
        named=("offline.files[0].path", "invalid:json"),
        spec="search_spaces/oger.yaml",
    )
    row = {"problem": "What is 1+1?", "answer": "2", "unique_id": "a"}
    (mixed := tmp_path / "math500.jsonl").write_text(deep + "\n" + json.dumps(row) + "\n")
    from orchestrator.spec import load_trial_spec
    from trainables.data.benchmarks import load_benchmark

    load_trial_spec(EAD, [f"validation.benchmarks={{math500: {mixed}}}", f"storage={tmp_path}"])  # accepted
    problems, skipped = load_benchmark("math500", mixed, limit=10, seed=0)
    assert [p.answer for p in problems] == ["2"] and sum(skipped.values()) == 1


HEAVY = ("torch", "transformers", "ray", "mlflow", "deepspeed", "scipy", "vllm")


@pytest.mark.parametrize(
    "module, args",
    [
        ("train", [EAD, "--set", "learner.stepz=1"]),
        ("sweep", [EAD, "--set", "learner.steps=true"]),
        ("study", ["search_spaces/studies/ead_vs_fixed.yaml", "--set", "seed=-1"]),
        ("evaluate", ["tiny", "--samples", "0"]),
    ],
)
def test_a_refusal_comes_before_any_heavy_library_loads(module, args):
    """The edge is light: a bad input is refused before torch, Ray, MLflow or SciPy is imported (their
    imports are most of a command's first seconds)."""
    import subprocess
    import sys

    code = (
        f"import sys; from orchestrator import {module}; rc = {module}.main({args!r}); "
        f"print(rc, [m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "2 []", out.stdout + out.stderr


def test_validating_every_shipped_spec_loads_no_heavy_library():
    """Every spec under search_spaces/ validates (its sweep or study sections too) without torch, Ray,
    MLflow, SciPy, or math-verify and the SymPy it pulls: the edge checks names and numbers only."""
    import subprocess
    import sys

    code = (
        "import sys, glob\n"
        "from orchestrator.spec import load_trial_spec, load_sweep_spec\n"
        "from orchestrator.study import load_study_spec\n"
        "for path in sorted(glob.glob('search_spaces/**/*.yaml', recursive=True)):\n"
        "    text = open(path).read()\n"
        "    if 'study:' in text: load_study_spec(path, check_files=False)\n"
        "    elif 'search:' in text: load_sweep_spec(path, check_files=False)\n"
        "    else: load_trial_spec(path, check_files=False)\n"
        f"print([m for m in {(*HEAVY, 'math_verify', 'sympy')!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize(
    "main, args, named",
    [
        (sweep.main, [EAD, "--seeds", "100000"], "--seeds"),
        (sweep.main, [EAD, "--num-samples", "10000000"], "--num-samples"),
        (study.main, ["search_spaces/studies/ead_vs_fixed.yaml", "--seeds", "5000"], "--seeds"),
        (sweep.main, [EAD, "--set", "search.seeds=1000"], "search: seeds"),
        (sweep.main, [EAD, "--set", "search.confirm={seeds: 3, add: 3, max_seeds: 100000}"], "max_seeds"),
    ],
)
def test_counts_that_expand_into_runs_are_bounded(capsys, tmp_path, main, args, named):
    refused(capsys, main, [*args, "--storage", str(tmp_path)], named)


def test_exponent_notation_is_a_number_in_specs_and_sets(tmp_path):
    """YAML 1.1 reads `1e-4` as text; specs read it as the number a researcher means (YAML 1.2), so the
    strict type check takes it for a float field."""
    from orchestrator.spec import load_trial_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(open(EAD).read().replace("lr: 1.0e-4", "lr: 1e-4"))
    assert load_trial_spec(spec, [f"storage={tmp_path}"]).learner.lr == 1e-4
    assert load_trial_spec(EAD, ["learner.lr=3e-4", f"storage={tmp_path}"]).learner.lr == 3e-4
