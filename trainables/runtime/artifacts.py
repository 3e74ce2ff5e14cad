"""Small per-trial artifacts for MLflow: a sample of rollouts with their rewards, the validation curve."""

from __future__ import annotations

import io
import json


def rollout_samples_jsonl(
    step: int,
    questions: list[str],
    golds: list[str],
    texts: list[str],
    rewards: list[float],
    finish_reasons: list[str],
    offpolicy: list[bool],
    group_size: int,
    limit: int,
) -> str:
    """The first `limit` rows of a step's groups (row i answers question i // group_size), one JSON each."""
    lines = []
    for i in range(min(limit, len(texts))):
        p = i // group_size
        lines.append(
            json.dumps(
                {
                    "step": step,
                    "question": questions[p],
                    "gold": golds[p],
                    "response": texts[i],
                    "reward": rewards[i],
                    "finish_reason": finish_reasons[i],
                    "source": "offline" if offpolicy[i] else "online",
                }
            )
        )
    return "\n".join(lines) + "\n"


def validation_curve(history: list[tuple[int, dict[str, float]]], title: str) -> tuple[str, bytes]:
    """(CSV, PNG) of val/* against the RL step; step 0 is the base policy. One panel per benchmark
    (its avg@k, pass@k, maj@k, worst@k), one for the overall accuracy (its standard error drawn as a
    95% band, not a line), one for response lengths."""
    import matplotlib

    matplotlib.use("Agg")  # no display on workers
    import matplotlib.pyplot as plt

    keys = sorted({k for _, metrics in history for k in metrics})
    rows = ["step," + ",".join(keys)]
    rows += [f"{step}," + ",".join(f"{m.get(k, float('nan')):.6g}" for k in keys) for step, m in history]
    panels: dict[str, list[str]] = {}
    for key in keys:  # val/accuracy -> "overall"; val/<benchmark>/<metric> -> "<benchmark>"
        parts = key.split("/")
        panel = "response length" if key.endswith("response_length") else (parts[1] if len(parts) > 2 else "overall")
        panels.setdefault(panel, []).append(key)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.2), squeeze=False)
    steps = [s for s, _ in history]
    for ax, (panel, members) in zip(axes[0], panels.items()):
        for key in (k for k in members if not k.endswith("_se")):  # a standard error is its metric's band
            label = key.removeprefix("val/") if panel in ("overall", "response length") else key.split("/")[-1]
            values = [m.get(key, float("nan")) for _, m in history]
            (line,) = ax.plot(steps, values, marker="o", label=label)
            if f"{key}_se" in keys:
                half = [1.96 * m.get(f"{key}_se", float("nan")) for _, m in history]
                ax.fill_between(
                    steps,
                    [v - h for v, h in zip(values, half)],
                    [v + h for v, h in zip(values, half)],
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                    label=f"{label} 95% (validation SE)",
                )
        ax.set_xlabel("RL step")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return "\n".join(rows) + "\n", png.getvalue()
