"""The memory measurements the probes share (``device_memory.py``, ``load_memory.py``): each
runs in a child process (:func:`run_child`, started with :data:`CHILD_ENV`), where
:class:`PeakWatcher` reads its resident set every millisecond around the work measured, or
:class:`ExactPeak` reads malloc's count of bytes in use after every torch op the work's thread
runs, and :func:`peak_cells` puts what it found in the probes' tables."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time
import traceback
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


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (its arenas' chunks in use plus its
    own mappings: ``mallinfo2``, glibc 2.33 or later). Under :data:`CHILD_ENV` torch's host
    tensors come from there, so this counts them as the CUDA allocator counts a GPU's."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        raise RuntimeError("malloc_in_use needs glibc 2.33 or later (mallinfo2); this C library "
                           "has none: measure with PeakWatcher (device_memory.py without --exact)")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class ExactPeak:
    """``with ExactPeak() as watch: ...``: ``watch.extra`` is the most bytes in use (malloc's
    count, :func:`malloc_in_use`) after any torch op the block ran in this thread, above the
    count at its start: the peak of a device path's tensors as ``torch.cuda.max_memory_allocated``
    counts them on a GPU, to the op, where a resident-set reader samples and misses the
    transients (ops another thread runs are not seen: run the work on one thread). ``where``:
    the op and the ckptzip frames at the peak."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        watch = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                now = malloc_in_use()
                if now > watch.peak:
                    watch.peak = now
                    frames = [f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
                              for frame in traceback.extract_stack()[:-1]
                              if "/ckptzip/" in frame.filename]
                    watch.where = f"{func} at " + " <- ".join(reversed(frames[-4:]))
                return out

        self._mode = Mode()
        self.before = self.peak = 0
        self.seconds = 0.0
        self.where = ""

    def __enter__(self) -> ExactPeak:
        self.before = self.peak = malloc_in_use()
        self._started = time.perf_counter()
        self._mode.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._mode.__exit__(kind, error, trace)
        self.seconds = time.perf_counter() - self._started

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
