"""A one-line progress bar on stderr for the command-line tools (no dependency)."""
from __future__ import annotations

import sys


class Progress:
    """`step(label)` after each of `total` jobs redraws `[####....] n/total label`;
    `close()` ends the line. Quiet when the stream is not a terminal (logs stay readable)
    unless `always`."""

    def __init__(self, total: int, width: int = 40, stream=None, always: bool = False):
        self.total, self.width, self.n = max(total, 1), width, 0
        self.stream = stream or sys.stderr
        self.on = always or self.stream.isatty()

    def step(self, label: str = "") -> None:
        self.n += 1
        if self.on:
            done = int(self.width * self.n / self.total)
            print(f"\r[{'#' * done}{'.' * (self.width - done)}] {self.n}/{self.total} "
                  f"{label[:30]:<30}", end="", file=self.stream, flush=True)

    def close(self) -> None:
        if self.on:
            print(file=self.stream, flush=True)
