"""Bad input at the edge: each invalid spec gives one line naming the key and what was expected."""

import textwrap

import pytest

from orchestrator.spec import SpecError, load_trial_spec, parse_overrides


def write(tmp_path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path, overrides=None) -> str:
    with pytest.raises(SpecError) as info:
        load_trial_spec(path, overrides)
    return str(info.value)


def test_shipped_spec_is_valid():
    cfg = load_trial_spec("search_spaces/ead.yaml")
    assert cfg.rollout.decoding.schedule == "ead"
    assert cfg.validation.decoding.schedule == "fixed"  # validation is not annealed by default


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ("rollout: {group_sise: 8}\n", "rollout.group_sise", "unknown key"),
        ("rollout: {group_size: 1}\n", "rollout.group_size", "greater than or equal to 2"),
        ("learner: {lr: fast}\n", "learner.lr", "valid number"),
        (
            "rollout: {decoding: {ead: {tau_min: 1.5, tau_max: 1.2}}}\n",
            "rollout.decoding.ead",
            "tau_min must be <= tau_max",
        ),
        ("rollout: {decoding: {ead: {d0: 0}}}\n", "rollout.decoding.ead.d0", "greater than 0"),
        ("rollout: {decoding: {schedule: hot}}\n", "rollout.decoding.schedule", "'ead' or 'fixed'"),
        ("algorithm: {loss_agg: mean}\n", "algorithm.loss_agg", "token-mean"),
        ("task: {levels: [9]}\n", "task", "levels must be a non-empty list"),
        ("learner: {num_workers: 3, prompts_per_step: 8}\n", "learner.prompts_per_step", "divisible"),
        ("validation: {num_prompts: 500}\n", "validation.num_prompts", "task.val_size"),
        ("checkpoint: {keep_best_by: accuracy}\n", "checkpoint", "'accuracy' is not a trial metric"),
        ("checkpoint: {save_by: soon}\n", "checkpoint.save_by", "datetime"),
        ("storage: s3://bucket/runs\n", "logging.tracking_uri", "is needed with a storage URI"),
        ("validation: {benchmarks: {}}\n", "validation", "benchmarks is empty"),
        ("validation: {benchmarks: {aime26: a.jsonl}}\n", "validation", "unknown benchmark 'aime26'"),
        ("validation: {benchmarks: {aime24: null}}\n", "validation", "benchmarks.aime24 needs its file"),
        ("validation: {benchmarks: {arithmetic: a.jsonl}}\n", "validation", "arithmetic is built in"),
        ("validation: {benchmarks: {aime24: nowhere.jsonl}}\n", "validation.benchmarks.aime24", "nowhere.jsonl"),
        (
            "checkpoint: {keep_best_by: val/aime24/avg_at_2}\n",
            "checkpoint.keep_best_by",
            "not a validation metric of this spec",
        ),
        ("task: {name: offline_prompts}\n", "<top>", "offline_prompts takes its prompts from offline.files"),
        ("rollout: {tensor_parallel_size: 2}\n", "<top>", "need rollout.backend: vllm"),
        ("rollout: {backend: vllm, colocate: true, num_gpus: 0.3}\n", "<top>", "needs learner.use_gpu: true"),
        (
            "rollout: {backend: vllm, num_gpus: 1, tensor_parallel_size: 2}\n",
            "<top>",
            "must equal rollout.tensor_parallel_size",
        ),
        ("model: {path: /m, preset: smollm2-135m-instruct}\n", "model", "give path or preset, not both"),
        (
            "rollout: {num_engines: 3}\nlearner: {num_workers: 2}\n",
            "<top>",
            "rollout.num_engines (3) must be <= learner.num_workers (2)",
        ),
        ("rollout: {weight_transfer: nccl}\n", "<top>", "rollout.weight_transfer nccl sends between GPUs"),
        ("rollout: {weight_transfer: ray}\n", "rollout.weight_transfer", "'object_store', 'gloo', 'nccl' or 'ipc'"),
        ("rollout: {weight_transfer: ipc}\n", "<top>", "rollout.weight_transfer ipc maps the learner's GPU memory"),
        ("rollout: {overlap: 2}\n", "rollout.overlap", "0 or 1"),
        (
            "rollout: {backend: vllm, colocate: true, num_gpus: 0.5, overlap: 1}\nlearner: {use_gpu: true}\n",
            "<top>",
            "rollout.overlap: 1 generates while the learner trains",
        ),
    ],
)
def test_bad_spec_names_the_key(tmp_path, text, key, expected):
    message = error_of(write(tmp_path, text))
    first = message.splitlines()[0]
    assert str(tmp_path / "spec.yaml") in first
    assert key in first and expected in first, first


