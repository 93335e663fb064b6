"""Concurrency: one writer per directory is enforced (flock, in-process and across processes,
released even by a killed holder); saves overlapping retention never lose a needed base; readers
running beside a manager never see a partial checkpoint or wrong data."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip.manager import STEP_FILE, CheckpointManager

from .reliability_counts import record
from .test_corruption import bits_equal
from .test_crash import manager_state

ROOT = Path(__file__).resolve().parents[1]


def steps_on_disk(directory: Path) -> list[int]:
    return sorted(int(m.group(1)) for name in os.listdir(directory) if (m := STEP_FILE.match(name)))


# -- one writer per directory ---------------------------------------------------------------------


def test_second_manager_in_one_process_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = CheckpointManager(tmp_path, async_save=False)
    first.save(1, manager_state(1))
    with pytest.raises(ckptzip.Error, match=rf"{tmp_path}: a CheckpointManager of this process "
                       r"holds this directory; close\(\) it first"):
        CheckpointManager(tmp_path)
    assert first.steps() == [1]  # the refused one touched nothing
    first.close()
    with CheckpointManager(tmp_path) as second:
        second.save(2, manager_state(2))
        second.wait()
        assert second.steps() == [1, 2]


HOLDER = """
import sys
sys.path.insert(0, {root!r})
from ckptzip.manager import CheckpointManager
from tests.test_crash import manager_state
manager = CheckpointManager(sys.argv[1], async_save=False)
manager.save(1, manager_state(1))
print("holding", flush=True)
sys.stdin.read()  # hold the directory until killed
"""


@pytest.mark.skipif(sys.platform == "win32", reason="flock and SIGKILL are POSIX")
def test_second_manager_in_another_process_is_refused_and_a_killed_holder_frees_it(
    tmp_path: Path,
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        for _ in range(3):
            with pytest.raises(ckptzip.Error, match=rf"another CheckpointManager \(process "
                               rf"{holder.pid}\) is writing this directory"):
                CheckpointManager(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with CheckpointManager(tmp_path, async_save=False) as manager:  # the kernel dropped the lock
        assert manager.steps() == [1] and bits_equal(manager.restore(1), manager_state(1))
        manager.save(2, manager_state(2))
    record("concurrency.second_manager", refused_in_process=1, refused_across_processes=3,
           reopened_after_sigkill=1, lost=0)


# -- saves overlapping retention, with a reader thread on the same manager ------------------------


def test_rapid_async_saves_with_retention_and_a_concurrent_reader(tmp_path: Path) -> None:
    saves = 40
    manager = CheckpointManager(tmp_path, keep_last=1, keyframe_every=3, max_pending=2, threads=1)
    stop = threading.Event()
    outcomes = {"listed": 0, "exact": 0, "pruned_meanwhile": 0}
    failures: list[str] = []
    errored: list[int] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                steps = manager.steps()
                outcomes["listed"] += len(steps)
                for step in steps[-2:]:
                    try:
                        state = manager.restore(step)
                    except ckptzip.Error as exc:  # retention removed it since steps() listed it
                        outcomes["pruned_meanwhile"] += 1
                        errored.append(step)
                        # restore() claims a step's chain as it checks it, so it fails only up
                        # front, never half-way through reading a chain retention is deleting
                        if f"no restorable checkpoint for step {step};" not in str(exc):
                            failures.append(f"restore({step}) failed after claiming it: {exc}")
                        continue
                    if not bits_equal(state, manager_state(step)):
                        failures.append(f"step {step} restored wrong data")
                    outcomes["exact"] += 1
        except BaseException as exc:  # anything but a ckptzip.Error from restore is a failure
            failures.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for step in range(1, saves + 1):
            manager.save(step, manager_state(step))
    finally:
        stop.set()
        thread.join(60)
        manager.close()
    assert not failures, failures
    # the reader really ran alongside the saves; a restore may lose the race with retention
    assert outcomes["exact"] >= 1 and outcomes["exact"] + outcomes["pruned_meanwhile"] >= 10, outcomes
    with CheckpointManager(tmp_path, keep_last=1, keyframe_every=3) as reopened:
        steps = reopened.steps()
        assert steps[-1] == saves and steps == steps_on_disk(tmp_path)
        assert saves - 2 <= steps[0]  # retention did run: the last chain (<= 3 files) is left
        for step in steps:
            assert bits_equal(reopened.restore(step), manager_state(step))
    assert not set(errored) & set(steps)  # only steps that retention removed ever failed
    record("concurrency.retention_overlap", saves=saves, restores_exact=outcomes["exact"],
           restores_of_steps_pruned_meanwhile=outcomes["pruned_meanwhile"], wrong_data=0, lost=0)


# -- plain readers beside a manager ---------------------------------------------------------------

READER = """
import json, os, sys
sys.path.insert(0, {root!r})
import ckptzip
from ckptzip.manager import STEP_FILE
from tests.test_crash import manager_state
from tests.test_corruption import bits_equal
directory, stop = sys.argv[1], sys.argv[2]
counts = {{"loads": 0, "exact": 0, "errors": []}}
print("ready", flush=True)
finished = False
while not finished:  # passes while the manager saves, then one more over every file it left
    finished = os.path.exists(stop)
    for name in sorted(os.listdir(directory)):
        match = STEP_FILE.match(name)
        if not match:
            continue
        try:
            state = ckptzip.load(os.path.join(directory, name), threads=1)
        except ckptzip.Error as exc:
            counts["errors"].append(str(exc))
            continue
        counts["loads"] += 1
        assert bits_equal(state, manager_state(int(match.group(1)))), name
        counts["exact"] += 1
