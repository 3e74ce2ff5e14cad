"""The commands' console: every table keeps its numbers whole, on a terminal or off one.

Off a terminal (a log, CI, a notebook) rich assumes 80 columns and ends every cell that does not fit
in "…", so a table of figures becomes unreadable; there the console is wide instead, and a cell that
still does not fit folds onto a second line rather than being cut.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

OFF_TERMINAL_WIDTH = 240  # columns: wider than any table the commands print


def make_console() -> Console:
    terminal = Console()
    return terminal if terminal.is_terminal else Console(width=OFF_TERMINAL_WIDTH)


def number_table(title: str, columns: list[str], justify: str = "right", **kwargs) -> Table:
    """A rich table whose columns fold, never ellipsize; the first column is left-justified names."""
    out = Table(title=title, **kwargs)
    for i, column in enumerate(columns):
        out.add_column(column, justify="left" if i == 0 else justify, overflow="fold")
    return out


def short_params(params: dict[str, Any]) -> dict[str, str]:
    """{"rollout.decoding.ead.tau_max": 1.2531} -> {"tau_max": "1.25"}: each field by its last name (the full
    one where two share it), numbers to 3 significant digits (also those MLflow hands back as text): run
    names, tag columns and table headers a reader can scan."""
    last = [k.rsplit(".", 1)[-1] for k in params]
    return {
        (short if last.count(short) == 1 else key): short_value(value)
        for (key, value), short in zip(params.items(), last)
    }


def short_value(value: Any) -> str:
    if isinstance(value, str) and not value.isdigit():
        try:
            value = float(value)
        except ValueError:
            return value
    return f"{value:.3g}" if isinstance(value, float) else str(value)


console = make_console()


def roles(baseline: str | None, best: str | None, final: str | None) -> dict[str, str]:
    """{configuration: "baseline & best"}: what a sweep made of each configuration it names (the baseline,
    the selection's best, the final model's), for table rows and legends."""
    found: dict[str, list[str]] = {}
    for config, role in ((baseline, "baseline"), (best, "best"), (final, "final model")):
        if config:
            found.setdefault(config, []).append(role)
    return {config: " & ".join(r) for config, r in found.items()}
