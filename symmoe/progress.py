"""A dependency-free progress bar on stderr (drawn by rank 0 only)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str = "", enabled: bool = True, width: int = 30):
        self.total, self.label, self.width = max(total, 1), label, width
        self.enabled = enabled
        self.done = 0
        self.start = time.monotonic()
        self._tty = sys.stderr.isatty()

    def update(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        if not self.enabled:
            return
        # Without a terminal, print a line per tenth so logs stay readable.
        if not self._tty and self.done != self.total and self.done % max(self.total // 10, 1):
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        end = "\r" if self._tty and self.done < self.total else "\n"
        sys.stderr.write(f"{self.label} [{bar}] {self.done}/{self.total} {time.monotonic() - self.start:5.1f}s{end}")
        sys.stderr.flush()
