"""The resident-set measurement the memory probes share (``device_memory.py``,
``load_memory.py``): each measurement runs in a child process (:func:`run_child`, started with
:data:`CHILD_ENV`), where :class:`PeakWatcher` reads its resident set every millisecond around
the work measured, and :func:`peak_cells` puts what it found in the probes' tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")

#: A child's environment: glibc returns every freed block of 64 KiB or more to the kernel at
#: once (so that the resident set is what is in use), and ckptzip leaves malloc as it is.
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536",
             "CKPTZIP_MALLOC": "system"}


def resident() -> int:
    """This process's resident set, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class PeakWatcher:
    """``with PeakWatcher() as watch: ...``: then ``watch.extra`` is the peak resident set during
    the block above the one at its start, and ``watch.seconds`` the block's wall time."""

    def __init__(self) -> None:
        self.before = self.peak = 0
        self.seconds = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, resident())
            time.sleep(0.001)

    def __enter__(self) -> PeakWatcher:
        self.before = self.peak = resident()
        self._thread.start()
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.seconds = time.perf_counter() - self._started
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, resident())

    @property
    def extra(self) -> int:
        return self.peak - self.before


def run_child(script: Path, spec: dict[str, Any], pythonpath: str | None = None) -> dict[str, Any]:
    """Run ``script --child <spec as JSON>`` in a fresh process (``pythonpath``: the build of
    ckptzip it imports, else the one this process would) and return the JSON object its last
    line of output holds."""
    env = dict(CHILD_ENV)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, str(script), "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def peak_cells(result: dict[str, Any]) -> str:
    """A child's ``state_bytes`` and ``peak_extra`` as table cells: the state's MB, the peak's
    MB, and the peak over the state."""
    state, extra = result["state_bytes"], result["peak_extra"]
    return f"{state / 1e6:,.0f} | {extra / 1e6:,.0f} | {extra / state:.2f}x"
