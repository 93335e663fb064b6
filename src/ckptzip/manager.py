"""CheckpointManager: a directory of compressed checkpoints, one file per step, saved in the
background while training goes on.

Layout: ``step-00000100.ckz`` per step (``step_file``; other names, ``step-100.ckz`` saved by
hand among them, are not the manager's files: not listed, never deleted); there is no manifest,
because each file's header already names its base (path and content id) and temporary files
carry the ``.ckz-tmp-`` marker, so the directory itself is the truth. A step is *restorable*
when its file is complete and every base of its chain is present with the content id it was
coded against; ``steps()`` lists only those.

Steps only go forward: a save is refused where a later step would stay restorable beside it (a
run rolled back and trained on among the steps it rolled back from), and retention keeps every
file that another ``.ckz`` in the directory (a ``best.ckz`` saved against a step) loads from.

One manager writes a directory at a time: it holds an advisory lock (``.ckptzip.lock``, flock) for
its whole life, so two trainers pointed at one directory fail at once instead of deleting each
other's bases. A URL (``s3://bucket/run3``) is a bucket prefix, held with a lease object instead
(``storage.ObjectDirectory``; docs/OBJECT_STORAGE.md says what it guarantees).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from .api import load, save
from .chain import Base, resolve_relative, walk_chain
from .errors import ConfigError, Error, FormatError, VersionError
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

log = logging.getLogger("ckptzip")

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
    every ``keyframe_every`` checkpoints (``None``: deltas only, up to 64 a chain; ``1``:
    keyframes only).
    ``keep_last=N`` deletes older checkpoints after each save, except those a kept one needs
    and those another ``.ckz`` of the directory loads from. Steps go forward: a save is refused
    where a later step would still restore beside it (after a rollback, :meth:`discard_after`).
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
        #: Files whose header does not parse (damaged, not a .ckz, a newer format), by stamp: an
        #: unchanged one is not read again. A read that failed otherwise (I/O) is not kept.
        self._damaged: dict[str, tuple[tuple[Any, ...], FormatError]] = {}
        #: The newest step a file or a save of this manager may hold (None: not looked yet): a
        #: save of an earlier step checks the directory for later ones (see _check_order).
        self._top: int | None = None
        #: Steps of async saves submitted and not finished (under _pending_lock).
        self._in_flight: Counter[int] = Counter()
        #: Unrestorable newer step files already warned about, with their stamps (once each).
        self._warned: set[tuple[str, tuple[Any, ...]]] = set()
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
        #: from its decoded values (what lossy modes need to know, see ckptzip.save's resumed),
        #: where the save comes from the thread that restored it (``_restored_by``): a monitor
        #: thread's restore, to evaluate, is not what training went on from, and marking the
        #: next save resumed let a lossy chain's error compound (101x the update at budget 1.5).
        self._restored: int | None = None
        self._restored_by: int | None = None

    # -- public API -----------------------------------------------------------------------
    def save(self, step: int, state: Any, *, resumed: bool | None = None) -> None:
        """Checkpoint ``state`` as ``step``; returns once it is safe to change ``state``.

        ``resumed``: whether the training that made ``state`` went on from its base checkpoint
        as decoded (see :func:`ckptzip.save`). By default the manager tells: True for the first
        save after :meth:`restore` on the same thread when it is coded against the restored step,
        else False (a restore on another thread, to evaluate, is not what training went on from).

        Refused (a :class:`ckptzip.Error`, nothing saved) where a later step would still restore
        beside ``step``: after a rollback, see :meth:`discard_after`."""
        self._check(refused=step)
        if type(step) is not int or step < 0:
            raise ConfigError(f"step must be a non-negative int, not {step!r}")
        if resumed is not None and not isinstance(resumed, bool):
            raise ConfigError(f"resumed must be True, False or None, not {resumed!r}")
        self._check_order(step)
        restored, self._restored = self._restored, None
        if self._restored_by != threading.get_ident():
            restored = None  # restored on another thread: not what this training went on from
        resumed_from = restored if resumed is None else (-1 if resumed else None)
        self._slots.acquire()  # back-pressure: wait while max_pending saves are under way
        with self._pending_lock:
            self._top = step if self._top is None else max(self._top, step)
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
            with self._pending_lock:
                self._in_flight[step] += 1
            try:
                future = self._executor.submit(self._write_in_background, step, copy, resumed_from)
            except BaseException:
                self._landed(step)
                raise
        except BaseException:
            self._slots.release()
            self._keep_restored(restored)
            raise
        future.add_done_callback(lambda done: self._finished(step))
        with self._pending_lock:
            self._pending = [*(f for f in self._pending if not f.done()), future]

    def restore(self, step: int | None = None, *, map_location: Any = "cpu") -> Any:
        """The state saved as ``step`` (default: the latest restorable step, with a warning
        logged where newer step files are there but do not restore), after pending saves have
        finished. A step that does not restore raises, naming the first broken link of its
        chain."""
        if step is not None and (type(step) is not int or step < 0):
            raise ConfigError(f"step must be a non-negative int, not {step!r}")
        self.wait()
        with self._headers_lock:
            steps = self._restorable()
            if step is None:
                if not steps:
                    raise Error(f"{self.directory}: no checkpoint to restore"
                                f"{self._none_restores()}{self._foreign()}")
                step = self._newest(steps)
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
            self._restored, self._restored_by = step, threading.get_ident()
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
        """The newest step that is completely written and restorable; None where the directory
        holds no step file. Where step files are there but none restores (a keyframe deleted),
        it raises a :class:`ckptzip.Error` saying why, rather than None: a resume script that
        starts afresh on None would write over them. Newer step files that do not restore
        beside a restorable one are logged (a warning, once each)."""
        self._raise_pending_error()
        with self._headers_lock:
            steps = self._restorable()
            if not steps:
                none = self._none_restores()
                if none:
                    raise Error(f"{self.directory}: no restorable step{none}")
                return None
            return self._newest(steps)

    def steps(self) -> list[int]:
        """Every restorable step, ascending: the file is complete and its whole base chain is
        present and unchanged. Saves still under way are not listed."""
        self._raise_pending_error()
        with self._headers_lock:
            return self._restorable()

    def discard_after(self, step: int) -> list[int]:
        """Delete every step file after ``step`` (restorable or not), newest first, and return
        their steps: after a rollback (``restore(step)``), the steps of the run abandoned, which
        :meth:`save` refuses to leave beside the new ones. Pending saves finish first. Nothing is
        deleted where another ``.ckz`` of the directory (not a step file) loads from one of them,
        or restore() is reading one: that raises, naming it."""
        if type(step) is not int or step < 0:
            raise ConfigError(f"step must be a non-negative int, not {step!r}")
        self._check()
        self.wait()
        with self._headers_lock:
            self._restorable()
            later = self._files_after(step)
            needed = self._needed_by_others()
            if needed is None:
                raise Error(f"{self.directory}: not deleting the steps after {step}: a .ckz of the "
                            f"directory cannot be read to tell whether it loads from them (logged "
                            f"above); fix it or move it, then retry")
            users: dict[str, list[str]] = {}
            for _, path in later:
                if path in needed:
                    users.setdefault(needed[path], []).append(self._name(path))
            if users:
                uses = "; ".join(f"{user} loads from {', '.join(names)}"
                                 for user, names in users.items())
                raise Error(f"{self.directory}: not deleting the steps after {step}: {uses}; move "
                            f"{', '.join(users)} out of the directory first, or save "
                            f"{'it' if len(users) == 1 else 'them'} again standalone (nothing "
                            f"was deleted)")
            reading = [self._name(path) for _, path in later if path in self._reading]
            if reading:
                raise Error(f"{self.directory}: not deleting the steps after {step}: "
                            f"restore() is reading {', '.join(reading)}; retry once it is done "
                            f"(nothing was deleted)")
            for _, path in reversed(later):  # newest first: a crash leaves whole chains
                self._home.remove(path)
                self._headers.pop(path, None)
            gone = {path for _, path in later}
        with self._pending_lock:
            self._top = None  # looked again at the next save
        if self._held is not None and self._held.location in gone:
            self._held = None
        if self._restored is not None and self._restored > step:
            self._restored = None
        if later:
            log.info("%s: deleted the steps after %d: %s", self.directory, step,
                     ", ".join(str(found) for found, _ in later))
        return [found for found, _ in later]

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
        """Why ``step``'s file, where there is one, does not restore: the first broken link of
        its chain (hold the lock)."""
        path = self._path(step)
        if self._home.stamp(path) is None:
            return ""
        why = self._break(path)
        return f" ({step_file(step)} is there, but {why})" if why else ""

    def _break(self, path: str) -> str:
        """Why the file at ``path`` does not restore, and what to do: the first broken link of its
        chain, from the file back to its keyframe, named; "" where it restores (hold the lock)."""
        header = self._load_header(path)
        if not isinstance(header, _Header):
            return "it is gone" if header is None else f"it cannot be read ({header})"
        seen, child, links = {path}, path, 0
        while header.base_path is not None:
            links += 1
            base_path = header.base_path
            where = ("its base" if links == 1 else
                     f"its chain breaks {links} links back: {self._name(child)}'s base")
            name = self._name(base_path)
            if base_path in seen:
                return f"{where} {name} is a file of the chain after it (a loop): it never restores"
            base = self._load_header(base_path)
            if base is None:
                return f"{where} {name} is missing (looked for {base_path}); put it back"
            if not isinstance(base, _Header):
                return f"{where} {name} cannot be read ({base}); put back an intact copy"
            if base.id != header.base_id:
                return (f"{where} {name} is not the checkpoint it was coded against (content id "
                        f"{base.id}, not {header.base_id}): it was replaced; put the original back")
            seen.add(base_path)
            child, header = base_path, base
        return ""

    def _files_after(self, step: int) -> list[tuple[int, str]]:
        """The step files of the last listing after ``step``, with their steps, ascending (hold
        the lock)."""
        return sorted((found, path) for path in self._stamps
                      if (found := self._step_in(path)) is not None and found > step)

    def _none_restores(self) -> str:
        """For a directory with no restorable step: that step files are there all the same, and
        why the newest does not restore ("" where there is none; hold the lock)."""
        broken = [path for _, path in self._files_after(-1)]
        if not broken:
            return ""
        files = (f"the step file {self._name(broken[0])} is" if len(broken) == 1 else
                 f"{len(broken)} step files ({self._name(broken[0])} to "
                 f"{self._name(broken[-1])}) are")
        return (f", but {files} there and none restores ({self._name(broken[-1])}: "
                f"{self._break(broken[-1])}; or move the step files elsewhere to start afresh: "
                f"saves would write over them)")

    def _newest(self, steps: list[int]) -> int:
        """The newest of the restorable ``steps``, once the step files after it are accounted for:
        one that cannot be read now is refused (:meth:`_refuse_unreadable_after`), the others
        logged (:meth:`_warn_newer`), a fallback past them said, not silent (hold the lock)."""
        newest = steps[-1]
        self._refuse_unreadable_after(newest)
        self._warn_newer(newest)
        return newest

    def _refuse_unreadable_after(self, step: int) -> None:
        """Raise where a newer step file than ``step`` cannot be read now (no permission, an I/O
        error) or was written by a newer ckptzip, as opposed to damaged: falling back past an
        intact checkpoint would let the resumed run's next saves replace it (hold the lock)."""
        for _, path in reversed(self._files_after(step)):
            found = self._load_header(path)
            if isinstance(found, VersionError):
                raise VersionError(
                    f"{self.directory}: {self._name(path)} is newer than step {step}, the newest "
                    f"this ckptzip restores, and was written by a newer ckptzip ({found}); "
                    f"upgrade ckptzip (pip install -U ckptzip) to restore it, or restore({step}) "
                    f"explicitly to go on from there (its next saves may replace "
                    f"{self._name(path)})")
            if isinstance(found, Error) and not isinstance(found, FormatError):
                raise Error(f"{self.directory}: {self._name(path)} is newer than step {step}, the "
                            f"newest that restores, but cannot be read now ({found}); fix that "
                            f"(permissions, the disk) and retry, or restore({step}) explicitly to "
                            f"go on from there (its next saves may replace {self._name(path)})")

    def _warn_newer(self, step: int) -> None:
        """Log, once per file, that newer step files than ``step`` (the newest restorable) are
        there but do not restore: a restore() falls back past them (hold the lock)."""
        broken = [path for _, path in self._files_after(step)]
        if not broken:
            return
        newest = broken[-1]
        key = (newest, self._stamps[newest])
        if key in self._warned:
            return
        self._warned.add(key)
        files = (f"the newer step file {self._name(newest)} is" if len(broken) == 1 else
                 f"{len(broken)} newer step files (up to {self._name(newest)}) are")
        log.warning("%s: restoring step %d, the newest restorable one, but %s there and cannot be "
                    "restored (%s: %s)", self.directory, step, files, self._name(newest),
                    self._break(newest))

    def _check_order(self, step: int) -> None:
        """Refuse to save ``step`` where a later step would stay restorable beside it.

        A run rolled back to an earlier step and trained on would otherwise put its new steps
        among the abandoned later ones: retention keeps the later ones as the newest and deletes
        the new ones, and after a restart restore() returns the abandoned step. Deleting the
        later steps here would lose data nobody asked to lose; marking them abandoned would need
        a record beside the files (this directory has none: the files are the truth). So the
        save is refused, and the message says how to go on (discard_after, or move the files).
        A save that replaces a step the later ones are coded against goes on: they no longer
        restore (their base changed), as a run resumed from a step and saving the same steps
        again does, each later step in turn replaced. Cheap when steps go forward: the
        directory is looked at only when a later step may be there (``_top``)."""
        with self._pending_lock:
            if self._top is not None and self._top < step:
                return
            flying = [s for s, count in self._in_flight.items() if count]  # before the listing
        with self._headers_lock:
            steps = self._restorable()
            mine = self._path(step)
            later = sorted({s for s in steps if s > step
                            and mine not in self._chain_paths(self._path(s))}
                           | {s for s in flying if s > step})
            on_disk = [found for found, _ in self._files_after(-1)]
        with self._pending_lock:
            self._top = max([*on_disk, *flying], default=-1)
        if not later:
            return
        restored = self._restored if self._restored is not None and self._restored < step else None
        earlier = [s for s in steps if s < step]
        back_to = restored if restored is not None else (earlier[-1] if earlier else None)
        one = len(later) == 1
        names = ", ".join(step_file(s) for s in later[:3]) + (", ..." if len(later) > 3 else "")
        what = (f"step {later[0]} ({names}) is" if one else
                f"{len(later)} later steps ({names}) are")
        it, its = ("it", "it is") if one else ("them", "they are")
        discard = ("" if back_to is None else
                   f"call discard_after({back_to}) to delete every step after {back_to}, or ")
        raise Error(
            f"{self.directory}: refusing to save step {step}: {what} later and would still "
            f"restore beside it{' (or is being saved)' if set(later) & set(flying) else ''}, "
            f"so retention would keep {it} as the newest and delete the new steps, and restore() "
            f"would return step {later[-1]}. If you rolled back to an earlier step and train on "
            f"from there, {its} the abandoned run's: {discard}move {it} out of the directory, "
            f"then save again; otherwise save a step after {later[-1]}")

    def _finished(self, step: int) -> None:
        self._landed(step)
        self._slots.release()

    def _landed(self, step: int) -> None:
        """An async save of ``step`` is no longer in flight (written, or failed)."""
        with self._pending_lock:
            self._in_flight[step] -= 1
            if self._in_flight[step] <= 0:
                del self._in_flight[step]

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
        # on a bucket, completes only while the lease holds and the step is as found now
        with self._home.writing(path):
            if isinstance(state, Prepared):
                report = save(state, path, threads=self.threads, metadata={"step": step},
                              storage_options=self.storage_options)
            else:
                true_state = state
                report = save(
                    state, path, mode=self.mode, base=self._open_base(base, held),
                    threads=self.threads, metadata={"step": step},
                    keyframe_every=self.keyframe_every, resumed=self._resumed(base, resumed_from),
                    storage_options=self.storage_options, **self.mode_options,
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
                with self._home.writing(path):
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
        needs them, or another .ckz of the directory loads from them. Files that are not
        restorable are left alone."""
        with self._headers_lock:
            steps = self._restorable()
            others = self._needed_by_others()
            if others is None:
                return  # logged: a file that cannot be read now may load from any of them
            needed = set(others)
            for step in steps[-keep_last:]:
                needed.update(self._chain_paths(self._path(step)))
            # newest first: a crash between two deletions leaves only restorable chains, never a
            # delta whose base is gone (which, not being restorable, retention would never remove)
            for step in reversed(steps[:-keep_last]):
                path = self._path(step)
                if path not in needed and path not in self._reading:
                    self._home.remove(path)
                    self._headers.pop(path, None)

    def _needed_by_others(self) -> dict[str, str] | None:
        """The files that the other ``.ckz`` files of the last listing (not step files: a
        ``best.ckz`` saved with ``base=manager.path(step)``) load from, along their chains, as
        far as each link is the checkpoint it was coded against, each with the name of the (first)
        file that loads from it. One whose header does not parse
        loads from nothing: ignored. None where one cannot be read now (an I/O error) or by this
        version (a newer format): it may load from any step, so retention deletes nothing this
        time (logged). Headers are kept by stamp: an unchanged file is not read again (hold the
        lock)."""
        needed: dict[str, str] = {}
        for path in self._stamps:
            name = path[len(self.directory) + 1 :]
            if not name.endswith(".ckz") or step_of(name) is not None:
                continue
            seen, current, expected = {path}, path, None
            while True:
                try:
                    header = self._load_header(current)
                except Error as exc:  # not even its stamp (a store that does not answer)
                    header = exc
                if isinstance(header, Error) and (not isinstance(header, FormatError)
                                                  or isinstance(header, VersionError)):
                    # cannot be read now, or by this version: it may load from any step
                    log.warning("%s: keeping every step this time: %s cannot be read to tell "
                                "which steps it loads from (%s); fix or move it", self.directory,
                                current, header)
                    return None
                if not isinstance(header, _Header) or (expected is not None
                                                       and header.id != expected):
                    break  # missing, damaged or replaced: the chain loads from nothing further
                if current != path:
                    needed.setdefault(current, name)
                if header.base_path is None or header.base_path in seen:
                    break
                seen.add(header.base_path)
                current, expected = header.base_path, header.base_id
        return needed

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
            step = self._step_in(path)
            if step is not None:
                found[path] = step
        for cache in (self._headers, self._damaged):
            for path in [path for path in cache if path not in self._stamps]:
                del cache[path]
        if found:
            with self._pending_lock:  # only up: a save in flight may be later still
                self._top = max(-1 if self._top is None else self._top, *found.values())
        ok: dict[str, bool] = {}
        return sorted(step for path, step in found.items() if self._chain_ok(path, ok))

    def _step_in(self, path: str) -> int | None:
        """The step of a file of the directory's listing, or None where it is not a step file."""
        return step_of(path[len(self.directory) + 1 :])

    def _name(self, path: str) -> str:
        """``path`` for a message: its name in the directory, or the whole path elsewhere."""
        inside = path.startswith(self.directory + "/") and "/" not in path[len(self.directory) + 1 :]
        return path[len(self.directory) + 1 :] if inside else path

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
        """The header of ``path``; None where it is missing or cannot be read: not restorable."""
        header = self._load_header(path)
        return header if isinstance(header, _Header) else None

    def _load_header(self, path: str) -> _Header | Error | None:
        """The header of ``path``, or the error that reading it raised (a FormatError where it
        does not parse: kept by stamp), or None where there is no such file (hold the lock)."""
        stamp = self._stamps.get(path) or self._home.stamp(path)
        if stamp is None:
            return None
        cached = self._headers.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached
        damaged = self._damaged.get(path)
        if damaged is not None and damaged[0] == stamp:
            return damaged[1]
        try:
            with CheckpointFile.open(path, storage_options=self.storage_options) as checkpoint:
                ref = checkpoint.header.base
                base_path = base_id = None
                if ref is not None and ref.path is not None:
                    base_path = resolve_relative(path, ref.path)
                    base_path = base_path if is_url(base_path) else os.path.normpath(base_path)
                    base_id = ref.id
                header = _Header(stamp, checkpoint.id, base_path, base_id)
        except FormatError as exc:  # damaged, truncated, not a .ckz, a newer format: as it is
            self._damaged[path] = (stamp, exc)
            return exc
        except Error as exc:  # cannot be read now (I/O): asked again next time
            return exc
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
