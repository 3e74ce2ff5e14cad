"""The report opens on the answer (orchestrator/answer.py): on a hand-made MLflow record of a finished sweep
whose confirmation ran two looks, the verdict comes first, then each pair and each look's interval as
`decisions.confirm_step` computes them, and the runs table lists both stages."""

from __future__ import annotations

import yaml
from mlflow.tracking import MlflowClient

from orchestrator import answer, report
from orchestrator.decisions import confirm_step, looks

WINNER, BASELINE = [0.42, 0.44, 0.43, 0.45], [0.40, 0.41, 0.39, 0.42]  # seeds 2..5
CONFIRM = {"seeds": 2, "add": 2, "max_seeds": 4, "alpha": 0.05}
VERDICT = "confirmed on fresh seeds: winner - baseline (val/accuracy) = +0.030 [...]: better than the baseline"


def record(tmp_path) -> tuple[MlflowClient, object, list]:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("rlvr-explore")
    parent = client.create_run(
        exp,
        run_name="s",
        tags={
            "kind": "sweep",
            "sweep": "s",
            "state": "finished",
            "mlflow.note.content": VERDICT,
            "best_trial": "aaaa",
            "verdict": "better",
            "verdict_stage": "confirm",
            "verdict_config": "aaaa",
            "baseline": "bbbb",
        },
    ).info.run_id
    client.log_text(parent, yaml.safe_dump({"metric": "val/accuracy", "confirm": CONFIRM}), "search.yaml")
    for config, values in (("aaaa", WINNER), ("bbbb", BASELINE)):
        for seed, value in enumerate(values, start=2):
            run = client.create_run(
                exp,
                run_name=f"confirm {config} seed={seed}",
                tags={
                    "kind": "trial",
                    "sweep": "s",
                    "stage": "confirm",
                    "config": config,
                    "seed": str(seed),
                    "state": "finished",
                },
            ).info.run_id
            client.log_metric(run, "val/accuracy", value, step=30)
    runs = client.search_runs([exp], "tags.kind = 'trial'")
    return client, client.get_run(parent), runs


def test_the_report_opens_on_the_answer_then_the_confirmation(tmp_path):
    client, parent, runs = record(tmp_path)
    opening = answer.answer_lines(parent, tmp_path / "s")
    assert opening[:3] == ["## Answer", "", VERDICT] and "--best-of" in opening[4] and "`aaaa`" in opening[4]
    lines = answer.confirmation_section(client, parent, runs, "val/accuracy", "max", tmp_path, report.pyplot())
    diffs = [w - b for w, b in zip(WINNER, BASELINE, strict=True)]
    counts = looks(2, 2, 4)
    assert counts == [2, 4]
    pairs = [line for line in lines if line.startswith("| ") and line[2].isdigit() and line.count("|") == 5]
    assert [line.split(" | ")[3].rstrip(" |") for line in pairs] == [f"{d:+.4f}" for d in diffs]
    for n in counts:  # each look: its own share of alpha and interval, as the sweep decided it
        look = confirm_step(diffs[:n], counts, 0.05, None, "max", "obrien-fleming")
        assert any(
            line.startswith(
                f"| {n} | {look.alpha:.4f} | {look.mean:+.4f} | [{look.low:+.4f}, {look.high:+.4f}] | {look.verdict} |"
            )
            for line in lines
        ), (n, lines)
    assert (tmp_path / "confirmation.png").read_bytes()[:4] == b"\x89PNG"
    text = report.markdown(
        "sweep s", runs, [], ("val/accuracy",), ["confirmation.png"], {}, [], "| table |", 0, opening + lines
    )
    assert text.index("## Answer") < text.index("## Confirmation") < text.index("## Selection")
    assert text.count("](confirmation.png)") == 1  # in the confirmation, not again among the plots
    runs_table = text[text.index("## Runs") :]
    assert runs_table.count("| confirm |") == 8


def test_no_answer_before_the_sweep_ends_and_no_confirmation_without_one(tmp_path):
    client, parent, runs = record(tmp_path)
    client.set_tag(parent.info.run_id, "state", "running")
    client.set_tag(parent.info.run_id, "verdict_stage", "select")
    parent = client.get_run(parent.info.run_id)
    assert answer.answer_lines(parent, tmp_path) == []
    assert answer.confirmation_section(client, parent, runs, "val/accuracy", "max", tmp_path, report.pyplot()) == []
