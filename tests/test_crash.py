"""Crash safety: SIGKILL at random moments during saves never leaves a broken checkpoint that
looks complete, and the previous checkpoint always survives bit for bit."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ckptzip

from .reliability_counts import record

TRIALS = 50
ELEMENTS = 300_000

#: Imports once, then forks one child per trial (a fork costs milliseconds, a fresh interpreter
#: with torch seconds): ``save PATH`` or ``manager DIRECTORY LOG``; it reports the child's pid,
#: then its wait status once the test has killed it.
ZYGOTE = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from tests import test_crash
test_crash.manager_state(1)
print("ready", flush=True)
for line in sys.stdin:
    kind, *args = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            getattr(test_crash, kind + "_child")(*args)
        finally:
            os._exit(1)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


class Zygote:
    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "ready"

    def kill_after(self, delay: float, *command: object) -> None:
        """Fork a child running ``command``, SIGKILL it ``delay`` seconds later, reap it."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(" ".join(map(str, command)) + "\n")
        stdin.flush()
        pid = int(stdout.readline())
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        status = int(stdout.readline())
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    process = Zygote()
    yield process
    process.close()


def save_child(path: str) -> None:
    version = 1
    while True:
        ckptzip.save({"w": torch.full((ELEMENTS,), float(version)), "version": version}, path,
                     threads=1)
        version += 1


def check(path: Path) -> int:
    """``path`` must load and be internally consistent: one whole version, never a mix."""
    state = ckptzip.load(path, threads=1)
    version = state["version"]
    assert torch.equal(state["w"], torch.full((ELEMENTS,), float(version))), path
    return version


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and fork are POSIX")
def test_sigkill_during_save_never_breaks_the_checkpoint(tmp_path: Path, zygote: Zygote) -> None:
    rng = random.Random(1234)
    mid_write = advanced = 0
    for trial in range(TRIALS):
        directory = tmp_path / str(trial)
        directory.mkdir()
        path = directory / "ckpt.ckz"
        ckptzip.save({"w": torch.full((ELEMENTS,), 0.0), "version": 0}, path, threads=1)
        zygote.kill_after(rng.uniform(0.0, 0.15), "save", path)
        advanced += check(path) > 0
        leftovers = [p for p in directory.iterdir() if p != path]
        mid_write += bool(leftovers)
        for leftover in leftovers:  # an interrupted write never has the checkpoint's name
            assert ckptzip.storage.TEMP_MARKER in leftover.name
            old = time.time() - ckptzip.storage.STALE_TEMP_SECONDS - 1
            os.utime(leftover, (old, old))
        if leftovers:  # the next save of the name removes what the killed one left
            ckptzip.save({"w": torch.full((ELEMENTS,), -1.0), "version": -1}, path, threads=1)
            assert list(directory.iterdir()) == [path]
    assert mid_write >= TRIALS // 5, f"only {mid_write} of {TRIALS} kills landed inside a write"
    assert advanced >= TRIALS // 5, f"only {advanced} of {TRIALS} children finished a save"
    record("crash.save_sigkill", trials=TRIALS, kills=TRIALS, kills_mid_write=mid_write,
           children_that_finished_a_save=advanced, broken_loaded=0, lost=0)


def test_a_save_removes_only_the_dead_writes_of_its_own_name(tmp_path: Path) -> None:
    from ckptzip.storage import STALE_TEMP_SECONDS, temp_prefix

    def temp(name: str, age: float, tag: str = "") -> Path:
        path = tmp_path / (temp_prefix(str(tmp_path), name, tag) + "abcdefg_")
        path.write_bytes(b"partial")
        os.utime(path, (time.time() - age, time.time() - age))
        return path

    stale = STALE_TEMP_SECONDS + 5
    dead = [temp("ckpt.ckz", stale), temp("ckpt.ckz", 10 * stale)]
    young = temp("ckpt.ckz", 1.0)  # a writer between its mkstemp and its lock, maybe
    other = temp("other.ckz", stale)  # another name's: another rank's, another job's
    aside = temp("ckpt.ckz", stale, "old-")  # a directory swap's previous one: not a write
    folder = tmp_path / (temp_prefix(str(tmp_path), "ckpt.ckz") + "folder00")
    folder.mkdir()
    live = temp("ckpt.ckz", stale)
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a live writer holds its file
    try:
        ckptzip.save({"w": torch.ones(3)}, tmp_path / "ckpt.ckz")
        assert not any(p.exists() for p in dead)
        assert all(p.exists() for p in (young, other, aside, folder, live))
    finally:
        os.close(held)
    ckptzip.save({"w": torch.ones(3)}, tmp_path / "ckpt.ckz")
    assert not live.exists()


# -- CheckpointManager: SIGKILL during async saves with deltas and retention ------------------------

MANAGER_TRIALS = 50
MANAGER_ELEMENTS = 100_000
KEEP_LAST = 2
KEYFRAME_EVERY = 3

