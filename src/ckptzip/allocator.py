"""glibc's malloc, set for ckptzip's lossy transforms: an opt-in, process-wide tuning.

A lossy save makes and drops many temporary tensors the size of a weight. glibc serves each
one of 32 MB or more (a 4096 x 4096 fp32 weight is 64 MB) with a fresh ``mmap``, and returns it
to the system when it is freed; each thread also gets an arena of its own. Each such allocation
then pays its page faults. When two threads do this at once, each ``munmap`` also interrupts the
other core to flush its TLB, which is costly in a virtual machine.

On this project's 2-core VM, the adaptive transforms of four 4096 x 4096 weights and their
moments spent 8-12 s in the kernel against 9 s of user time under glibc's defaults.
:func:`tune_malloc` serves every block from one heap and keeps freed memory there for reuse.
The kernel time then fell to 0.2-1.6 s, and the transforms ran about twice as fast on 1 and on 2
threads. On a state of smaller tensors (up to 32 MB), lossy saves on 2 threads ran 35-62% faster
(docs/BENCHMARKS.md §7).

It changes the whole process's allocator: the process keeps the memory it frees (it stays at
its peak) and all threads share one arena. So ckptzip's own
command line calls it, and a library user chooses. In a training process, call it before
training starts. Or set the same values in the environment before the process starts; glibc
reads them itself::

    MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_MMAP_THRESHOLD_=33554432 \\
    MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456 python train.py
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

#: ``mallopt`` parameters (glibc's ``malloc.h``) and the values set: every block comes from the
#: heap, none from a fresh mapping (mmap max 0: glibc's threshold stops at 32 MiB, and a 4096 x
#: 4096 fp32 weight is 64 MiB); freed memory stays in the heap for reuse (trim threshold 1 GiB,
#: top pad 256 MiB); one arena for every thread.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -3, -4, -8
SETTINGS = {M_MMAP_MAX: 0, M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30,
            M_TOP_PAD: 256 << 20, M_ARENA_MAX: 1}
#: The same values as the environment variables glibc reads at start-up.
ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
               "MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_TOP_PAD_": str(256 << 20),
               "MALLOC_ARENA_MAX": "1"}


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
