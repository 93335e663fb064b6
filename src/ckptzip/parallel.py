"""A small thread pool over chunks. Native kernels release the GIL, so threads scale."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from .errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

_EXECUTORS: dict[int, ThreadPoolExecutor] = {}
#: The one-thread pools of :func:`background_executor`, by name.
_BACKGROUND: dict[str, ThreadPoolExecutor] = {}
#: Set on the pools' own threads (see :func:`ordered_map`).
_POOL_THREAD = threading.local()

#: Raw bytes of one task (a run of chunks coded by one thread) at most.
TASK_BYTES = 4 << 20
#: Tasks per thread at least, where the data allows it: in tasks of TASK_BYTES, a 22 MB state
#: makes 6 tasks, which leaves 10 of 16 threads idle. One: since a task's chunks are coded in
#: one native call, each task costs its thread a few trips for the GIL, and on 16 cores one task
#: per thread beat four on every set (docs/journal/results/h100-threads-0e95b8a.txt: 11.4 against
#: 15.8 ms for a dumps() of the 43 MB fp32 weights, 33.5 against 39.4 for the 130 MB state).
TASKS_PER_THREAD = 1


def task_bytes(total: int, threads: int) -> int:
    """Raw bytes per task for ``total`` bytes over ``threads`` threads (a task is still at least
    one chunk: tasks are cut at chunk boundaries once they reach this size)."""
    if threads <= 1:
        return TASK_BYTES
    return max(1, min(TASK_BYTES, total // (threads * TASKS_PER_THREAD)))


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_ranks() -> int:
    """How many ranks run on this node (torchrun's ``LOCAL_WORLD_SIZE``; 1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank_threads() -> int:
    """Cores per rank: every core this process may use, shared among the ranks of its node
    (:func:`local_ranks`), for writers that run in every rank at once (DCP's, DeepSpeed's
    checkpoint engine)."""
    return max(1, cpu_count() // local_ranks())


def resolve_threads(threads: int | None) -> int:
    """``None`` or 0 means every core this process may use."""
    if threads is None or (type(threads) is int and threads == 0):  # not False: not a count
        return cpu_count()
    if type(threads) is not int or threads < 0:
        raise ConfigError(f"threads must be a positive int or None (all cores), not {threads!r}")
    return threads


def executor(threads: int) -> ThreadPoolExecutor:
    """The shared pool of ``threads`` threads (made on first use, kept for the process)."""
    pool = _EXECUTORS.get(threads)
    if pool is None:
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ckptzip",
                                  initializer=_mark_pool_thread)
        _EXECUTORS[threads] = pool
    return pool


def background_executor(name: str) -> ThreadPoolExecutor:
    """A pool of one thread named ``name`` for work that runs beside the caller (made on first
    use, kept for the process)."""
    pool = _BACKGROUND.get(name)
    if pool is None:
        pool = _BACKGROUND[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    return pool


def _forget_pools() -> None:
    """In a forked child: the parent's pools have no threads here (fork copies the calling
    thread only), yet would take work as if they had idle ones, and never run it (a DataLoader
    worker's save hung). The child makes its own on first use."""
    _EXECUTORS.clear()
    _BACKGROUND.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _mark_pool_thread() -> None:
    _POOL_THREAD.active = True


def on_pool_thread() -> bool:
    """Whether the caller runs on one of the pools' threads."""
    return bool(getattr(_POOL_THREAD, "active", False))


class ByteGate:
    """At most ``capacity`` bytes of work running at once (each piece of work holds its weight
    while it runs); one piece heavier than that runs alone."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, weight: int) -> Iterator[None]:
        with self._changed:
            while self.held and self.held + weight > self.capacity:
                self._changed.wait()
            self.held += weight
        try:
            yield
        finally:
            with self._changed:
                self.held -= weight
                self._changed.notify_all()


def ordered_map(fn: Callable[[T], R], items: Iterable[T], threads: int, *,
                torch_ops: bool = False,
                gate: tuple[ByteGate, Callable[[T], int]] | None = None,
                in_flight: int | None = None) -> Iterator[R]:
    """``map(fn, items)`` on ``threads`` threads, in order, with at most ``in_flight`` items
    (``2 * threads`` by default) submitted and not yet taken, so that memory stays bounded however
    many items there are; a caller whose results cost no more memory done than waiting (each
    holds what it will keep anyway) may raise it, so that one slow item at the head leaves no
    thread idle behind it. ``torch_ops``: ``fn`` runs torch ops, which then run
    single-threaded, on one thread as on many: the items are the
    parallel work (torch's own threads on top of them oversubscribe the cores, its OpenMP
    workers spinning: 2.3x the CPU time of a lossy plan), and sums come out the same whatever
    ``threads`` is. The setting is OpenMP's, per thread; the caller's is restored. ``gate``: the
    items run only while the gate holds their weights (the function's second member). Called
    on a pool's thread (a map within a map: a base decoded while groups are prepared), it runs
    on that thread: the outer map keeps every thread busy already, and the inner one's tasks
    could wait forever behind threads that all wait on maps of their own."""
    if gate is not None:
        gated, (byte_gate, weigh) = fn, gate

        def fn(item: T) -> R:
            with byte_gate.hold(weigh(item)):
                return gated(item)

    if torch_ops:
        task = fn

        def fn(item: T) -> R:
            previous = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return task(item)
            finally:
                torch.set_num_threads(previous)

    if threads <= 1 or on_pool_thread():
        yield from map(fn, items)
        return
    pool = executor(threads)
    window = max(in_flight or 2 * threads, threads)
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a save or a load.

    They allocate thousands of small containers (header entries, chunk tables) but create no
    cycles worth collecting; each allocation burst would otherwise set off collections that walk
    every object of the process (torch's included): measured 20% of a one-thread save of a bf16
    state dict. Reference counting still frees everything; the collector resumes afterwards,
    unless it was off already. Only on the main thread: a save in a background thread (an async
    CheckpointManager) runs beside training, whose garbage the collector must keep collecting.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
