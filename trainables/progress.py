"""A progress bar on a terminal and plain lines elsewhere (a log file, a pipe, a Ray worker's output): off
a terminal a bar's carriage-return updates become one line at most every 10% or every 30 s."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator

from tqdm.auto import tqdm

LINE_EVERY_S = 30.0
LINE_EVERY_FRACTION = 0.1


class Lines:
    """The part of tqdm's interface the project uses (iteration, `set_postfix`), as plain lines on stderr."""

    def __init__(self, iterable: Iterable, desc: str, unit: str):
        self.iterable, self.desc, self.unit, self.postfix = iterable, desc, unit, ""
        self.total = len(iterable) if hasattr(iterable, "__len__") else None

    def set_postfix(self, **values) -> None:
        self.postfix = "".join(f", {key} {value}" for key, value in values.items())

    def __iter__(self) -> Iterator:
        start = last = time.monotonic()
        shown = 0.0  # the fraction last shown
        for done, item in enumerate(self.iterable, start=1):
            yield item
            now, fraction = time.monotonic(), done / self.total if self.total else 0.0
            if done == self.total or now - last >= LINE_EVERY_S or fraction - shown >= LINE_EVERY_FRACTION:
                of = f"/{self.total} {self.unit}s ({fraction:.0%})" if self.total else f" {self.unit}s"
                print(f"{self.desc}: {done}{of}, {now - start:.0f} s{self.postfix}", file=sys.stderr, flush=True)
                last, shown = now, fraction


def progress(iterable: Iterable, *, desc: str, unit: str = "it", disable: bool = False):
    """`iterable` with its progress shown: a tqdm bar on a terminal, `Lines` elsewhere, nothing if `disable`."""
    if disable or sys.stderr.isatty():
        return tqdm(iterable, desc=desc, unit=unit, disable=disable)
    return Lines(iterable, desc, unit)
