"""The CLIs at the edge: bad input exits non-zero with one line saying what to fix; plain output off a terminal."""

import os
import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.train", *args], capture_output=True, text=True, timeout=120
    )


def test_bad_spec_exits_with_one_line(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("rollout: {decoding: {ead: {tau_min: 2.0}}}\n")
    result = run_cli(str(spec))
    assert result.returncode == 2
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and "rollout.decoding.ead" in lines[0] and "tau_min must be <= tau_max" in lines[0]
    assert "Traceback" not in result.stderr


def test_missing_model_folder_exits_with_one_line(tmp_path):
    result = run_cli(
        "search_spaces/ead.yaml", "--set", f"model.path={tmp_path / 'nowhere'}", "--set", f"storage={tmp_path / 'runs'}"
    )
    assert result.returncode == 2
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and "model.path" in lines[0] and "config.json" in lines[0]


def test_the_ui_of_a_folder_without_a_store_is_one_line(tmp_path):
    for args in ([str(tmp_path)], [str(tmp_path / "nowhere")], [str(tmp_path), "--port", "70000"], [str(tmp_path)]):
        if args[-1] == "70000":
            (tmp_path / "mlflow.db").write_bytes(b"")
        elif (tmp_path / "mlflow.db").exists():
            (tmp_path / "mlflow.db").write_bytes(b"not a database, " * 100)
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.ui", *args], capture_output=True, text=True, timeout=60
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert (
            "--port"
            if args[-1] == "70000"
            else "not an MLflow sqlite store"
            if (tmp_path / "mlflow.db").exists()
            else "holds no mlflow.db"
        ) in lines[0]


def test_off_a_terminal_the_libraries_write_plain_lines():
    """A command whose output goes to a file: no progress bars and no colour codes in Ray's prefixes (a
    variable the user set stays); a trial's own lines pass Ray's dedup, each seed's its own."""
    import re

    code = (
        "import os, orchestrator; print(*(os.environ.get(k) for k in sorted(orchestrator.TQDM_OFF_TERMINAL)));"
        "print(os.environ['RAY_DEDUP_LOGS_ALLOW_REGEX'])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TQDM_", "HF_HUB_"))}
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    values, allow = plain.stdout.splitlines()
    assert values.split() == ["1", "0", "30"]  # HF bars off, no colour, a library bar's line every 30 s
    assert re.search(allow, "[trial 80e9af84_seed1] validation of the base policy: reused")
    assert not re.search(allow, "(raylet) WARNING: 8 PYTHON worker processes have been started")
    kept = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**env, "RAY_COLOR_PREFIX": "1"}
    )
    assert kept.stdout.split()[1] == "1"
