"""The newest checkpoint held as decoded (ckptzip.held, CheckpointManager(cache_decoded=)): the
next delta reads no older file, and every file written is the same bytes as without it."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip import held as held_module
from ckptzip.demo.train import CONFIGS, load_data, make_trainer
from ckptzip.held import HeldCheckpoint, hold_written, open_held_base
from ckptzip.manager import CheckpointManager, step_file
from ckptzip.reader import CheckpointFile
from ckptzip.tree import flatten

#: adaptive-0.999: the optimizer's beta2 at PyTorch's default, where the adaptive mode's ratio
#: coding reads the second moment's base as well (the demo trains with 0.95)
MODES = ("lossless", "excp", "bitsnap", "adaptive", "adaptive-0.999")


@pytest.fixture(scope="module")
def states() -> list[dict[str, Any]]:
    """Five states of the demo's tiny GPT, 3 AdamW steps apart."""
    trainer = make_trainer(CONFIGS["tiny"], 40, 0)
    train, _ = load_data(CONFIGS["tiny"])
    trainer.train(train, 4)
    found = [copy.deepcopy(trainer.state())]
    for _ in range(4):
        trainer.train(train, 3)
        found.append(copy.deepcopy(trainer.state()))
    return found


def with_beta2(state: dict[str, Any], beta2: float) -> dict[str, Any]:
    state = copy.deepcopy(state)
    for group in state["optimizer"]["param_groups"]:
        group["betas"] = (group["betas"][0], beta2)
    return state


class Reads:
    """Which files a save decoded tensors of (``CheckpointFile.read_leaves``), by save."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.current: str | None = None
        self.seen: list[tuple[str | None, str]] = []
        original = CheckpointFile.read_leaves

        def read_leaves(file: CheckpointFile, *args: Any, **kwargs: Any) -> Any:
            self.seen.append((self.current, Path(file.name).name))
            return original(file, *args, **kwargs)

        monkeypatch.setattr(CheckpointFile, "read_leaves", read_leaves)

    def others(self) -> list[tuple[str | None, str]]:
        """Reads, during a save, of a file other than the one being written."""
        return [(saving, read) for saving, read in self.seen
                if saving is not None and read != saving]


def write_chain(directory: Path, mode: str, states: list[dict[str, Any]], *, cache: bool | None,
                async_save: bool = False, reads: Reads | None = None,
                **options: Any) -> dict[str, bytes]:
    """Each state saved in turn, deltas only; the files' bytes by name."""
    with CheckpointManager(directory, mode=mode, keyframe_every=None, cache_decoded=cache,
                           async_save=async_save, threads=2, **options) as manager:
        for step, state in enumerate(states):
            if reads is not None:
                reads.current = step_file(step)
            manager.save(step, state)
            if reads is not None:
                manager.wait()  # a background save's reads are its own
        manager.wait()
        if reads is not None:
            reads.current = None
        assert (manager._held is not None) == (cache is not False)
    return {path.name: path.read_bytes() for path in sorted(directory.glob("step-*.ckz"))}