print(json.dumps(counts))
"""


def test_a_reader_process_never_sees_a_partial_checkpoint(tmp_path: Path) -> None:
    """No retention: every file with a step name must load, exactly, every time."""
    directory, stop = tmp_path / "run", tmp_path / "stop"
    directory.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", READER.format(root=str(ROOT)), str(directory), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    saves = 30
    with CheckpointManager(directory, threads=1) as manager:
        for step in range(1, saves + 1):
            manager.save(step, manager_state(step))
    stop.touch()
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["errors"] == [] and counts["exact"] == counts["loads"] >= saves, counts
    record("concurrency.reader_process", saves=saves, loads=counts["loads"], exact=counts["exact"],
           errors=0, partial_seen=0)


def test_a_reader_thread_beside_retention_gets_exact_data_or_a_clear_error(tmp_path: Path) -> None:
    """With retention, a file may vanish between listing and loading: that is a ckptzip.Error
    naming it, never a partial read or wrong data."""
    saves = 40
    stop = threading.Event()
    counts: dict[str, Any] = {"exact": 0, "errors": [], "passes": 0}
    failures: list[str] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                counts["passes"] += 1
                for step in steps_on_disk(tmp_path):
                    path = tmp_path / f"step-{step:08d}.ckz"
                    try:
                        state = ckptzip.load(path, threads=1)
                    except ckptzip.Error as exc:
                        counts["errors"].append((step, str(exc)))
                        continue
                    if not bits_equal(state, manager_state(step)):
                        failures.append(f"{path} loaded wrong data")
                    counts["exact"] += 1
        except BaseException as exc:
            failures.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with CheckpointManager(tmp_path, keep_last=1, keyframe_every=3, threads=1) as manager:
            for step in range(1, saves + 1):
                manager.save(step, manager_state(step))
                # let the reader start a new pass over what is on disk now (however fast saves
                # get, every save then overlaps reads)
                passes, deadline = counts["passes"], time.monotonic() + 5
                while counts["passes"] <= passes + 1 and time.monotonic() < deadline:
                    time.sleep(0.001)
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures
    assert counts["exact"] >= saves // 2, counts
    kept = steps_on_disk(tmp_path)
    assert kept[-1] == saves
    for step, message in counts["errors"]:
        assert step not in kept, message  # only removed checkpoints were ever missed
        assert f"step-{step:08d}.ckz" in message, message
    record("concurrency.reader_thread_retention", saves=saves, loads_exact=counts["exact"],
           loads_of_files_pruned_meanwhile=len(counts["errors"]), wrong_data=0, lost=0)


def test_a_map_within_a_map_runs_on_the_pool_thread_that_asked() -> None:
    """``ordered_map`` called on a pool's thread (a lossy save's group decoding its base) runs
    there, in order: on the shared pool the inner tasks would queue behind outer tasks that all
    wait on maps of their own, for ever."""
    from ckptzip.parallel import ordered_map

    outer_threads = []

    def inner(item: int) -> tuple[int, str]:
        return item, threading.current_thread().name

    def outer(item: int) -> list[int]:
        asking = threading.current_thread().name
        outer_threads.append(asking)
        got = list(ordered_map(inner, range(item, item + 5), 2))
        assert all(name == asking for _, name in got)  # inline, not on the pool's other thread
        return [value for value, _ in got]

    results: list[list[int]] = []
    worker = threading.Thread(target=lambda: results.extend(ordered_map(outer, range(6), 2)))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "nested ordered_map deadlocked"
    assert results == [list(range(i, i + 5)) for i in range(6)]
    assert all(name.startswith("ckptzip") for name in outer_threads)


@pytest.mark.parametrize("in_flight", [None, 7])
def test_a_slow_first_item_idles_no_thread_with_every_item_in_flight(in_flight: int | None) -> None:
    """With ``in_flight`` at the item count, the other threads work through every item behind a
    slow first one; at the default (twice the threads) they stop after a few, which a save of
    many groups, the largest first, paid for in idle threads."""
    from ckptzip.parallel import ordered_map

    done_behind = threading.Semaphore(0)
    finished: list[int] = []

    def work(item: int) -> int:
        if item == 0:  # the slow head: waits until the six behind it are done, or gives up
            all_done = all(done_behind.acquire(timeout=1.0 if in_flight else 0.3)
                           for _ in range(6))
            finished.append(int(all_done))
        else:
            done_behind.release()
        return item

    assert list(ordered_map(work, range(7), 2, in_flight=in_flight)) == list(range(7))
    assert finished == [1 if in_flight else 0]


def test_a_lossy_chain_on_many_threads_writes_the_bytes_of_one(tmp_path: Path) -> None:
    """Deltas against a lossy delta file (whose moments only a decode can compare, so the groups
    decode them on the pool's threads) store the same bytes on 1 and 4 threads, and decode."""
    from tests.test_device import training_states

    states = training_states(4)
    ckptzip.save(states[0], tmp_path / "k.ckz")
    for mode in ("adaptive", "excp", "bitsnap"):
        ckptzip.save(states[1], tmp_path / f"{mode}1.ckz", mode=mode, base=tmp_path / "k.ckz")
        stored = {}
        for threads in (1, 4):
            path = tmp_path / f"{mode}2-{threads}.ckz"
            ckptzip.save(states[2], path, mode=mode, base=tmp_path / f"{mode}1.ckz",
                         threads=threads)
            stored[threads] = path.read_bytes()
        assert stored[1] == stored[4], mode
        decoded = ckptzip.load(tmp_path / f"{mode}2-4.ckz", threads=4)
        assert set(decoded["model"]) == set(states[2]["model"])


def test_lossy_groups_are_planned_largest_first_and_numbered_in_state_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The groups start largest first (no thread idles at the end behind one large group), and
    the file does not depend on the order they finish in (4 threads against 1): the leaves they
    add are numbered in the state's order once all are planned."""
    from ckptzip.modes import adaptive
    from tests.test_device import training_states

    states = training_states(2)
    ckptzip.save(states[0], tmp_path / "k.ckz")
    started: list[int] = []
    plan_group = adaptive.AdaptivePolicy.plan_group

    def recorded(self: Any, leaves: Any, values: Any, base: Any) -> Any:
        group = values.group
        started.append(sum(leaves[i].nbytes for i in (group.weight, group.exp_avg,
                                                       group.exp_avg_sq) if i is not None))
        return plan_group(self, leaves, values, base)

    ckptzip.save(states[1], tmp_path / "sorted.ckz", mode="adaptive", base=tmp_path / "k.ckz",
                 threads=4)
    monkeypatch.setattr(adaptive.AdaptivePolicy, "plan_group", recorded)
    ckptzip.save(states[1], tmp_path / "again.ckz", mode="adaptive", base=tmp_path / "k.ckz",
                 threads=1)
    assert len(set(started)) > 1 and started == sorted(started, reverse=True)
    assert (tmp_path / "again.ckz").read_bytes() == (tmp_path / "sorted.ckz").read_bytes()


def test_small_groups_are_one_task_started_before_the_large_ones() -> None:
    """On several threads, the groups not worth their fixed cost (norms, biases: their plans
    mostly hold the GIL) are one task, started first, so that two threads never plan two of
    them at once and no thread idles behind them at the end; then each other group is a task
    of its own, the largest first. On one thread, every group in turn."""
    from ckptzip.modes.common import GROUP_FIXED_BYTES, plan_tasks

    sizes = [GROUP_FIXED_BYTES * 4, 100, GROUP_FIXED_BYTES, 4000, GROUP_FIXED_BYTES * 9, 20]
    assert plan_tasks(sizes, 1) == [[4], [0], [2], [3], [1], [5]]
    assert plan_tasks(sizes, 2) == [[3, 1, 5], [4], [0], [2]]
    assert plan_tasks([10, 20], 4) == [[1, 0]]
    assert plan_tasks([GROUP_FIXED_BYTES], 2) == [[0]]
    assert plan_tasks([], 2) == []


@pytest.mark.parametrize("mode", ["adaptive", "excp", "bitsnap"])
def test_a_devices_groups_are_surveyed_and_planned_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """On a device (torch's ops: ``torch_ops_only`` stands in for one) every phase that works on
    a group's tensors, BitSnap's survey of the stage and each mode's plans, runs under the
    planning's gate: four equal groups, each more than the gate's share, go one at a time, each
    one's temporaries on the device's memory alone. (The survey once ran them all at once: an
    H100 saw BitSnap at 1.42x the square state in extra memory.) On the host they run side by
    side, and the files decode the same either way."""
    from ckptzip.hostpath import torch_ops_only
    from ckptzip.modes import adaptive, bitsnap, excp

    def state(shift: float) -> dict[str, Any]:
        torch.manual_seed(0)
        weights = {f"layer{i}.weight": torch.randn(256, 256) + shift for i in range(4)}
        moments = {i: {"step": torch.tensor(10.0 + shift), "exp_avg": torch.randn(256, 256) * 1e-3,
                       "exp_avg_sq": torch.rand(256, 256) * 1e-6} for i in range(4)}
        return {"model": weights, "optimizer": {"state": moments, "param_groups": [
            {"params": [0, 1, 2, 3], "lr": 1e-3, "betas": (0.9, 0.999)}]}}

    ckptzip.save(state(0.0), tmp_path / "k.ckz")
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    lock = threading.Lock()

    def counted(phase: str, function: Any) -> Any:
        def run(*args: Any) -> Any:
            with lock:
                running[phase] = running.get(phase, 0) + 1
                most[phase] = max(most.get(phase, 0), running[phase])
            time.sleep(0.05)
            try:
                return function(*args)
            finally:
                with lock:
                    running[phase] -= 1
        return run

    policy = {"adaptive": adaptive.AdaptivePolicy, "excp": excp.ExcpPolicy,
              "bitsnap": bitsnap.BitsnapPolicy}[mode]
    monkeypatch.setattr(policy, "plan_group", counted("plan", policy.plan_group))
    monkeypatch.setattr(bitsnap, "_group_stage", counted("survey", bitsnap._group_stage))
    phases = ["plan", "survey"] if mode == "bitsnap" else ["plan"]
    loaded = []
    for device_path in (False, True):
        most.clear()
        path = tmp_path / f"{mode}{int(device_path)}.ckz"
        with torch_ops_only() if device_path else contextlib.nullcontext():
            ckptzip.save(state(1e-3), path, mode=mode, base=tmp_path / "k.ckz", threads=4)
        loaded.append(ckptzip.load(path))
        expected = 1 if device_path else 4
        assert [most.get(phase) for phase in phases] == [expected] * len(phases), (device_path, most)
    for name, tensor in loaded[0]["model"].items():
        assert torch.equal(tensor, loaded[1]["model"][name]), name


def test_a_task_of_groups_holds_a_device_gate_for_its_largest_group() -> None:
    """A task plans its groups one at a time: on a device, the gate weighs it by its largest."""
    from ckptzip.modes.common import _per_task
    from ckptzip.parallel import ByteGate

    sizes = [300, 100, 200]
    gate = ByteGate(300)
    per_task = _per_task((gate, sizes.__getitem__))
    assert per_task is not None and per_task[0] is gate
    assert per_task[1]([1, 2, 0]) == 300 and per_task[1]([1]) == 100
    assert _per_task(None) is None


def test_a_save_on_two_threads_plans_the_small_groups_on_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The small groups' plans all run on one pool thread, one after the other, the largest
    first, and the file is the one thread's."""
    from ckptzip.modes import excp
    from ckptzip.modes.common import GROUP_FIXED_BYTES
    from tests.test_device import training_states

    states = training_states(2)
    states[1]["model"]["head.weight"] = torch.randn(400, 400)  # one group above the threshold
    states[0]["model"]["head.weight"] = states[1]["model"]["head.weight"] + 0.01
    ckptzip.save(states[0], tmp_path / "k.ckz")
    ckptzip.save(states[1], tmp_path / "one.ckz", mode="excp", base=tmp_path / "k.ckz", threads=1)
    ran: list[tuple[int, int]] = []
    plan_group = excp.ExcpPolicy.plan_group

    def recorded(self: Any, leaves: Any, values: Any, base: Any) -> Any:
        group = values.group
        ran.append((threading.get_ident(), sum(leaves[i].nbytes for i in group.members())))
        return plan_group(self, leaves, values, base)

    monkeypatch.setattr(excp.ExcpPolicy, "plan_group", recorded)
    ckptzip.save(states[1], tmp_path / "two.ckz", mode="excp", base=tmp_path / "k.ckz", threads=2)
    small = [i for i, (_, size) in enumerate(ran) if size < GROUP_FIXED_BYTES]
    assert len(small) >= 2 and len(small) < len(ran)
    assert len({ran[i][0] for i in small}) == 1
    assert [ran[i][1] for i in small] == sorted((ran[i][1] for i in small), reverse=True)
    assert (tmp_path / "two.ckz").read_bytes() == (tmp_path / "one.ckz").read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_each_groups_arrays_are_coded_in_its_own_task_and_written_as_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Each group's host arrays are coded in the task that planned the group, on the thread
    that planned it (the threads share the coding as they share the plans), the writer writes
    those chunks as they are, and the file is the same on 1 and 2 threads and the same as the
    writer coding every array itself."""
    from ckptzip import writer
    from ckptzip.modes import adaptive, common
    from tests.test_device import training_states

    states = training_states(2)
    for name in ("head.weight", "extra.weight"):
        states[1]["model"][name] = torch.randn(400, 400)
        states[0]["model"][name] = states[1]["model"][name] + 0.01
    ckptzip.save(states[0], tmp_path / "k.ckz")
    monkeypatch.setattr(common, "precode", lambda *args: None)
    ckptzip.save(states[1], tmp_path / "writer.ckz", mode="adaptive", base=tmp_path / "k.ckz",
                 threads=1)
    monkeypatch.undo()

    coded: list[int] = []
    precode = common.precode
    planned_on: dict[int, int] = {}
    plan_group = adaptive.AdaptivePolicy.plan_group

    def recorded(policy: Any, leaves: Any, plans: Any) -> None:
        for i in plans:  # the plan and its coding ran on one thread
            assert planned_on.get(i, threading.get_ident()) == threading.get_ident()
        precode(policy, leaves, plans)
        coded.extend(i for i, plan in plans.items() if getattr(plan, "coded", None) is not None)

    def recording_plan_group(self: Any, leaves: Any, values: Any, base: Any) -> Any:
        plans = plan_group(self, leaves, values, base)
        planned_on.update(dict.fromkeys(plans, threading.get_ident()))
        return plans

    written: list[int] = []
    encode_task = writer._encode_task

    def writing(plans: Any, task: Any) -> Any:
        # a precoded array's chunks, written as they are (a lossless leaf coded whole as its
        # pipeline was chosen is one such item too, its plan without an array)
        written.extend(index for index, raw, _ in task if raw is None
                       and plans[index].array is not None and plans[index].array.is_meta)
        return encode_task(plans, task)

    monkeypatch.setattr(common, "precode", recorded)
    monkeypatch.setattr(writer, "_encode_task", writing)
    monkeypatch.setattr(adaptive.AdaptivePolicy, "plan_group", recording_plan_group)
    ckptzip.save(states[1], tmp_path / "x.ckz", mode="adaptive", base=tmp_path / "k.ckz",
                 threads=threads)
    assert len(coded) >= 2 and len(written) == len(coded)
    assert (tmp_path / "x.ckz").read_bytes() == (tmp_path / "writer.ckz").read_bytes()


def test_a_plan_that_fails_on_two_threads_fails_the_save_and_leaves_the_pool_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group whose plan raises fails the save, with the other groups' tasks neither hanging
    nor keeping a pool thread; the next save works."""
    from ckptzip.modes import adaptive
    from tests.test_device import training_states

    states = training_states(2)
    for name in ("head.weight", "extra.weight"):
        states[1]["model"][name] = torch.randn(400, 400)
        states[0]["model"][name] = states[1]["model"][name] + 0.01
    ckptzip.save(states[0], tmp_path / "k.ckz")
    plan_group = adaptive.AdaptivePolicy.plan_group

    def failing(self: Any, leaves: Any, values: Any, base: Any) -> Any:
        if values.weight is not None and values.weight.name.endswith("head.weight"):
            raise RuntimeError("planted failure")
        return plan_group(self, leaves, values, base)

    monkeypatch.setattr(adaptive.AdaptivePolicy, "plan_group", failing)
    outcome: list[BaseException | None] = []

    def save() -> None:
        try:
            ckptzip.save(states[1], tmp_path / "x.ckz", mode="adaptive",
                         base=tmp_path / "k.ckz", threads=2)
            outcome.append(None)
        except BaseException as exc:  # the outcome is what is checked
            outcome.append(exc)

    worker = threading.Thread(target=save)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the save hung"
    assert outcome and isinstance(outcome[0], RuntimeError) and "planted" in str(outcome[0])
    assert not (tmp_path / "x.ckz").exists()
    monkeypatch.setattr(adaptive.AdaptivePolicy, "plan_group", plan_group)
    ckptzip.save(states[1], tmp_path / "x.ckz", mode="adaptive", base=tmp_path / "k.ckz",
                 threads=2)
    assert torch.equal(ckptzip.load(tmp_path / "x.ckz")["model"]["extra.weight"].isfinite(),
                       torch.ones(400, 400, dtype=torch.bool))


def test_bitsnap_measures_its_stage_on_the_pool_and_the_same_on_any_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BitSnap's survey of the training stage (every group's update before any plan) runs its
    groups on the pool's threads, not alone on the calling one, and sums them in their order:
    the stage and the file are the same on 1 and 2 threads, with torch on 1 or 2 of its own."""
    from ckptzip.modes import bitsnap
    from tests.test_device import training_states

    states = training_states(2)
    ckptzip.save(states[0], tmp_path / "k.ckz")
    ran_on: list[int] = []
    stages: list[Any] = []
    group_stage, survey = bitsnap._group_stage, bitsnap.BitsnapPolicy.survey

    def recording_group_stage(values: Any) -> Any:
        ran_on.append(threading.get_ident())
        return group_stage(values)

    def recording_survey(self: Any, *args: Any, **kwargs: Any) -> None:
        survey(self, *args, **kwargs)
        stages.append(self.stage)

    monkeypatch.setattr(bitsnap, "_group_stage", recording_group_stage)
    monkeypatch.setattr(bitsnap.BitsnapPolicy, "survey", recording_survey)
    stored = []
    torch_threads = torch.get_num_threads()
    try:
        for threads, torch_count in ((1, 1), (2, 2), (2, 1)):
            torch.set_num_threads(torch_count)
            ran_on.clear()
            path = tmp_path / f"b{threads}{torch_count}.ckz"
            ckptzip.save(states[1], path, mode="bitsnap", base=tmp_path / "k.ckz",
                         threads=threads)
            stored.append(path.read_bytes())
            assert ran_on
            if threads > 1:
                assert threading.get_ident() not in ran_on
    finally:
        torch.set_num_threads(torch_threads)
    assert stages[0] == stages[1] == stages[2] and stages[0].rel_update > 0
    assert stored[0] == stored[1] == stored[2]


def test_rank_threads_share_the_node_among_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers that run in every rank at once (DCP's, DeepSpeed's engine) default to the node's
    cores over torchrun's LOCAL_WORLD_SIZE, never fewer than one."""
    from ckptzip import parallel
    from ckptzip.dcp import CompressedWriter

    monkeypatch.setattr(parallel, "cpu_count", lambda: 96)
    for local, expected in (("8", 12), ("1", 96), ("200", 1), ("junk", 96), (None, 96)):
        if local is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        assert parallel.rank_threads() == expected
        assert CompressedWriter("unused").threads == expected
    try:
        from ckptzip.integrations.deepspeed import CkptzipCheckpointEngine
    except ckptzip.DependencyError:
        return
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert CkptzipCheckpointEngine().threads == 12 and CkptzipCheckpointEngine(threads=3).threads == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_a_forked_child_saves_and_loads_after_the_parent_used_the_pools() -> None:
    """The pools' threads do not exist in a forked child (a DataLoader worker), yet the pools
    took its work as if they had idle threads, and a save or load there hung forever."""
    state = {f"w{i}": torch.randn(256, 256, generator=torch.Generator().manual_seed(i))
             for i in range(8)}
    blob = ckptzip.dumps(state, threads=2)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if both calls return the right thing
        signal.alarm(30)  # a hang ends the child, not the test run
        try:
            again = ckptzip.dumps(ckptzip.loads(blob, threads=2), threads=2)
            os._exit(0 if again == blob else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
