"""CheckpointManager: async snapshots, chains, retention, the directory lock, background errors."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip import manager as manager_module
from ckptzip.manager import CheckpointManager, step_file
from ckptzip.snapshot import snapshot


def training_state(step: int) -> dict[str, Any]:
    """A tiny model after ``step`` AdamW steps: consecutive steps differ a little, so that a
    checkpoint is coded as a delta against the one before."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(step):
        optimizer.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}


def assert_same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("async_save", [True, False])
def test_save_restore_steps(tmp_path: Path, async_save: bool) -> None:
    states = {step: training_state(step) for step in (10, 20, 30)}
    with CheckpointManager(tmp_path, async_save=async_save) as manager:
        assert manager.latest_step() is None and manager.steps() == []
        for step, state in states.items():
            manager.save(step, state)
        manager.wait()
        assert manager.steps() == [10, 20, 30]
        assert manager.latest_step() == 30
        assert_same(manager.restore(), states[30])
        assert_same(manager.restore(10), states[10])
        with pytest.raises(ckptzip.Error, match="step 15"):
            manager.restore(15)
    with ckptzip.open(tmp_path / step_file(30)) as last:
        assert last.chain_depth == 2 and last.metadata == {"step": 30}


def test_snapshot_is_a_copy_that_keeps_structure() -> None:
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    sd = OrderedDict(w=weight, tied=weight, row=weight[1])
    sd._metadata = OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    state = {"sd": sd, "n": 3, "name": "x"}
    copy = snapshot(state)
    weight.add_(1)
    assert copy["sd"]["w"][0, 0].item() == 0.0
    storage = copy["sd"]["w"].untyped_storage().data_ptr()
    assert storage != weight.untyped_storage().data_ptr()
    for key in ("tied", "row"):
        assert copy["sd"][key].untyped_storage().data_ptr() == storage
    assert copy["sd"]._metadata == {"": {"version": 1}}
    assert type(copy["sd"]) is OrderedDict and copy["n"] == 3


def test_async_save_snapshots_before_returning(tmp_path: Path) -> None:
    state = training_state(1)
    expected = snapshot(state)
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, state)
        for tensor in state["model"].values():
            tensor.zero_()
        assert_same(manager.restore(1), expected)


