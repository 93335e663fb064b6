"""glibc's malloc, set for ckptzip's lossy transforms: an opt-in, process-wide tuning.

A lossy save makes and drops many temporary tensors the size of a weight. glibc serves each
large one with a fresh ``mmap`` and returns it to the system when it is freed (its threshold
adapts only up to 32 MB, and each thread gets an arena of its own). Each allocation then pays
page faults. When two threads do this at once, each ``munmap`` also interrupts the other core
to flush its TLB, and that is costly in a virtual machine.

On this project's 2-core VM, the adaptive transforms of a 0.3 GB state spent 0.3-1.5 s of
system time on one thread and 2.2-3.5 s on two. :func:`tune_malloc` keeps freed memory in one
heap for reuse, and the system time on two threads falls to 0.1-0.5 s. In interleaved runs,
lossy saves on two threads ran about a third faster (the middles of the ranges), and ExCP's and
BitSnap's loads on two threads about twice as fast (docs/BENCHMARKS.md §7).

It changes the whole process's allocator: the process keeps the memory it frees (its peak
temporary memory, not the state's size) and all threads share one arena. So ckptzip's own
command line calls it, and a library user chooses. In a training process, call it before
training starts. Or set the same values in the environment before the process starts; glibc
reads them itself::

    MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=33554432 \\
    MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 python train.py
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: ``mallopt`` parameters (glibc's ``malloc.h``) and the values set: freed memory stays in the
#: heap for reuse (trim threshold 1 GiB, top pad 256 MiB); blocks up to 32 MiB come from the
#: heap, not from fresh mappings; one arena for every thread.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 256 << 20,
            M_ARENA_MAX: 1}
#: The same values as the environment variables glibc reads at start-up.
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
               "MALLOC_TOP_PAD_": str(256 << 20), "MALLOC_ARENA_MAX": "1"}


def tune_malloc() -> bool:
    """Set glibc's malloc as the module docstring says; True when it was set (glibc on Linux),
    False elsewhere (another C library, macOS, Windows: nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(parameter, value) == 1 for parameter, value in SETTINGS.items())