def manager_child(directory: str, log: str) -> None:
    """Reopen the run's directory, continue its chain, save until killed; log each return."""
    from ckptzip.manager import CheckpointManager

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    manager = CheckpointManager(directory, keep_last=KEEP_LAST, keyframe_every=KEYFRAME_EVERY,
                                threads=1)
    step = (manager.latest_step() or 0) + 1
    os.write(fd, b"open\n")
    while True:
        manager.save(step, manager_state(step))  # returns once step - 1 is written
        os.write(fd, f"saved {step}\n".encode())
        step += 1


def manager_state(step: int) -> dict:
    """The state saved as ``step``: a fixed tensor with a few step-dependent changes (so each
    checkpoint is a small delta on the one before), recomputable by the parent."""
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(MANAGER_ELEMENTS, generator=generator)
    w[step % 97 :: 89] += step * 1e-3
    return {"model": {"w": w, "b": torch.full((64,), float(step))}, "step": step}


def check_directory(directory: Path, last_saved: int) -> tuple[int, set[str]]:
    """After a kill: only complete checkpoints carry a step name, the reopened manager lists only
    steps that restore bit-exactly, and it has lost no step the child knew to be written."""
    from ckptzip.manager import LOCK_NAME, STEP_FILE, CheckpointManager
    from ckptzip.storage import TEMP_MARKER

    from .test_corruption import bits_equal

    names = os.listdir(directory)
    temps = [name for name in names if TEMP_MARKER in name]
    steps_on_disk = {int(m.group(1)): directory / name for name in names if (m := STEP_FILE.match(name))}
    assert set(names) == {LOCK_NAME, *temps, *(p.name for p in steps_on_disk.values())}, names
    orphans: set[str] = set()
    for step, path in steps_on_disk.items():
        with ckptzip.open(path, threads=1) as ckpt:  # a complete file: header and size agree
            assert ckpt.metadata == {"step": step}
        try:
            loaded = ckptzip.load(path, threads=1)
        except ckptzip.BaseMismatchError:
            orphans.add(path.name)  # retention was killed between two deletions of one old chain
            continue
        assert bits_equal(loaded, manager_state(step)), path
    with CheckpointManager(directory, threads=1) as manager:
        assert not [name for name in os.listdir(directory) if TEMP_MARKER in name]
        steps = manager.steps()
        latest = manager.latest_step()
        assert latest == (steps[-1] if steps else None)
        if last_saved >= 2:  # save(N) returned, so step N - 1 was written: it must be there
            assert latest is not None and last_saved - 1 <= latest <= last_saved + 1, (steps, last_saved)
        for step in steps:
            assert bits_equal(manager.restore(step), manager_state(step)), step
        assert len(steps) == len(steps_on_disk) - len(orphans)
    return len(temps), orphans


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and fork are POSIX")
def test_sigkill_during_manager_saves_never_loses_or_breaks_a_checkpoint(
    tmp_path: Path, zygote: Zygote
) -> None:
    rng = random.Random(4321)
    directory = tmp_path / "run"
    mid_write = saves = before_first_save = 0
    orphans: set[str] = set()
    for trial in range(MANAGER_TRIALS):
        log = tmp_path / f"log-{trial}"
        zygote.kill_after(rng.uniform(0.0, 0.3), "manager", directory, log)
        lines = log.read_text().split() if log.exists() else []
        saved = [int(lines[i + 1]) for i, word in enumerate(lines) if word == "saved"]
        before_first_save += not saved
        saves += len(saved)
        temps, orphaned = check_directory(directory, saved[-1] if saved else 0)
        mid_write += temps > 0
        orphans |= orphaned
    assert mid_write >= MANAGER_TRIALS // 5, f"only {mid_write} kills landed inside a write"
    assert saves >= 2 * MANAGER_TRIALS, f"only {saves} saves returned: the kills came too early"
    record("crash.manager_sigkill", trials=MANAGER_TRIALS, kills=MANAGER_TRIALS,
           kills_mid_write=mid_write, kills_before_first_save=before_first_save,
           saves_returned=saves, orphaned_files_left_by_interrupted_retention=len(orphans),
           broken_listed=0, lost=0)


class Killed(BaseException):
    """Stands for the process dying at that instant."""


def test_retention_killed_midway_leaves_no_orphan_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptzip.manager import STEP_FILE, CheckpointManager

    manager = CheckpointManager(tmp_path, keep_last=1, keyframe_every=3, async_save=False)
    for step in (1, 2, 3):  # a keyframe and two deltas on it
        manager.save(step, manager_state(step))
    real_remove, removed = os.remove, []

    def remove_then_die(path: str) -> None:
        if removed:
            raise Killed
        removed.append(path)
        real_remove(path)

    monkeypatch.setattr(os, "remove", remove_then_die)
    with pytest.raises(Killed):
        manager.save(4, manager_state(4))  # a keyframe: retention drops the chain 1 <- 2 <- 3
    monkeypatch.undo()
    assert removed
    manager.close()
    with CheckpointManager(tmp_path, keep_last=1, keyframe_every=3, async_save=False) as reopened:
        reopened.save(5, manager_state(5))
        on_disk = sorted(int(m.group(1)) for n in os.listdir(tmp_path) if (m := STEP_FILE.match(n)))
        assert on_disk == reopened.steps() == [4, 5]