@pytest.mark.parametrize("mode", MODES)
def test_a_held_checkpoint_spares_the_chain_and_changes_no_byte(
        mode: str, states: list[dict[str, Any]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "adaptive-0.999":
        mode, states = "adaptive", [with_beta2(state, 0.999) for state in states]
    reads = Reads(monkeypatch)
    plain = write_chain(tmp_path / "plain", mode, states, cache=False, reads=reads)
    # without it, a delta decodes its base chain: the test below can fail
    assert reads.others(), "the saves decoded no earlier file: this test checks nothing"
    reads.seen.clear()
    held = write_chain(tmp_path / "held", mode, states, cache=True, reads=reads)
    assert reads.others() == []
    assert held == plain
    with CheckpointFile.open(tmp_path / "held" / step_file(4)) as last:
        assert last.chain_depth == 4
    background = write_chain(tmp_path / "background", mode, states, cache=None, async_save=True)
    assert background == plain


def test_a_held_checkpoint_after_restore(states: list[dict[str, Any]], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The state restore() returns is held (a copy: training changes it in place), so the first
    delta after a resume reads no older file either, and writes what it would have."""
    files = {}
    for cache in (False, True):
        directory = tmp_path / str(cache)
        write_chain(directory, "adaptive", states[:3], cache=cache)
        with CheckpointManager(directory, mode="adaptive", keyframe_every=None,
                               cache_decoded=cache, async_save=False, threads=2) as manager:
            restored = manager.restore()
            torch.nn.init.zeros_(restored["model"]["wte.weight"])  # training moves it in place
            reads = Reads(monkeypatch)
            reads.current = step_file(3)
            manager.save(3, states[3])
            assert (reads.others() == []) == cache
            monkeypatch.undo()
        files[cache] = (directory / step_file(3)).read_bytes()
        with ckptzip.open(directory / step_file(3)) as checkpoint:
            assert checkpoint.chain_depth == 3
    assert files[True] == files[False]


def test_the_guard_reads_the_held_base(states: list[dict[str, Any]], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's decode and its lossless rewrite take their base from the held checkpoint too:
    the same files and the same verdicts."""
    def distance(state: dict[str, Any]) -> float:
        return float(sum((state["model"][k].double() - truth[k].double()).square().sum()
                         for k in truth))

    truth: dict[str, torch.Tensor] = {}
    results = {}
    for cache in (False, True):
        reads = Reads(monkeypatch)
        directory = tmp_path / str(cache)
        with CheckpointManager(directory, mode="adaptive", keyframe_every=None, async_save=False,
                               cache_decoded=cache, threads=2, guard=distance,
                               max_gap=0.5) as manager:
            for step, state in enumerate(states[:4]):
                truth = state["model"]
                reads.current = step_file(step)
                manager.save(step, state)
            events = [(e.step, e.rewritten) for e in manager.guard_events]
        assert (reads.others() == []) == cache
        monkeypatch.undo()
        files = {p.name: p.read_bytes() for p in sorted(directory.glob("step-*.ckz"))}
        results[cache] = (events, files)
    assert results[True] == results[False]
    assert any(rewritten for _, rewritten in results[True][0])  # the rewrite path ran


def test_bytes_that_do_not_match_the_file_are_decoded_instead(
        states: list[dict[str, Any]], tmp_path: Path) -> None:
    """A tensor is held as the bytes it was given only when its chunks' CRC-32Cs say the file
    stores exactly those; otherwise what the file decodes to is held."""
    path = tmp_path / "a.ckz"
    ckptzip.save(states[0], path)
    wrong = copy.deepcopy(states[0])
    wrong["model"]["wte.weight"][0, 0] += 1
    leaves = {leaf.name: leaf for leaf in flatten(wrong)[1]}
    held = hold_written(str(path), leaves, None, copy=True)
    truth = {leaf.name: leaf.host_bytes() for leaf in flatten(states[0])[1]}
    assert held.id == ckptzip.open(path).id
    assert set(held.tensors) == set(truth)
    for name, data in truth.items():
        assert held.tensors[name].tobytes() == data.tobytes(), name
    # copies: the caller's state may change after the save
    leaves["model.wpe.weight"].tensor.zero_()
    assert held.tensors["model.wpe.weight"].tobytes() == truth["model.wpe.weight"].tobytes()


def test_a_held_checkpoint_of_another_id_is_not_used(states: list[dict[str, Any]],
                                                     tmp_path: Path) -> None:
    """Held bytes serve a base only when the base file has their content id."""
    ckptzip.save(states[0], tmp_path / "base.ckz")
    bogus = HeldCheckpoint(str(tmp_path / "base.ckz"), "0" * 32,
                           {leaf.name: leaf.host_bytes() * 0 for leaf in flatten(states[0])[1]})
    base = open_held_base(tmp_path / "base.ckz", bogus)
    try:
        assert base.raw("model.wte.weight").tobytes() == (
            states[0]["model"]["wte.weight"].numpy().tobytes())
    finally:
        base.close()


def test_held_only_where_memory_allows(states: list[dict[str, Any]], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(held_module, "available_memory", lambda: 1 << 20)
    with caplog.at_level(logging.INFO, logger="ckptzip"), CheckpointManager(
            tmp_path / "small", async_save=False) as manager:
        manager.save(0, states[0])
        assert manager._held is None
    with CheckpointManager(tmp_path / "forced", async_save=False, cache_decoded=True) as forced:
        forced.save(0, states[0])
        assert forced._held is not None
    assert "not holding the newest checkpoint as decoded" in caplog.text
    monkeypatch.setattr(held_module, "available_memory", lambda: 1 << 40)
    with CheckpointManager(tmp_path / "large", async_save=False) as manager:
        manager.save(0, states[0])
        assert manager._held is not None and manager._held.nbytes >= sum(
            leaf.nbytes for leaf in flatten(states[0])[1])
    with pytest.raises(ckptzip.ConfigError, match="cache_decoded"):
        CheckpointManager(tmp_path / "bad", cache_decoded="yes")  # type: ignore[arg-type]


def test_the_device_path_holds_too(states: list[dict[str, Any]], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The async lossy path for accelerator tensors (a device snapshot, the transforms run where
    the tensors are, a prepared state written), run here on host tensors: its base comes from
    the held checkpoint, its held checkpoint decodes the prepared file's transformed tensors,
    and the files are the ones it writes unheld."""
    monkeypatch.setattr(CheckpointManager, "_on_device", lambda self, leaves: self.mode != "lossless")
    reads = Reads(monkeypatch)
    plain = write_chain(tmp_path / "plain", "adaptive", states, cache=False, async_save=True,
                        reads=reads)
    assert reads.others()
    reads.seen.clear()
    held = write_chain(tmp_path / "held", "adaptive", states, cache=True, async_save=True,
                       reads=reads)
    assert reads.others() == []
    assert held == plain


def test_a_background_hold_returns_before_its_decode_and_holds_the_same_bytes(
        states: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hold_written_soon (the Trainer's and DCP's synchronous saves): the given tensors are
    copied before it returns, so training may change them at once; the lossy tensors decode on
    a background thread, which the call does not wait for; settled, the held checkpoint is the
    one hold_written makes. A file with nothing to decode is held at once."""
    import threading

    from ckptzip.held import PendingHold, hold_written_soon, settle

    key, delta = tmp_path / "k.ckz", tmp_path / "d.ckz"
    ckptzip.save(states[0], key)
    previous = hold_written(str(key), {leaf.name: leaf for leaf in flatten(states[0])[1]}, None,
                            copy=True)
    assert isinstance(hold_written_soon(str(key), {leaf.name: leaf for leaf in flatten(states[0])[1]},
                                        None), HeldCheckpoint)
    ckptzip.save(states[1], delta, mode="adaptive", base=open_held_base(key, previous))
    expected = hold_written(
        str(delta), {leaf.name: leaf for leaf in flatten(states[1])[1]},
        hold_written(str(key), {leaf.name: leaf for leaf in flatten(states[0])[1]}, None, copy=True),
        copy=True)

    released = threading.Event()
    original = CheckpointFile.read_leaves

    def read_leaves(file: CheckpointFile, *args: Any, **kwargs: Any) -> Any:
        assert released.wait(30), "the decode was waited for"
        return original(file, *args, **kwargs)

    monkeypatch.setattr(CheckpointFile, "read_leaves", read_leaves)
    training = copy.deepcopy(states[1])
    pending = hold_written_soon(str(delta), {leaf.name: leaf for leaf in flatten(training)[1]},
                                previous)
    assert isinstance(pending, PendingHold) and not pending.future.done()
    for leaf in flatten(training)[1]:  # training goes on: the state changes in place
        leaf.tensor.add_(1)
    released.set()
    held = settle(pending)
    assert held is not None and held.id == expected.id
    assert held.tensors.keys() == expected.tensors.keys()
    for name, data in expected.tensors.items():
        assert held.tensors[name].tobytes() == data.tobytes(), name


def test_a_failed_background_hold_holds_nothing(states: list[dict[str, Any]], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A background decode that fails is logged and settles to None: the next delta decodes its
    base chain, as without a held checkpoint."""
    from ckptzip.held import hold_written_soon, settle

    key, delta = tmp_path / "k.ckz", tmp_path / "d.ckz"
    ckptzip.save(states[0], key)
    ckptzip.save(states[1], delta, mode="excp", base=key)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ckptzip.CorruptError("a chunk failed its CRC")

    monkeypatch.setattr(CheckpointFile, "read_leaves", broken)
    pending = hold_written_soon(str(delta), {leaf.name: leaf for leaf in flatten(states[1])[1]},
                                None)
    with caplog.at_level(logging.WARNING, logger="ckptzip"):
        assert settle(pending) is None
    assert "not holding this checkpoint as decoded" in caplog.text and "CRC" in caplog.text
