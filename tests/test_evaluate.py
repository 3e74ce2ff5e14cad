"""python -m orchestrator.evaluate: bad input at the edge, a model folder and a trained trial's
checkpoint (exported to a Hugging Face folder) evaluated through the real rollout service."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator import evaluate, report, train
from orchestrator.spec import load_trial_spec
from orchestrator.tracking import default_tracking_uri
from trainables.runtime.checkpoint import manifest_seal, write_manifest
from trainables.runtime.seal import seal_key


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--benchmarks", "aime26=x.parquet"], "unknown benchmark 'aime26'"),
        (["--benchmarks", "math500"], "math500 needs its file"),
        (["--benchmarks", "math500=/nonexistent/m.parquet"], "/nonexistent/m.parquet"),
        (["--ead", "1.2,0.1"], "--ead: expected TAU_MAX,TAU_MIN,D"),
        (["--ead", "0.1,1.2,25"], "--ead: expected"),
        (["--temperatures", "1:0.1:0.1"], "--temperatures: expected START:STOP:STEP"),
        (["--samples", "0"], "--samples must be between 1 and"),
        (["--samples", "100000000"], "--samples must be between"),
        (["--temperatures", "0.1:1.0:1e-9"], "at most 100"),
        (["--temperatures", "0.1:inf:0.1"], "--temperatures: expected"),
        (["--temperatures", "0.1:nan:0.1"], "--temperatures: expected"),
    ],
)
def test_bad_arguments_are_one_line(tiny_model_path, capsys, extra, expected):
    assert evaluate.main([str(tiny_model_path), *extra]) == 2
    out = capsys.readouterr().out
    assert expected in out and len(out.strip().splitlines()) == 1, out


def test_not_a_model_or_trial(tmp_path, capsys):
    assert evaluate.main([str(tmp_path)]) == 2
    assert "neither a Hugging Face model folder" in capsys.readouterr().out
    assert evaluate.main(["smollm2-135m"]) == 2  # not a folder, not quite a preset's name
    assert "nor a preset (tiny, smollm2-135m-instruct)" in capsys.readouterr().out


@pytest.mark.slow
def test_trained_trial_is_exported_and_evaluated(ray_cluster, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_trial_spec("search_spaces/ead.yaml", [f"storage={tmp_path}", "learner.steps=2", "validation.every=0"])
    train.run(cfg)
    trial = tmp_path / "ead"
    out = tmp_path / "eval.json"
    assert (
        evaluate.main(
            [
                str(trial),
                "--benchmarks",
                "arithmetic",
                "--limit",
                "8",
                "--samples",
                "4",
                "--temperatures",
                "0.3:0.6:0.3",
                "--out",
                str(out),
            ]
        )
        == 0
    )

    record = json.loads(out.read_text())
    assert set(record["results"]) == {"T0.3", "T0.6"}
    row = record["results"]["T0.6"]["arithmetic"]
    assert set(row) == {"avg@4", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4", "worst@4"}
    assert 0 <= row["worst@4"] <= row["avg@4"] <= row["pass@4"] <= 1 and row["avg@4"] == row["pass@1"]
    problems = record["problems"]["T0.6"]["arithmetic"]
    assert len(problems) == 8 and all(len(p["responses"]) == 4 for p in problems)

    # The export is a model folder transformers loads and generates with.
    exported = trial / "export"
    (folder,) = exported.iterdir()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("<think>", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
    assert (folder / "model.safetensors").is_file() and (folder / "generation_config.json").is_file()

    # MLflow: the evaluation is a run nested under the trial's run, with its table and results file.
    client = MlflowClient(default_tracking_uri(str(tmp_path)))
    runs = client.search_runs([client.get_experiment_by_name("rlvr-explore").experiment_id])
    (trial_run,) = [r for r in runs if r.data.tags.get("kind") == "trial"]
    (eval_run,) = [r for r in runs if r.data.tags.get("kind") == "evaluation"]
    assert eval_run.data.tags["mlflow.parentRunId"] == trial_run.info.run_id
    assert eval_run.data.metrics["eval/T0.6/arithmetic/avg_at_4"] == row["avg@4"]
    assert [a.path for a in client.list_artifacts(eval_run.info.run_id)] == ["eval.json"]

    # The trial's report draws its curves and the pass@k curve of this evaluation.
    assert report.main([str(trial)]) == 0
    from PIL import Image

    for name in ("curves.png", "temperature.png", "pass_at_k.png"):
        with Image.open(trial / "report" / name) as image:
            image.verify()
    assert "pass_at_k.png" in (trial / "report" / "report.md").read_text()


def trial_folder(tmp_path, snapshot: str, checkpoints: dict[str, dict[str, str]] | None = None):
    """A trial folder as Ray Train leaves one: its snapshot, and checkpoint folders with the given files."""
    target = tmp_path / "trial"
    target.mkdir()
    (target / "checkpoint_manager_snapshot.json").write_text(snapshot)
    for name, files in (checkpoints or {}).items():
        (target / name).mkdir()
        for file, text in files.items():
            (target / name / file).write_text(text)
    return target


def snapshot_of(*names: str) -> str:
    return json.dumps(
        {
            "checkpoint_results": [{"checkpoint_dir_name": n, "metrics": {}} for n in names],
            "latest_checkpoint_result": {"checkpoint_dir_name": names[-1]} if names else None,
        }
    )


@pytest.mark.parametrize(
    "snapshot, expected",
    [
        ("", "Invalid JSON"),
        ("{" * 5000 + "}" * 5000, "JSON"),
        ("[]", "object"),
        ('{"checkpoint_results": "x"}', "checkpoint_results"),
        ('{"checkpoint_results": [{"checkpoint_dir_name": 7}]}', "string"),
        (snapshot_of("../.."), "one folder name"),
        (snapshot_of("/etc"), "one folder name"),
    ],
)
def test_a_trial_folder_whose_snapshot_is_malformed_is_one_line(tmp_path, capsys, snapshot, expected):
    target = trial_folder(tmp_path, snapshot)
    assert evaluate.main([str(target)]) == 2
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and expected in out and "checkpoint_manager_snapshot.json" in out, out


def manifest(rank_files: dict[str, str]) -> str:
    """Rank 0's manifest of `rank_files`, sealed with this user's key (as a trial of this product writes it)."""
    import hashlib

    files = {
        name: {"size": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
        for name, text in rank_files.items()
    }
    return json.dumps({"rank": 0, "world_size": 1, "files": files, "seal": manifest_seal(0, 1, files, seal_key())})


@pytest.mark.parametrize(
    "state, expected",
    [
        ("{not json", "trial_state.json"),
        (json.dumps({"step": 1}), "base_val"),
        (
            json.dumps(
                {"step": "1", "base_val": {}, "val_history": [], "metrics": {}, "model_path": "/x", "trial": {}}
            ),
            "step",
        ),
        (
            json.dumps(
                {
                    "step": 1,
                    "base_val": {},
                    "val_history": [],
                    "metrics": {},
                    "model_path": "/x",
                    "trial": {},
                    "extra": 1,
                }
            ),
            "extra",
        ),
        (
            json.dumps(
                {"step": 1, "base_val": {}, "val_history": [], "metrics": {}, "model_path": "/etc", "trial": {}}
            ),
            "model_path",
        ),
    ],
)
def test_checkpoints_whose_trial_state_is_malformed_are_unusable(tmp_path, capsys, state, expected):
    files = {"trial_state.json": state}
    target = trial_folder(
        tmp_path, snapshot_of("checkpoint_1"), {"checkpoint_1": {**files, "MANIFEST.rank_0.json": manifest(files)}}
    )
    assert evaluate.main([str(target)]) == 2
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]  # the error itself names the file and what was wrong with it
    assert "checkpoint_1 is unusable" in out and "no intact checkpoint" in last, out
    assert "trial_state.json" in last and expected in last, out
    assert not (target / "export").exists()


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        json.dumps({"rank": 0, "world_size": 1, "files": []}),
        json.dumps({"rank": 0, "world_size": 1, "files": {"a": {"size": -1, "sha256": "0" * 64}}}),
        json.dumps({"rank": 0, "world_size": 1, "files": {"/etc/passwd": {"size": 1, "sha256": "0" * 64}}}),
    ],
)
def test_checkpoints_whose_manifest_is_malformed_are_unusable(tmp_path, capsys, text):
    target = trial_folder(tmp_path, snapshot_of("checkpoint_1"), {"checkpoint_1": {"MANIFEST.rank_0.json": text}})
    assert evaluate.main([str(target)]) == 2
    out = capsys.readouterr().out
    assert "checkpoint_1 is unusable" in out and "no intact checkpoint" in out, out


def test_a_checkpoint_that_links_out_of_the_trial_folder_is_never_read(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = trial_folder(tmp_path, snapshot_of("checkpoint_1"))
    (target / "checkpoint_1").symlink_to(outside)
    assert evaluate.main([str(target)]) == 2
    out = capsys.readouterr().out
    assert "links out of the trial folder" in out or "a link out of the trial folder" in out, out
    assert "no intact checkpoint" in out


class Payload:
    """What a crafted checkpoint file would run when unpickled: it creates a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_whose_deepspeed_files_are_foreign_is_refused_in_one_line_naming_the_file(
    tiny_model_path, tmp_path, capsys
):
    """The weights-only guard holds inside DeepSpeed's loader, and the user reads which file it refused."""
    import torch

    marker = tmp_path / "ran"
    target = trial_folder(tmp_path, snapshot_of("checkpoint_1"), {"checkpoint_1": {}})
    folder = target / "checkpoint_1"
    (folder / "engine").mkdir()
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        torch.save({"module": Payload(marker)}, folder / "engine" / name)
    (folder / "engine" / "latest").write_text("engine")
    state = {
        "step": 1,
        "base_val": {},
        "val_history": [],
        "metrics": {},
        "model_path": str(tiny_model_path),
        "trial": {},
    }
    (folder / "trial_state.json").write_text(json.dumps(state))
    write_manifest(folder, 0, 1)
    assert evaluate.main([str(target)]) == 2
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("error:") and "engine/mp_rank_00_model_states.pt" in last and "refused unread" in last, out
    assert not marker.exists() and not (target / "export" / "checkpoint_1" / "config.json").exists()
    # Sealed by someone else's key: refused for that first, in one line naming the manifest; trusted, its
    # files are still read as data only.
    write_manifest(folder, 0, 1, key=b"their key")
    assert evaluate.main([str(target)]) == 2
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "MANIFEST.rank_0.json does not match its seal" in last and "--trust-unsealed" in last, last
    assert evaluate.main([str(target), "--trust-unsealed"]) == 2
    assert "refused unread" in capsys.readouterr().out.strip().splitlines()[-1] and not marker.exists()


def test_a_configurations_folder_gives_the_seed_asked_for(tmp_path):
    """A sweep configuration's checkpoint holds each seed's part in seed_<r>/; a trial's is the part itself."""
    trial = tmp_path / "checkpoint_1"
    trial.mkdir()
    assert evaluate.seed_part(trial, 0) == (trial, "checkpoint_1")
    for r in (0, 1):
        (trial / f"seed_{r}").mkdir()
    assert evaluate.seed_part(trial, 1) == (trial / "seed_1", "checkpoint_1-seed_1")
    with pytest.raises(ValueError, match="holds 2 seeds' parts"):
        evaluate.seed_part(trial, 2)
