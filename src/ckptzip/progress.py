"""A dependency-free progress bar on stderr: shown only on a terminal, only for work that takes
over a second, and never with ``-q``."""

from __future__ import annotations

import sys
import time


class Progress:
    """``done`` of ``total`` units, drawn as ``label [####------]  40.0%  12.3 MB/s``.

    ``unit="MB"`` (the default) counts bytes and shows MB/s; any other unit (``"steps"``) counts
    whole units and shows ``done/total unit`` and their rate. Lines printed while the bar is up go
    through :meth:`write`, which lifts the bar, prints the line and puts the bar back.
    """

    DELAY = 1.0  # seconds before the bar appears
    INTERVAL = 0.1  # seconds between redraws

    def __init__(self, total: int, label: str, *, enabled: bool = True, unit: str = "MB") -> None:
        self.total = max(total, 1)
        self.label = label
        self.unit = unit
        self.done = 0
        self.enabled = enabled and sys.stderr.isatty()
        self.started = time.monotonic()
        self.drawn_at = 0.0
        self.shown = False
        self.width = 0  # characters of the last drawn bar, to erase it

    def update(self, amount: int) -> None:
        self.done += amount
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started >= self.DELAY and now - self.drawn_at >= self.INTERVAL:
            self.drawn_at = now
            self.shown = True
            self._draw(now)

    def set(self, done: int) -> None:
        """Move the bar to ``done`` units (an absolute count, such as a step number)."""
        self.update(done - self.done)

    def write(self, message: str) -> None:
        """Print ``message`` on stdout without garbling the bar."""
        if self.shown:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
        print(message, flush=True)
        if self.shown:
            self._draw(time.monotonic())

    def _draw(self, now: float) -> None:
        fraction = min(self.done / self.total, 1.0)
        elapsed = now - self.started
        filled = int(30 * fraction)
        bar = "#" * filled + "-" * (30 - filled)
        if self.unit == "MB":
            rate = f"{self.done / elapsed / 1e6 if elapsed > 0 else 0.0:8.1f} MB/s"
        else:
            per_second = self.done / elapsed if elapsed > 0 else 0.0
            rate = f"{self.done}/{self.total} {self.unit}, {per_second:.2f} {self.unit}/s"
        text = f"\r{self.label} [{bar}] {fraction:6.1%} {rate}"
        self.width = len(text) - 1
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()