def test_every_problem_gets_its_own_line(tmp_path):
    message = error_of(write(tmp_path, "rollout: {group_size: 1, max_new_tokens: 0}\n"))
    lines = message.splitlines()
    assert len(lines) == 2
    assert any("rollout.group_size" in line for line in lines)
    assert any("rollout.max_new_tokens" in line for line in lines)


def test_set_overrides_any_field(tmp_path):
    path = write(tmp_path, "learner: {steps: 5}\n")
    cfg = load_trial_spec(path, ["learner.steps=7", "rollout.decoding.ead.tau_max=1.5", "rollout.tis_cap=null"])
    assert cfg.learner.steps == 7
    assert cfg.rollout.decoding.ead.tau_max == 1.5
    assert cfg.rollout.tis_cap is None


def test_set_errors_name_the_key(tmp_path):
    path = write(tmp_path, "learner: {steps: 5}\n")
    assert "learner.stepz" in error_of(path, ["learner.stepz=3"])
    assert "learner.steps" in error_of(path, ["learner.steps.x=3"])
    with pytest.raises(SpecError, match="KEY.PATH=VALUE"):
        parse_overrides(["learner.steps"])


def test_missing_or_broken_file(tmp_path):
    assert "no such spec file" in error_of(tmp_path / "nope.yaml")
    assert "not valid YAML" in error_of(write(tmp_path, "rollout: [\n"))


@pytest.mark.parametrize("spec", ["search_spaces/ead.yaml", "search_spaces/oger.yaml", "search_spaces/all.yaml"])
def test_shipped_sweep_specs_are_valid(spec):
    from orchestrator.spec import load_sweep_spec

    trial, search, _ = load_sweep_spec(spec)
    assert search.space and trial.validation.every > 0


def test_validation_benchmarks_name_their_metrics_and_paths_become_absolute(tmp_path, monkeypatch):
    from orchestrator.spec import load_sweep_spec

    (tmp_path / "aime24.jsonl").write_text('{"problem": "1+1", "answer": "2", "id": 1}\n')
    monkeypatch.chdir(tmp_path)  # a relative file is read from where the command runs, not the trial's folder
    path = write(
        tmp_path,
        """\
        validation: {samples: 4, benchmarks: {arithmetic: null, aime24: aime24.jsonl}}
        checkpoint: {keep_best_by: val/aime24/maj_at_4}
        search: {metric: val/macro/pass_at_4, space: {learner.lr: {value: 0.001}}}
        """,
    )
    trial, search, _ = load_sweep_spec(path)
    assert trial.validation.benchmarks["aime24"] == str(tmp_path / "aime24.jsonl")
    assert "val/aime24/worst_at_4" in trial.validation.metric_names()
    path.write_text(path.read_text().replace("val/macro/pass_at_4", "val/macro/pass_at_8"))
    with pytest.raises(SpecError, match="search.metric: val/macro/pass_at_8 is not a validation metric"):
        load_sweep_spec(path)


def test_local_cluster_counts_every_actor_that_reserves_cpus():
    """A local cluster too small for the trial's actors would leave one waiting for a CPU forever."""
    from orchestrator.launch import logical_cpus

    sizes = ["learner.cpus_per_worker=100", "rollout.num_cpus=10", "encoder.num_cpus=50"]  # past any machine's cores
    oger = load_trial_spec("search_spaces/oger.yaml", sizes)
    grpo = load_trial_spec("search_spaces/oger.yaml", [*sizes, "algorithm.name=grpo"])
    assert logical_cpus(grpo) == 2 * 100 + 10 + 1  # the ranks, the engine, the trial's driver
    assert logical_cpus(oger) == logical_cpus(grpo) + 50  # and the encoder actor, which only oger* starts
