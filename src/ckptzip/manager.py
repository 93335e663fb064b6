"""CheckpointManager: a directory of compressed checkpoints, one file per step, saved in the
background while training goes on.

Layout: ``step-00000100.ckz`` per step (``step_file``; other names, ``step-100.ckz`` saved by
hand among them, are not the manager's files: not listed, never deleted); there is no manifest,
because each file's header already names its base (path and content id) and temporary files
carry the ``.ckz-tmp-`` marker, so the directory itself is the truth. A step is *restorable*
when its file is complete and every base of its chain is present with the content id it was
coded against; ``steps()`` lists only those.

One manager writes a directory at a time: it holds an advisory lock (``.ckptzip.lock``, flock) for
its whole life, so two trainers pointed at one directory fail at once instead of deleting each
other's bases. A URL (``s3://bucket/run3``) is a bucket prefix, held with a lease object instead
(``storage.ObjectDirectory``; docs/OBJECT_STORAGE.md says what it guarantees).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from .api import load, save
from .chain import Base, resolve_relative, walk_chain
from .errors import ConfigError, Error
from .guard import FidelityGuard, GuardEvent, GuardFunction
from .held import HeldCheckpoint, hold_loaded, hold_written, open_held_base, worth_holding
from .modes import policy_for
from .objstore import StorageOptions
from .parallel import resolve_threads
from .planning import Prepared, prepare
from .reader import CheckpointFile
from .snapshot import DeviceSnapshot, device_snapshot, snapshot
from .storage import LOCK_NAME as LOCK_NAME  # the lock file's name, for callers of this module
from .storage import is_url, open_directory
from .tree import Leaf, flatten
from .writer import SaveReport

STEP_FILE = re.compile(r"^step-(\d+)\.ckz$")
#: A keyframe every 8 checkpoints: a restore decodes at most 8 files, and retention keeps at most
#: 7 files beyond ``keep_last`` (the rest of the oldest kept step's chain), while 7 in 8
#: checkpoints get the delta's gain (about 1.6x smaller than standalone on consecutive bf16
#: checkpoints; see docs/BENCHMARKS.md).
DEFAULT_KEYFRAME_EVERY = 8


def step_file(step: int) -> str:
    return f"step-{step:08d}.ckz"


def step_of(name: str) -> int | None:
    """The step whose file is named ``name``, or None where it is not a manager's file name.
    Only the exact name :func:`step_file` gives counts: the manager rebuilds every other path
    (restore, bases, retention) from the step, so ``step-1000.ckz`` saved by hand beside
    ``step-00001000.ckz``'s place would be listed, then never found."""
    match = STEP_FILE.match(name)
    if match is None or name != step_file(int(match.group(1))):
        return None
    return int(match.group(1))


@dataclass(frozen=True)
class _Header:
    """What the manager needs from a file's header, keyed by the file's size and mtime."""

    stamp: tuple[int, int]
    id: str
    #: Absolute path of the base this delta was coded against, and the id it must have.
    base_path: str | None
    base_id: str | None


