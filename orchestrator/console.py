"""The commands' console: every table keeps its numbers whole, on a terminal or off one.

Off a terminal (a log, CI, a notebook) rich assumes 80 columns and ends every cell that does not fit
in "…", so a table of figures becomes unreadable; there the console is wide instead, and a cell that
still does not fit folds onto a second line rather than being cut.
"""

from __future__ import annotations

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


console = make_console()