def test_unsupported_value_fails_in_save_itself(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as manager, pytest.raises(ckptzip.UnsupportedError, match="bad"):
        manager.save(1, {"bad": object()})


@pytest.mark.parametrize("keep_last, keyframe_every", [(1, 3), (2, 4), (1, None)])
def test_retention_keeps_every_base_a_kept_step_needs(
    tmp_path: Path, keep_last: int, keyframe_every: int | None
) -> None:
    with CheckpointManager(tmp_path, keep_last=keep_last, keyframe_every=keyframe_every,
                           async_save=False) as manager:
        for step in range(1, 9):
            manager.save(step, training_state(step))
            steps = manager.steps()
            assert steps[-keep_last:] == list(range(max(1, step - keep_last + 1), step + 1))
            files = sorted(p.name for p in tmp_path.glob("step-*.ckz"))
            assert files == [step_file(s) for s in steps]
            for kept in steps:
                ckptzip.load(tmp_path / step_file(kept))
            if keyframe_every is not None:
                assert len(steps) <= keep_last + keyframe_every - 1


def test_only_complete_restorable_steps_are_listed(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as manager:
        for step in (1, 2, 3):
            manager.save(step, training_state(step))
        (tmp_path / (step_file(4) + ".ckz-tmp-abc")).write_bytes(b"partial")
        (tmp_path / step_file(5)).write_bytes(b"\x89CKZ truncated")
        assert manager.steps() == [1, 2, 3]
        os.remove(tmp_path / step_file(2))  # 3 is a delta against 2: no longer restorable
        assert manager.steps() == [1]
        assert manager.latest_step() == 1
        manager.save(6, training_state(6))  # chains onto 1, the newest restorable step
        with ckptzip.open(tmp_path / step_file(6)) as six:
            assert six.base_ref is not None and six.base_ref["path"] == step_file(1)


def test_files_not_named_as_the_manager_names_them_are_not_its_files(tmp_path: Path) -> None:
    """``step-1000.ckz`` saved by hand (the README's Python section, then a manager on the same
    directory) matched the manager's pattern, so it was listed as step 1000, while restore,
    bases and retention rebuild the path as ``step-00001000.ckz``: restore and every later
    save failed. Only the exact name ``step_file(step)`` is the manager's; the others are left
    alone, never listed, taken as a base or deleted."""
    by_hand = {"step-1000.ckz": 1000, "step-0000002.ckz": 2, "step-000000003.ckz": 3}
    for name, step in by_hand.items():
        ckptzip.save(training_state(step), tmp_path / name)
    assert [manager_module.step_of(name) for name in by_hand] == [None, None, None]
    assert manager_module.step_of(step_file(2)) == 2
    assert manager_module.step_of(step_file(123_456_789)) == 123_456_789  # past 8 digits
    with CheckpointManager(tmp_path, async_save=False, keep_last=1, keyframe_every=1) as manager:
        assert manager.steps() == [] and manager.latest_step() is None
        found = r"step-1000\.ckz, not named as.*step-00000002\.ckz for step 2.*ckptzip\.load"
        with pytest.raises(ckptzip.Error, match=found):
            manager.restore()
        with pytest.raises(ckptzip.Error, match=r"step 1000.*step-1000\.ckz"):
            manager.restore(1000)
        for step in (1000, 2000, 3000):  # its own step 1000 beside the one by hand, pruned
            manager.save(step, training_state(step % 7))
            assert manager.steps() == [step]
            assert_same(manager.restore(), training_state(step % 7))
    assert sorted(p.name for p in tmp_path.glob("step-*.ckz")) == sorted([*by_hand, step_file(3000)])
    for name, step in by_hand.items():
        assert_same(ckptzip.load(tmp_path / name), training_state(step))


def test_reopening_continues_the_chain_and_drops_stale_temp_files(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, training_state(1))
    stale = tmp_path / (step_file(2) + ".ckz-tmp-x")
    stale.write_bytes(b"")
    with CheckpointManager(tmp_path) as manager:
        assert not stale.exists()
        manager.save(2, training_state(2))
    with ckptzip.open(tmp_path / step_file(2)) as two:
        assert two.chain_depth == 1


def test_one_manager_per_directory(tmp_path: Path) -> None:
    first = CheckpointManager(tmp_path)
    with pytest.raises(ckptzip.Error, match=str(tmp_path)):
        CheckpointManager(tmp_path)
    first.close()
    first.close()
    with pytest.raises(ckptzip.Error, match="closed"):
        first.save(1, {})
    CheckpointManager(tmp_path).close()


def test_background_error_surfaces_on_next_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_save(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    manager = CheckpointManager(tmp_path)
    monkeypatch.setattr(manager_module, "save", failing_save)
    manager.save(7, training_state(7))
    with pytest.raises(ckptzip.Error, match=r"step 7.*No space left") as info:
        manager.wait()
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    manager.save(8, training_state(8))  # the error was reported once; saving goes on
    manager.close()
    assert CheckpointManager(tmp_path).steps() == [8]


def test_back_pressure_one_save_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    started: list[int] = []
    real_save = manager_module.save

    def gated_save(state: Any, path: Any, **kwargs: Any) -> Any:
        started.append(state["step"])
        release.wait(10)
        return real_save(state, path, **kwargs)

    monkeypatch.setattr(manager_module, "save", gated_save)
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, training_state(1))
        second = threading.Thread(target=manager.save, args=(2, training_state(2)))
        second.start()
        second.join(0.3)
        assert second.is_alive() and started == [1]  # blocked behind the first save
        release.set()
        second.join(10)
    assert started == [1, 2]


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ckptzip.ConfigError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)
    with pytest.raises(ckptzip.ConfigError):
        CheckpointManager(tmp_path, mode="no-such-mode")
    with pytest.raises(ckptzip.ConfigError, match="no_such_option"):
        CheckpointManager(tmp_path, no_such_option=4)
    for threads in ("x", -1, 1.5):  # refused here, not by the first background save
        with pytest.raises(ckptzip.ConfigError, match="threads must be"):
            CheckpointManager(tmp_path, threads=threads)  # type: ignore[arg-type]
    with CheckpointManager(tmp_path) as manager, pytest.raises(ckptzip.ConfigError, match="step"):
        manager.save(-1, {})


# What a user hunt found (session 39); each failed before its fix.


def test_every_background_failure_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two saves in flight both may fail before a call sees them: the second failure was
    dropped, and its step silently missing. Both are named, with the save that was refused."""
    real = manager_module.save
    go = threading.Event()

    def failing_save(state: Any, path: str, **kwargs: Any) -> Any:
        step = kwargs.get("metadata", {}).get("step")
        if step == 2:
            go.wait(30)  # until step 3 is queued behind it
        if step in (2, 3):
            raise OSError(28, "No space left on device")
        return real(state, path, **kwargs)

    monkeypatch.setattr(manager_module, "save", failing_save)
    with CheckpointManager(tmp_path, max_pending=2) as manager:
        manager.save(1, training_state(1))
        manager.wait()
        manager.save(2, training_state(2))
        manager.save(3, training_state(3))
        pending = list(manager._pending)
        go.set()
        for future in pending:
            future.exception()  # both done, neither seen yet
        with pytest.raises(ckptzip.Error, match=r"step 2.*step 3.*step 4 was not started") as info:
            manager.save(4, training_state(4))
        assert isinstance(info.value.__cause__, OSError)
        manager.save(4, training_state(4))
    assert CheckpointManager(tmp_path).steps() == [1, 4]


def test_a_refused_save_keeps_restores_resumed_mark(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The first save after restore() is marked resumed; a save refused before it was under
    way consumed the mark, and the corrected save went out unmarked."""
    with CheckpointManager(tmp_path, async_save=False) as manager:
        manager.save(1, training_state(1))
        manager.save(2, training_state(2))
    marks: list[bool] = []
    real = manager_module.save

    def recording_save(state: Any, path: str, **kwargs: Any) -> Any:
        marks.append(kwargs.get("resumed", False))
        return real(state, path, **kwargs)

    monkeypatch.setattr(manager_module, "save", recording_save)
    for async_save in (False, True):
        with CheckpointManager(tmp_path, async_save=async_save) as manager:
            manager.restore(2)
            with pytest.raises(ckptzip.UnsupportedError):
                manager.save(3, {**training_state(3), "sched": object()})
            manager.save(3, training_state(3))
        assert marks[-1] is True


def test_restore_refuses_a_step_that_is_no_int(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, async_save=False) as manager:
        manager.save(1, training_state(1))
        for bad in (1.0, "1", -1):
            with pytest.raises(ckptzip.ConfigError, match="step must be a non-negative int"):
                manager.restore(bad)  # type: ignore[arg-type]


def test_restore_says_why_a_step_does_not_restore(tmp_path: Path) -> None:
    """A step whose file is there but whose base is gone: the refusal said only "no restorable
    checkpoint"; it now says what is wrong with the file."""
    with CheckpointManager(tmp_path, async_save=False) as manager:
        for step in (1, 2, 3):
            manager.save(step, training_state(step))
    os.remove(tmp_path / step_file(2))
    with CheckpointManager(tmp_path) as manager, pytest.raises(
            ckptzip.Error, match=r"step-00000003.ckz is there, but .*its base .*is missing"):
        manager.restore(3)


def test_what_is_no_regular_file_is_not_a_step(tmp_path: Path) -> None:
    """A FIFO named like a step blocked steps() for good (its header read waits for a writer);
    a link in a loop raised a bare OSError; a removed directory a bare FileNotFoundError."""
    with CheckpointManager(tmp_path / "run", async_save=False) as manager:
        manager.save(1, training_state(1))
    os.mkfifo(tmp_path / "run" / step_file(2))
    (tmp_path / "run" / "loop").symlink_to(tmp_path / "run" / "loop")
    with CheckpointManager(tmp_path / "run", async_save=False) as manager:
        assert manager.steps() == [1] and manager.latest_step() == 1
        manager.save(3, training_state(3))
        assert manager.steps() == [1, 3]
        for name in os.listdir(tmp_path / "run"):
            os.remove(tmp_path / "run" / name)
        os.rmdir(tmp_path / "run")
        with pytest.raises(ckptzip.Error, match="cannot list the directory"):
            manager.steps()
        manager._closed = True  # its directory is gone: nothing left to release but the lock


def test_close_releases_the_lock_forked_children_share(tmp_path: Path) -> None:
    """A DataLoader's workers forked while the manager was open share its lock's descriptor:
    closing the manager's copy alone kept the directory locked until they exited, and a new
    manager in the same process was refused, naming this process as the other writer."""
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(1, training_state(1))
    child = os.fork()
    if child == 0:  # a worker: holds the descriptor, never touches the manager
        import time

        time.sleep(5)
        os._exit(0)
    try:
        manager.close()
        with CheckpointManager(tmp_path) as again:
            assert again.steps() == [1]
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


class CountingOpens:
    """Stands in for CheckpointFile in the manager's module: counts the header reads per name."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def open(self, path: Any, **kwargs: Any) -> Any:
        self.names.append(os.path.basename(os.fspath(path)))
        return ckptzip.CheckpointFile.open(path, **kwargs)


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_retention_keeps_what_another_ckz_of_the_directory_loads_from(
        tmp_path: Path, where: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A best.ckz saved as a delta against a managed step (``base=manager.path(3)``) lost its
    base to keep_last: retention counted only the chains of the kept steps. Every file another
    .ckz of the directory loads from is kept now, through that file's own chain too; one that
    does not parse loads from nothing, and each header is read once while its file is
    unchanged."""
    options = None
    directory: str = os.fspath(tmp_path)
    if where == "bucket":
        s3_server = request.getfixturevalue("s3_server")
        options = s3_server.storage_options()
        directory = f"s3://{s3_server.bucket()}/run"
    with CheckpointManager(directory, keep_last=2, async_save=False,
                           storage_options=options) as manager:
        for step in range(1, 5):
            manager.save(step, training_state(step))
        best, better = training_state(3), training_state(4)
        ckptzip.save(best, manager.path(3).replace(step_file(3), "best.ckz"), base=manager.path(3),
                     storage_options=options)
        ckptzip.save(better, manager.path(3).replace(step_file(3), "better.ckz"),
                     base=manager.path(3).replace(step_file(3), "best.ckz"),
                     storage_options=options)  # a chain of its own through best.ckz
        ckptzip.save(training_state(2), manager.path(3).replace(step_file(3), "junk.ckz"),
                     storage_options=options)
        junk = manager.path(3).replace(step_file(3), "junk.ckz")
        if where == "local":
            with open(junk, "r+b") as handle:  # a header that no longer parses
                handle.write(b"not a ckz")
        opens = CountingOpens()
        monkeypatch.setattr(manager_module, "CheckpointFile", opens)
        for step in range(5, 12):
            manager.save(step, training_state(step))
        monkeypatch.undo()
        # 1 <- 2 <- 3 for best.ckz and better.ckz; the keyframe 9 <- 10 <- 11 for the newest two
        assert manager.steps() == [1, 2, 3, 9, 10, 11]
        for name in ("best.ckz", "better.ckz", "junk.ckz"):
            assert opens.names.count(name) <= 1, opens.names
        assert_same(ckptzip.load(manager.path(3).replace(step_file(3), "best.ckz"),
                                 storage_options=options), best)
        assert_same(ckptzip.load(manager.path(3).replace(step_file(3), "better.ckz"),
                                 storage_options=options), better)


def test_retention_waits_for_a_ckz_it_cannot_read_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A .ckz of the directory that cannot be read now (an I/O error, not a damaged header)
    may load from any step: retention deletes nothing while it lasts, and says so."""
    with CheckpointManager(tmp_path, keep_last=1, keyframe_every=1, async_save=False) as manager:
        manager.save(1, training_state(1))
        ckptzip.save(training_state(1), tmp_path / "best.ckz", base=manager.path(1))
        manager.save(2, training_state(2))
        assert manager.steps() == [1, 2]
        real = manager_module.CheckpointFile

        class Unreadable:
            @staticmethod
            def open(path: Any, **kwargs: Any) -> Any:
                if os.path.basename(path) == "best.ckz":
                    raise ckptzip.Error(f"{path}: cannot open: Permission denied")
                return real.open(path, **kwargs)

        monkeypatch.setattr(manager_module, "CheckpointFile", Unreadable)
        os.utime(tmp_path / "best.ckz", ns=(1, 1))  # changed: its header is read again
        with caplog.at_level(logging.WARNING, logger="ckptzip"):
            manager.save(3, training_state(3))
        assert manager.steps() == [1, 2, 3]
        assert "keeping every step this time" in caplog.text and "best.ckz" in caplog.text
        monkeypatch.undo()
        manager.save(4, training_state(4))  # readable again: best.ckz needs 1 only
        assert manager.steps() == [1, 4]


def test_restore_names_the_first_broken_link_of_the_chain(tmp_path: Path) -> None:
    """A chain broken further back than the step's own base: restore(step) said only "no
    restorable checkpoint" with the steps listed; it names the first broken link now (missing,
    damaged or replaced), wherever it is in the chain."""
    with CheckpointManager(tmp_path, keyframe_every=None, async_save=False) as manager:
        for step in range(1, 9):
            manager.save(step, training_state(step))
    os.rename(tmp_path / step_file(3), tmp_path / "aside.ckz")
    with CheckpointManager(tmp_path) as manager:
        with pytest.raises(ckptzip.Error, match=(
                r"step 8; steps are \[1, 2\] \(step-00000008\.ckz is there, but its chain breaks "
                r"5 links back: step-00000004\.ckz's base step-00000003\.ckz is missing "
                r"\(looked for .*step-00000003\.ckz\); put it back\)")):
            manager.restore(8)
        with pytest.raises(ckptzip.Error, match=r"step-00000004\.ckz is there, but its base "
                           r"step-00000003\.ckz is missing"):
            manager.restore(4)
    (tmp_path / step_file(3)).write_bytes(b"\x89CKZ truncated")
    with CheckpointManager(tmp_path) as manager, pytest.raises(
            ckptzip.Error, match=r"breaks 5 links back: step-00000004\.ckz's base "
                                 r"step-00000003\.ckz cannot be read \(.*\); put back an intact"):
        manager.restore(8)
    ckptzip.save(training_state(30), tmp_path / step_file(3))  # another checkpoint in its place
    with CheckpointManager(tmp_path) as manager, pytest.raises(
            ckptzip.Error, match=r"breaks 5 links back: step-00000004\.ckz's base "
                                 r"step-00000003\.ckz is not the checkpoint it was coded against "
                                 r"\(content id \w+, not \w+\): it was replaced"):
        manager.restore(8)
    os.replace(tmp_path / "aside.ckz", tmp_path / step_file(3))
    with CheckpointManager(tmp_path) as manager:
        assert manager.steps() == list(range(1, 9))


def test_restore_says_when_it_falls_back_past_newer_step_files(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """restore() with no step went back to an older step, without a word, where newer step files
    were there but did not restore (a link of their chain lost): it logs a warning now, naming
    the newest and why, once per file (latest_step() too)."""
    with CheckpointManager(tmp_path, keyframe_every=None, async_save=False) as manager:
        for step in range(1, 6):
            manager.save(step, training_state(step))
    os.remove(tmp_path / step_file(3))
    with caplog.at_level(logging.WARNING, logger="ckptzip"), CheckpointManager(tmp_path) as manager:
        assert_same(manager.restore(), training_state(2))
        warned = [r.getMessage() for r in caplog.records if r.name == "ckptzip"]
        assert len(warned) == 1, warned
        assert ("restoring step 2, the newest restorable one, but 2 newer step files (up to "
                "step-00000005.ckz) are there and cannot be restored (step-00000005.ckz: its chain "
                "breaks 2 links back: step-00000004.ckz's base step-00000003.ckz is missing"
                ) in warned[0]
        assert manager.latest_step() == 2
        manager.restore()
        assert len([r for r in caplog.records if r.name == "ckptzip"]) == 1  # once a file


def test_step_files_none_of_which_restores_are_not_an_empty_directory(tmp_path: Path) -> None:
    """With the keyframe deleted, latest_step() was None and restore() said "no checkpoint to
    restore" beside four step files: a resume script that starts afresh on None wrote over
    them. latest_step() and restore() raise now, saying they are there and why none restores."""
    with CheckpointManager(tmp_path, keyframe_every=None, async_save=False) as manager:
        for step in range(1, 6):
            manager.save(step, training_state(step))
    os.remove(tmp_path / step_file(1))
    why = (r", but 4 step files \(step-00000002\.ckz to step-00000005\.ckz\) are there and none "
           r"restores \(step-00000005\.ckz: its chain breaks 4 links back: step-00000002\.ckz's "
           r"base step-00000001\.ckz is missing .*start afresh")
    with CheckpointManager(tmp_path) as manager:
        assert manager.steps() == []
        with pytest.raises(ckptzip.Error, match="no restorable step" + why):
            manager.latest_step()
        with pytest.raises(ckptzip.Error, match="no checkpoint to restore" + why):
            manager.restore()
    with CheckpointManager(tmp_path / "empty") as manager:
        assert manager.latest_step() is None


def test_a_save_among_later_steps_after_a_rollback_is_refused(tmp_path: Path) -> None:
    """Rolled back from a bad step 50 (restore(40)) and trained on: saves 41-43 were taken, keep_last
    kept the abandoned step 50 and deleted 41 and 42, and after a restart restore() returned step
    50. A save that would leave a later step restorable beside it is refused now, saying what to
    do; discard_after(40) deletes the abandoned steps (nothing else does). A save that replaces
    a step the later ones are coded against goes on (a run resumed from an earlier step saving
    the same steps again): those no longer restore, each replaced in turn."""
    with CheckpointManager(tmp_path, keep_last=2) as manager:
        for step in (10, 20, 30, 40, 50):
            manager.save(step, training_state(step // 10))
        assert_same(manager.restore(40), training_state(4))
        with pytest.raises(ckptzip.Error, match=(
                r"refusing to save step 41: step 50 \(step-00000050\.ckz\) is later and would still "
                r"restore beside it, .*restore\(\) would return step 50\. .*call discard_after\(40\) "
                r"to delete every step after 40, or move it out of the directory")):
            manager.save(41, training_state(5))
        assert not (tmp_path / step_file(41)).exists()
        assert manager.discard_after(40) == [50]
        for step in (41, 42, 43):
            manager.save(step, training_state(step - 36))
        manager.wait()
        with ckptzip.open(tmp_path / step_file(41)) as first:
            assert first.base_ref is not None and first.base_ref["path"] == step_file(40)
        with pytest.raises(ckptzip.Error, match=r"step 60 .* is later and would still restore"):
            manager.save(60, training_state(1))
            manager.save(55, training_state(2))  # 60 is being saved, or saved: refused either way
    with CheckpointManager(tmp_path, keep_last=2) as manager:
        assert manager.latest_step() == 60
        assert manager.discard_after(43) == [60]
        assert manager.steps()[-2:] == [42, 43]
        assert_same(manager.restore(), training_state(7))
    with CheckpointManager(tmp_path / "again", keyframe_every=8, async_save=False) as manager:
        for step in (1, 2, 3, 4):
            manager.save(step, training_state(step))
        manager.restore(2)
        manager.save(3, training_state(5))  # 4 is coded against 3: it no longer restores
        assert manager.steps() == [1, 2, 3]
        manager.save(4, training_state(6))
        assert manager.steps() == [1, 2, 3, 4]
        assert_same(manager.restore(), training_state(6))


def test_discard_after_keeps_what_another_ckz_loads_from(tmp_path: Path) -> None:
    """discard_after deletes nothing where another .ckz of the directory loads from a step it
    would delete, and says which."""
    with CheckpointManager(tmp_path, async_save=False) as manager:
        for step in (1, 2, 3):
            manager.save(step, training_state(step))
        ckptzip.save(training_state(3), tmp_path / "best.ckz", base=manager.path(3))
        with pytest.raises(ckptzip.Error, match=r"best\.ckz loads from step-00000002\.ckz, "
                           r"step-00000003\.ckz; move best\.ckz out of the directory"):
            manager.discard_after(1)
        assert manager.steps() == [1, 2, 3]
        os.remove(tmp_path / "best.ckz")
        assert manager.discard_after(1) == [2, 3]
        assert manager.steps() == [1]
        with pytest.raises(ckptzip.ConfigError, match="non-negative int"):
            manager.discard_after(-1)


def test_a_newer_step_file_that_cannot_be_read_now_is_not_fallen_back_past(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step file the process may not read (permissions, an I/O error) was taken for a damaged
    one: restore() fell back to the step before it, silently, and the resumed run's next save
    replaced the intact file. Now restore() and latest_step() raise, naming it; restore(step)
    still goes on from an earlier step when asked; a damaged file is still fallen back past."""
    with CheckpointManager(tmp_path, async_save=False) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": torch.full((100,), float(step))})
    unreadable = str(tmp_path / step_file(3))
    real_open = manager_module.CheckpointFile.open

    def denied(path: Any, *args: Any, **kwargs: Any) -> Any:
        if os.fspath(path) == unreadable:
            raise ckptzip.Error(f"{path}: cannot open: Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(manager_module.CheckpointFile, "open", denied)
    with CheckpointManager(tmp_path, async_save=False) as manager:
        for call in (manager.restore, manager.latest_step):
            with pytest.raises(ckptzip.Error, match=r"step-00000003.ckz is newer than step 2.*"
                                                    r"Permission denied.*restore\(2\)"):
                call()
        assert manager.restore(2)["w"][0] == 2.0
    monkeypatch.undo()
    with open(unreadable, "r+b") as damaged:
        damaged.write(b"not a ckz")
    with CheckpointManager(tmp_path, async_save=False) as manager:
        assert manager.latest_step() == 2 and manager.restore()["w"][0] == 2.0


def test_a_restore_on_another_thread_does_not_mark_the_next_save_resumed(tmp_path: Path) -> None:
    """A monitor thread restoring the latest step to evaluate it marked the training thread's
    next save as resumed from it: a lossy chain's error then compounded (101x the update at a
    weight budget of 1.5). Only a restore on the saving thread marks its next save."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 64, generator=generator)

    def state(step: int) -> dict[str, torch.Tensor]:
        return {"w": weight + 0.01 * step * torch.randn(64, 64, generator=generator)}

    def carried(manager: CheckpointManager, step: int) -> bool:
        with ckptzip.open(manager.path(step)) as checkpoint:
            return any("carried" in leaf.extra.get("error", {}) for leaf in checkpoint.leaves)

    with CheckpointManager(tmp_path, mode="adaptive", async_save=False) as manager:
        manager.save(1, state(1))
        manager.save(2, state(2))
        monitor = threading.Thread(target=manager.restore)
        monitor.start()
        monitor.join()
        manager.save(3, state(3))
        assert carried(manager, 3)  # not marked resumed: the base's error is carried
        manager.restore(3)
        manager.save(4, state(4))
        assert not carried(manager, 4)  # restored here: resumed


def test_a_manager_dropped_unclosed_releases_its_directory(tmp_path: Path) -> None:
    """A manager dropped without close() (a notebook cell run again) kept the directory locked
    for the rest of the process, and the next one was refused as if another process held it.
    The lock is released when the manager is collected, with a ResourceWarning; while one of
    this process holds it, the message says so."""
    import gc

    first = CheckpointManager(tmp_path, async_save=False)
    with pytest.raises(ckptzip.Error, match="a CheckpointManager of this process holds"):
        CheckpointManager(tmp_path)
    with pytest.warns(ResourceWarning, match="unclosed CheckpointManager directory"):
        del first
        gc.collect()
    with CheckpointManager(tmp_path, async_save=False) as manager:
        manager.save(1, {"w": torch.ones(4)})


def test_a_save_parses_only_the_header_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Holding the file it wrote, checking that file's chain and opening it as the next save's
    base read one header: parsed once (a header of 50,000 tensors took 1.6-2.4 s a parse, three
    times a save). Equal bytes parse to the same header only while something holds it."""
    from ckptzip import container

    parsed: list[int] = []
    real = container.parse_header

    def counting(header_bytes: bytes, data_length: int, source: str) -> Any:
        parsed.append(data_length)
        return real(header_bytes, data_length, source)

    monkeypatch.setattr(container, "parse_header", counting)
    state = {f"t{i}": torch.full((4,), float(i)) for i in range(50)}
    with CheckpointManager(tmp_path, keep_last=2, keyframe_every=4) as manager:
        for step in range(6):
            state["t0"] += 1
            before = len(parsed)
            manager.save(step, state)
            manager.wait()
            assert len(parsed) - before == 1, (step, parsed[before:])
        assert torch.equal(manager.restore(5)["t0"], torch.full((4,), 6.0))
    assert sorted(os.listdir(tmp_path)) == [".ckptzip.lock", step_file(4), step_file(5)]
    import gc
    del manager
    gc.collect()  # nothing holds step 5's header now
    before = len(parsed)
    with ckptzip.open(tmp_path / step_file(5)) as one, ckptzip.open(tmp_path / step_file(5)) as two:
        assert one.header is two.header
    assert len(parsed) - before == 1