class CheckpointManager:
    """Save, list, restore and prune the checkpoints of one training run in ``directory``.

    ``save(step, state)`` snapshots ``state`` to host memory and returns; a background thread
    compresses and writes it (``async_save=False`` does it all before returning). At most
    ``max_pending`` saves wait or run at once: the next ``save`` blocks until one finishes. Each
    checkpoint is a delta against the newest restorable earlier step, with a standalone keyframe
    every ``keyframe_every`` checkpoints (``None``: deltas only; ``1``: keyframes only).
    ``keep_last=N`` deletes older checkpoints after each save, except those a kept one needs.
    A failure in the background is raised, as a :class:`ckptzip.Error` naming the step, by the
    next call. ``mode`` and ``mode_options`` go to :func:`ckptzip.save`.

    ``directory`` may be an fsspec URL, a prefix in a bucket (``s3://bucket/run3``), opened with
    ``storage_options``; the manager then holds a lease on the prefix instead of a lock, valid
    ``lease_seconds`` (default 60) after its last renewal, so a manager that died frees the
    prefix that long after. See docs/OBJECT_STORAGE.md for what two trainers on one prefix get.

    ``guard=fn`` (lossy modes; :mod:`ckptzip.guard`): after each lossy delta, ``fn(state) ->
    float`` (lower is better, e.g. a loss on a fixed batch) scores the true state and the state
    as decoded; a checkpoint worse by more than ``max_gap`` (relative, default 0.5%) is rewritten
    losslessly, logged, and counted in :attr:`guard_rewrites`. It runs where the write runs (in
    the background for async saves, on the manager's snapshot; in the caller's ``save`` for
    synchronous ones, on the caller's own state). ``fn`` must not use the live model, nor change
    the state it is given: load it into a copy (``load_state_dict`` copies) in eval mode; a
    lossless rewrite writes that state as it is after ``fn``.

    ``cache_decoded``: hold the newest checkpoint as decoded in host memory (one state's raw
    bytes, :mod:`ckptzip.held`), so that the next delta takes its base from there instead of
    decoding the base's chain file by file (a save at chain depth ``d`` otherwise decodes ``d``
    files first). The files written are the same bytes either way. ``None`` (the default) holds
    it while the state is at most a quarter of the host memory available then, ``True`` always,
    ``False`` never.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        mode: str = "lossless",
        keyframe_every: int | None = DEFAULT_KEYFRAME_EVERY,
        keep_last: int | None = None,
        async_save: bool = True,
        max_pending: int = 1,
        threads: int | None = None,
        guard: GuardFunction | None = None,
        max_gap: float = 0.005,
        storage_options: StorageOptions = None,
        lease_seconds: float | None = None,
        cache_decoded: bool | None = None,
        **mode_options: Any,
    ) -> None:
        if guard is not None and mode == "lossless":
            raise ConfigError("guard= checks lossy checkpoints; mode 'lossless' is exact already")
        self.guard = None if guard is None else FidelityGuard(guard, max_gap)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise ConfigError(f"keep_last must be a positive int or None, not {keep_last!r}")
        if type(max_pending) is not int or max_pending < 1:
            raise ConfigError(f"max_pending must be a positive int, not {max_pending!r}")
        if keyframe_every is not None and (type(keyframe_every) is not int or keyframe_every < 1):
            raise ConfigError(f"keyframe_every must be a positive int or None, not {keyframe_every!r}")
        if cache_decoded is not None and not isinstance(cache_decoded, bool):
            raise ConfigError(f"cache_decoded must be True, False or None, not {cache_decoded!r}")
        self.cache_decoded = cache_decoded
        #: The newest checkpoint this manager wrote or restored, as decoded (see cache_decoded).
        self._held: HeldCheckpoint | None = None
        # a bad mode or option fails here, not in the background
        self._policy = policy_for(mode, **mode_options)
        self.storage_options = storage_options
        self.mode = mode
        self.mode_options = mode_options
        self.keyframe_every = keyframe_every
        self.keep_last = keep_last
        self.async_save = async_save
        resolve_threads(threads)  # a bad count fails here, not in the first background save
        self.threads = threads
        # held from here to close(); temporary files or unfinished uploads a crash left are gone
        self._home = open_directory(directory, storage_options, lease_seconds)
        self.directory = self._home.location
        #: Stamps of the files of the last listing (a header is read again when its stamp moves).
        self._stamps: dict[str, tuple[Any, ...]] = {}
        self._headers: dict[str, _Header] = {}
        self._headers_lock = threading.Lock()
        #: Files that restore() is reading (with how many readers): retention leaves them alone.
        self._reading: Counter[str] = Counter()
        self._slots = threading.BoundedSemaphore(max_pending)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ckptzip-save")
        self._pending: list[concurrent.futures.Future[SaveReport]] = []
        self._pending_lock = threading.Lock()
        #: Background failures not yet raised, in the order they happened (every one is named).
        self._errors: list[Error] = []
        self._closed = False
        #: The step restore() last returned, until the next save: that save's state was trained
        #: from its decoded values (what lossy modes need to know, see ckptzip.save's resumed).
        self._restored: int | None = None

    # -- public API -----------------------------------------------------------------------
    def save(self, step: int, state: Any, *, resumed: bool | None = None) -> None:
        """Checkpoint ``state`` as ``step``; returns once it is safe to change ``state``.

        ``resumed``: whether the training that made ``state`` went on from its base checkpoint
        as decoded (see :func:`ckptzip.save`). By default the manager tells: True for the first
        save after :meth:`restore` when it is coded against the restored step, else False."""
        self._check(refused=step)
        if type(step) is not int or step < 0:
            raise ConfigError(f"step must be a non-negative int, not {step!r}")
        if resumed is not None and not isinstance(resumed, bool):
            raise ConfigError(f"resumed must be True, False or None, not {resumed!r}")
        restored, self._restored = self._restored, None
        resumed_from = restored if resumed is None else (-1 if resumed else None)
        self._slots.acquire()  # back-pressure: wait while max_pending saves are under way
        if not self.async_save:
            try:
                self._write(step, state, resumed_from, snapshot=False)
            except BaseException:
                self._keep_restored(restored)
                raise
            finally:
                self._slots.release()
            return
        try:
            self._raise_pending_error(refused=step)
            flat = flatten(state)
            self._policy.check_state(flat[1])  # a pairing that does not fit: here, not later
            copy = (self._device_copy(step, state, flat, resumed_from) if self._on_device(flat[1])
                    else snapshot(state, flat))
            future = self._executor.submit(self._write_in_background, step, copy, resumed_from)
        except BaseException:
            self._slots.release()
            self._keep_restored(restored)
            raise
        future.add_done_callback(self._finished)
        with self._pending_lock:
            self._pending = [*(f for f in self._pending if not f.done()), future]

    def restore(self, step: int | None = None, *, map_location: Any = "cpu") -> Any:
        """The state saved as ``step`` (default: the latest restorable step), after pending saves
        have finished."""
        if step is not None and (type(step) is not int or step < 0):
            raise ConfigError(f"step must be a non-negative int, not {step!r}")
        self.wait()
        with self._headers_lock:
            steps = self._restorable()
            if step is None:
                if not steps:
                    raise Error(f"{self.directory}: no checkpoint to restore{self._foreign()}")
                step = steps[-1]
            elif step not in steps:
                raise Error(
                    f"{self.directory}: no restorable checkpoint for step {step}; "
                    f"steps are {steps or 'none'}{self._why_not(step)}{self._foreign()}"
                )
            # checked and claimed in one hold of the lock: retention spares the chain until the
            # read is done
            path = self._path(step)
            chain = self._chain_paths(path)
            self._reading.update(chain)
        try:
            state = load(path, map_location=map_location, threads=self.threads,
                         storage_options=self.storage_options)
            self._restored = step
            if self._holds(sum(leaf.nbytes for leaf in flatten(state)[1])):
                # the next delta is coded against this step as decoded: take it from here
                self._held = hold_loaded(path, state, storage_options=self.storage_options)
            return state
        finally:
            with self._headers_lock:
                self._reading.subtract(chain)
                self._reading += Counter()  # drop the zero counts

    @property
    def guard_events(self) -> list[GuardEvent]:
        """Every checkpoint the fidelity guard judged, in order (empty without a guard)."""
        return [] if self.guard is None else list(self.guard.events)

    @property
    def guard_rewrites(self) -> int:
        """How many checkpoints the fidelity guard rewrote losslessly."""
        return 0 if self.guard is None else self.guard.rewrites

    def path(self, step: int) -> str:
        """Where ``step``'s file is, or would be (a path, or a URL on a bucket)."""
        return self._path(step)

    def latest_step(self) -> int | None:
        """The newest step that is completely written and restorable, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def steps(self) -> list[int]:
        """Every restorable step, ascending: the file is complete and its whole base chain is
        present and unchanged. Saves still under way are not listed."""
        self._raise_pending_error()
        with self._headers_lock:
            return self._restorable()

    def wait(self) -> None:
        """Block until every pending save has finished; raise if one failed."""
        with self._pending_lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending)
        with self._pending_lock:
            self._pending = [f for f in self._pending if not f.done()]
        self._raise_pending_error()

    def close(self) -> None:
        """Finish pending saves, then release the directory. Idempotent."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)
            self._home.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointManager({self.directory!r}, mode={self.mode!r})"

    # -- internals ------------------------------------------------------------------------
    def _check(self, refused: int | None = None) -> None:
        if self._closed:
            raise Error(f"{self.directory}: this CheckpointManager is closed")
        self._raise_pending_error(refused)

    def _raise_pending_error(self, refused: int | None = None) -> None:
        """Raise the background failures not raised yet: every failed step is named (with
        ``max_pending`` above 1 several may have failed before a call sees them). ``refused``:
        the step of the save that raises, which was not started."""
        with self._pending_lock:
            errors, self._errors = self._errors, []
        if not errors:
            return
        error = errors[0]
        if len(errors) > 1 or refused is not None:
            more = "; ".join(str(e) for e in errors[1:])
            note = f" Also: {more}" if more else ""
            if refused is not None:
                note += f" This save of step {refused} was not started: save it again."
            error = Error(f"{errors[0]}{note}")
            error.__cause__ = errors[0].__cause__
        raise error

    def _keep_restored(self, restored: int | None) -> None:
        """A save that failed before it was under way leaves restore()'s mark for the next."""
        if self._restored is None:
            self._restored = restored

    def _why_not(self, step: int) -> str:
        """Why ``step``'s file, where there is one, does not restore: its own error."""
        path = self._path(step)
        if self._home.stamp(path) is None:
            return ""
        try:
            with CheckpointFile.open(path, threads=self.threads,
                                     storage_options=self.storage_options) as checkpoint:
                if checkpoint.header.base is not None:
                    checkpoint.base()  # resolving it checks it is there, and the right one
        except Error as exc:
            return f" ({step_file(step)} is there, but {exc})"
        return ""

    def _finished(self, future: concurrent.futures.Future[SaveReport]) -> None:
        self._slots.release()

    def _path(self, step: int) -> str:
        return self._home.join(step_file(step))

    def _base_for(self, step: int) -> str | None:
        """The newest restorable step before ``step``: the base of its delta."""
        with self._headers_lock:
            earlier = [s for s in self._restorable() if s < step]
        return self._path(earlier[-1]) if earlier else None

    def _resumed(self, base: str | None, resumed_from: int | None) -> bool:
        """Whether a save against ``base`` was trained from that base as decoded: the caller
        said so (``resumed_from`` -1), or it is the step restore() returned."""
        return resumed_from == -1 or (resumed_from is not None and base == self._path(resumed_from))

    def _on_device(self, leaves: list[Leaf]) -> bool:
        """Whether an async save of these leaves should transform them on their accelerator
        before the copy to the host: a lossy mode (whose transforms are torch ops) and a tensor
        off the CPU."""
        if self.mode == "lossless":
            return False
        return any(leaf.tensor.device.type != "cpu" for leaf in leaves)

    def _device_copy(self, step: int, state: Any, flat: tuple[Any, list[Leaf]],
                     resumed_from: int | None) -> Any:
        """What an async save of accelerator tensors hands to the background: a copy on the
        device (fast; the transforms then run there in the background, on their own stream), or,
        when the device has no room for one, the transformed state made here and now."""
        try:
            return device_snapshot(state, flat)
        except torch.cuda.OutOfMemoryError:
            self.wait()  # the delta's base must be on disk first
            return self._prepare_on_device(step, state, resumed_from)

    def _prepare_on_device(self, step: int, state: Any, resumed_from: int | None) -> Prepared:
        """Run the lossy transforms where the tensors are, then copy to the host only what will
        be stored (codes and untransformed leaves): less to copy and to hold than the state."""
        path = self._base_for(step)
        base = self._open_base(path, self._held)
        try:
            prepared = prepare(state, mode=self.mode, base=base,
                               keyframe_every=self.keyframe_every, mode_options=self.mode_options,
                               resumed=self._resumed(path, resumed_from), threads=self.threads)
            host = prepared.to_host()
        except BaseException:
            if base is not None:
                base.close()
            raise
        if base is not None and prepared.base is None:  # a keyframe after all
            base.close()
        return host

    def _open_base(self, path: str | None, held: HeldCheckpoint | None) -> Base | None:
        """The base at ``path`` for a save, its decoded tensors taken from ``held`` where that is
        the same checkpoint (see cache_decoded)."""
        if path is None:
            return None
        return open_held_base(path, held if held is not None and held.location == path else None,
                              threads=self.threads, storage_options=self.storage_options)

    def _hold(self, path: str, state: Any, held: HeldCheckpoint | None, *, snapshot: bool) -> None:
        """Hold what the checkpoint just written at ``path`` decodes to, for the next delta
        (``held``, the one before, is consumed), where cache_decoded says to. ``state``: what
        was saved (a snapshot when ``snapshot``, else the caller's state, whose exactly stored
        tensors are then copied; a prepared state's transformed tensors are decoded)."""
        if isinstance(state, Prepared):  # a transformed leaf's tensor holds its codes
            size = sum(leaf.nbytes for leaf in state.leaves)
            leaves = [leaf for i, leaf in enumerate(state.leaves) if i not in state.encoded]
        else:
            leaves = flatten(state)[1]
            size = sum(leaf.nbytes for leaf in leaves)
        if self._holds(size):
            self._held = hold_written(path, {leaf.name: leaf for leaf in leaves}, held,
                                      copy=not snapshot, threads=self.threads,
                                      storage_options=self.storage_options)

    def _holds(self, size: int) -> bool:
        """Whether to hold a checkpoint of a state of ``size`` raw bytes as decoded."""
        return worth_holding(size, self.cache_decoded, self.directory)

    def _write(self, step: int, state: Any, resumed_from: int | None = None, *,
               snapshot: bool = True) -> SaveReport:
        """Compress ``state`` as ``step`` against the newest earlier restorable step (unless it is
        prepared, and so planned against its base already), then prune. ``resumed_from``: the
        step the state was trained from as decoded (-1: its base, whichever), or None.
        ``snapshot``: ``state`` is the manager's own copy (else the caller's)."""
        true_state = None  # what the guard scores the checkpoint against
        if isinstance(state, DeviceSnapshot):
            with state.background():
                prepared = self._prepare_on_device(step, state.state, resumed_from)
            true_state = state.state if self.guard is not None else None
            state.state = None  # free the device copy before the write (unless guarded)
            state = prepared
        # a synchronous save of accelerator tensors needs no branch: save() runs the lossy
        # transforms where the tensors are
        self._home.check()  # a lost lease: another manager may be writing the prefix now
        path = self._path(step)
        base = self._base_for(step)
        held, self._held = self._held, None  # consumed here: a failure leaves nothing held
        if isinstance(state, Prepared):
            report = save(state, path, threads=self.threads, metadata={"step": step},
                          storage_options=self.storage_options)
        else:
            true_state = state
            report = save(
                state, path, mode=self.mode, base=self._open_base(base, held),
                threads=self.threads, metadata={"step": step}, keyframe_every=self.keyframe_every,
                resumed=self._resumed(base, resumed_from), storage_options=self.storage_options,
                **self.mode_options,
            )
        if self.guard is not None and true_state is not None:
            report = self._guard(step, path, base, held, true_state, report)
        self._hold(path, state, held, snapshot=snapshot)
        if self.keep_last is not None:
            self._prune(self.keep_last)
        return report

    def _guard(self, step: int, path: str, base: str | None, held: HeldCheckpoint | None,
               true_state: Any, report: SaveReport) -> SaveReport:
        """Score a lossy checkpoint as decoded against ``true_state``; rewrite it losslessly
        (against the same base) when the guard says so. Keyframes are lossless: not scored."""
        assert self.guard is not None
        options = self.storage_options
        with CheckpointFile.open(path, threads=self.threads, storage_options=options) as checkpoint:
            lossy = any(leaf.lossy for leaf in checkpoint.leaves)
        if not lossy:
            return report
        rewritten: list[SaveReport] = []

        def rewrite() -> None:
            try:
                rewritten.append(save(true_state, path, mode="lossless",
                                      base=self._open_base(base, held), threads=self.threads,
                                      metadata={"step": step, "guard": "rewritten lossless"},
                                      storage_options=options))
            except BaseException:
                # the lossy file failed its judgement: it must not stay as the step (the
                # previous step is then the latest, as after any failed save)
                with contextlib.suppress(OSError, Error):
                    self._home.remove(path)
                raise

        decoded_base = self._open_base(base, held)
        try:
            decoded = load(path, threads=self.threads, base=decoded_base, storage_options=options)
        finally:
            if decoded_base is not None:
                decoded_base.close()
        self.guard.check(step, true_state, decoded, rewrite)
        return rewritten[-1] if rewritten else report

    def _write_in_background(self, step: int, state: Any, resumed_from: int | None) -> SaveReport:
        """:meth:`_write` on the background thread; a failure is kept for the next call."""
        try:
            return self._write(step, state, resumed_from)
        except Exception as exc:
            error = Error(f"{self.directory}: saving step {step} in the background failed: {exc}")
            error.__cause__ = exc
            with self._pending_lock:
                self._errors.append(error)
            raise error from exc

    def _prune(self, keep_last: int) -> None:
        """Delete restorable steps older than the newest ``keep_last``, unless a kept step's chain
        needs them. Files that are not restorable are left alone."""
        with self._headers_lock:
            steps = self._restorable()
            needed: set[str] = set()
            for step in steps[-keep_last:]:
                needed.update(self._chain_paths(self._path(step)))
            # newest first: a crash between two deletions leaves only restorable chains, never a
            # delta whose base is gone (which, not being restorable, retention would never remove)
            for step in reversed(steps[:-keep_last]):
                path = self._path(step)
                if path not in needed and path not in self._reading:
                    self._home.remove(path)
                    self._headers.pop(path, None)

    def _chain_paths(self, path: str) -> list[str]:
        """``path`` and the files of its base chain, as far as the header cache knows them."""
        def base_of(current: str) -> str | None:
            header = self._headers.get(current)
            return header.base_path if header is not None else None

        return walk_chain(path, base_of)

    def _restorable(self) -> list[int]:
        """Restorable steps, refreshing the header cache from the directory (hold the lock)."""
        found: dict[str, int] = {}
        self._stamps = self._home.listing()
        for path in self._stamps:
            step = step_of(path[len(self.directory) + 1 :])
            if step is not None:
                found[path] = step
        for path in list(self._headers):
            if path not in found:
                del self._headers[path]
        ok: dict[str, bool] = {}
        return sorted(step for path, step in found.items() if self._chain_ok(path, ok))

    def _foreign(self) -> str:
        """For a restore that found nothing: the files of the last listing named like steps but
        not as the manager names them (``step-1000.ckz``, saved by hand), which it ignores."""
        found = sorted((int(match.group(1)), name) for path in self._stamps
                       if (match := STEP_FILE.match(name := path[len(self.directory) + 1 :]))
                       and step_of(name) is None)
        if not found:
            return ""
        names = ", ".join(name for _, name in found[:3]) + (", ..." if len(found) > 3 else "")
        step = found[0][0]
        return (f" (found {names}, not named as the manager names its files, "
                f"{step_file(step)} for step {step}: not its files; read one with "
                f"ckptzip.load(path))")

    def _header(self, path: str) -> _Header | None:
        stamp = self._stamps.get(path) or self._home.stamp(path)
        if stamp is None:
            return None
        cached = self._headers.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached
        try:
            with CheckpointFile.open(path, storage_options=self.storage_options) as checkpoint:
                ref = checkpoint.header.base
                base_path = base_id = None
                if ref is not None and ref.path is not None:
                    base_path = resolve_relative(path, ref.path)
                    base_path = base_path if is_url(base_path) else os.path.normpath(base_path)
                    base_id = ref.id
                header = _Header(stamp, checkpoint.id, base_path, base_id)
        except Error:
            return None  # damaged or truncated: not restorable
        self._headers[path] = header
        return header

    def _chain_ok(self, path: str, ok: dict[str, bool]) -> bool:
        if path not in ok:
            ok[path] = False  # a cycle is never restorable
            header = self._header(path)
            if header is not None:
                if header.base_path is None:
                    ok[path] = True
                else:
                    base = self._header(header.base_path)
                    ok[path] = (
                        base is not None
                        and base.id == header.base_id
                        and self._chain_ok(header.base_path, ok)
                    )
        return ok[path]
