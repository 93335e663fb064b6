"""A dependency-free progress bar on stderr: shown only on a terminal, only for work that takes
over a second, and never with ``-q``."""

from __future__ import annotations

import sys
import time


class Progress:
    DELAY = 1.0  # seconds before the bar appears
    INTERVAL = 0.1  # seconds between redraws

    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.monotonic()
        self.drawn_at = 0.0
        self.shown = False

    def update(self, amount: int) -> None:
        self.done += amount
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started >= self.DELAY and now - self.drawn_at >= self.INTERVAL:
            self.drawn_at = now
            self.shown = True
            self._draw(now)

    def _draw(self, now: float) -> None:
        fraction = min(self.done / self.total, 1.0)
        elapsed = now - self.started
        rate = self.done / elapsed / 1e6 if elapsed > 0 else 0.0
        filled = int(30 * fraction)
        bar = "#" * filled + "-" * (30 - filled)
        sys.stderr.write(f"\r{self.label} [{bar}] {fraction:6.1%} {rate:8.1f} MB/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()
