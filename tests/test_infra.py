"""infra/ and search_spaces/paper/: what can be checked without a cloud or a GPU. The launcher config
against Ray's own schema, the Kubernetes manifests rendered as `envsubst` renders them, the image's
pins against the project's, and every paper-scale spec valid with the numbers it amounts to."""

from __future__ import annotations

import re
import string
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from orchestrator import sweep, train
from orchestrator.spec import load_sweep_spec, load_trial_spec

REPO = Path(__file__).resolve().parent.parent
INFRA = REPO / "infra"
PAPER = sorted((REPO / "search_spaces" / "paper").glob("*.yaml"))
RENDER = {
    "IMAGE": "registry.example/rlvr-explore:gpu",
    "BUCKET": "s3://bucket/rlvr",
    "SPEC": "search_spaces/paper/oger_sweep_1.5b.yaml",
    "MLFLOW_URI": "http://mlflow.rlvr.svc:5000",
    "OPERATOR_NAMESPACE": "kuberay-system",
}


def render(path: Path) -> list[dict]:
    """The manifest as `VAR=... envsubst < path` writes it, parsed; every variable must be given."""
    text = string.Template(path.read_text()).substitute(RENDER)  # KeyError on a variable not in RENDER
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_launcher_config_passes_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((INFRA / "cluster" / "aws-spot.yaml").read_text())
    validate_config(prepare_config(config))
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "0.0.0.0" not in head_start  # reached by a tunnel
    nodes = config["available_node_types"]
    assert nodes["head"]["resources"] == {"CPU": 0}  # the head runs no trial
    assert nodes["gpu_spot"]["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert "InstanceMarketOptions" not in nodes["head"]["node_config"]  # the head is on demand


def test_rayjob_renders_into_a_sweep_on_spot_gpus():
    (job,) = render(INFRA / "k8s" / "rayjob-sweep.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"] == (
        f"python -m orchestrator.sweep {RENDER['SPEC']} --storage {RENDER['BUCKET']} "
        f"--tracking-uri {RENDER['MLFLOW_URI']}"
    )
    load_sweep_spec(REPO / RENDER["SPEC"], check_files=False)  # the spec it runs is valid
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == version("ray")
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["template"]["spec"]["containers"][0]["image"] == RENDER["IMAGE"]
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["template"]["spec"]["nodeSelector"] == {"karpenter.sh/capacity-type": "spot"}
    container = workers["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8" and container["image"] == RENDER["IMAGE"]
    volumes = {v["name"]: v for v in head["template"]["spec"]["volumes"]}
    assert volumes["sweeps"]["persistentVolumeClaim"]["claimName"] == "rlvr-sweeps"


def test_mlflow_manifest_renders_with_the_projects_mlflow():
    docs = render(INFRA / "k8s" / "mlflow.yaml")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("PersistentVolumeClaim", "mlflow-store"),
        ("PersistentVolumeClaim", "rlvr-sweeps"),
        ("Deployment", "mlflow"),
        ("Service", "mlflow"),
    }
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].endswith(f":v{version('mlflow')}")  # the server speaks the client's version
    assert f"{RENDER['BUCKET']}/mlflow-artifacts" in container["command"]


def test_network_policies_fence_mlflow_and_the_dashboard():
    policies = {d["metadata"]["name"]: d["spec"] for d in render(INFRA / "k8s" / "network-policy.yaml")}
    (mlflow,) = [d for d in render(INFRA / "k8s" / "mlflow.yaml") if d["kind"] == "Deployment"]
    labels = mlflow["spec"]["template"]["metadata"]["labels"]
    assert policies["mlflow-private"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policies["mlflow-private"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"port": 5000, "protocol": "TCP"}]}
    ]
    dashboard = policies["ray-dashboard-private"]
    assert dashboard["podSelector"]["matchLabels"] == {"ray.io/node-type": "head"}  # KubeRay's label on the head pod
    (rule,) = dashboard["ingress"]
    assert rule["from"][1]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kuberay-system"}


def test_image_pins_match_the_project():
    dockerfile = (INFRA / "Dockerfile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert base.startswith(f"rayproject/ray:{version('ray')}-py311-")
    (gpu_pin,) = pyproject["project"]["optional-dependencies"]["gpu"]
    assert f'pip install "{gpu_pin}"' in dockerfile  # the same vLLM range as the gpu extra
    assert 'pip install ".[gpu]"' in dockerfile
    for source in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert (REPO / source).exists(), source


@pytest.mark.parametrize("spec", PAPER, ids=[p.stem for p in PAPER])
def test_paper_specs_validate_and_print_what_they_amount_to(spec, capsys):
    if "sweep" in spec.stem:
        trial, search, _ = load_sweep_spec(spec, check_files=False)
        assert sweep.main([str(spec), "--dry-run"]) == 0
    else:
        trial = load_trial_spec(spec, check_files=False)
        assert train.main([str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "128 prompts x 8 rollouts = 1024 sequences of <= 8192 new tokens, 2 optimizer step(s) of 64 prompts" in out
    assert f"{trial.learner.steps} RL steps = {2 * trial.learner.steps} optimizer steps" in out
    assert trial.gpus == 8 and "8 GPU(s)" in out  # one 8-GPU node per trial
    assert "4 learner rank(s) on GPUs" in out and "2 rollout engine(s) (vllm) on 2 GPU(s) each" in out
    entropy = 0.001 if trial.algorithm.name == "luffy" else 0.01  # LUFFY's own script; the OGER paper's
    assert trial.learner.lr == 1e-6 and trial.algorithm.kl_coef == 0 and trial.algorithm.entropy_coef == entropy
    assert trial.prompt.template == "openr1" and trial.prompt.prefill == "<think>\n"
    assert "learner: fits" in out and "WILL NOT FIT" not in out  # the memory pre-flight
    assert trial.model.config_overrides == {"rope_theta": 40000.0, "max_position_embeddings": 16384}
    assert trial.rollout.backend == "vllm" and trial.offline.files


def test_gpu_smoke_learner_side_runs_on_cpu():
    """infra/gpu_smoke.py --learner-only (no Ray, no vLLM) as a GPU machine runs it, here on CPUs."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "infra/gpu_smoke.py", "--cpu", "--learner-only", "--zero-stage", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "ZeRO-2" in out.stdout and "FAILED" not in out.stdout
    assert out.stdout.count("  ok  ") == 3  # moved, held by the engine, changes the samples (IPC: GPUs only)


def test_gpu_memory_check_runs_through_its_cpu_path(tmp_path):
    """infra/gpu_memory.py --cpu: the learner at the tiny preset's shapes, every phase measured and estimated."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "infra/gpu_memory.py", "--cpu", "--json", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "m.json").read_text())
    assert list(result["phases"]) == ["forward", "backward", "optimizer step", "weight push"]
    for phase, row in result["phases"].items():
        assert row["measured_gib"] > 0 and row["preflight_gib"] > 0, phase
        assert f"{phase:<16}{row['measured_gib']:>14.2f}" in out.stdout
