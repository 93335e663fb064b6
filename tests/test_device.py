"""Lossy checkpoints of accelerator tensors: CheckpointManager transforms them on the device and
copies only what is stored to the host. The CPU tests drive the same path on CPU tensors; the
CUDA tests skip without a GPU."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip import manager as manager_module
from ckptzip.manager import CheckpointManager
from ckptzip.modes import factoring
from ckptzip.planning import Prepared, prepare
from ckptzip.reader import open_base
from ckptzip.tree import flatten
from tests.test_manager import assert_same


def training_states(steps: int, device: str = "cpu", *,
                    layers: int = 0) -> list[dict[str, Any]]:
    """A small MLP's full state after each of ``steps`` rounds of 3 AdamW steps (``layers``:
    that many 64 x 64 linear layers instead, for a state of many tensors)."""
    torch.manual_seed(0)
    model = (torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)]) if layers
             else torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                      torch.nn.Linear(128, 32)))
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    states = []
    for _ in range(steps):
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(16, 64, device=device)).square().mean().backward()
            optimizer.step()
        states.append(ckptzip.loads(ckptzip.dumps({"model": model.state_dict(),
                                                   "optimizer": optimizer.state_dict()}),
                                    map_location=device))
    return states


def stored_host_bytes(prepared: Prepared) -> int:
    """The host memory a prepared state's leaves hold: a precoded array (a meta tensor, no
    memory) holds its coded chunks."""
    total = 0
    for index, leaf in enumerate(prepared.leaves):
        coded = prepared.encoded[index].coded if index in prepared.encoded else None
        total += (len(coded[1]) if leaf.tensor.is_meta and coded is not None
                  else leaf.tensor.numel() * leaf.tensor.element_size())
    return total


def on_host(prepared: Prepared) -> bool:
    """Whether every leaf's data is in host memory: its tensor there, or its chunks coded."""
    return all(leaf.tensor.device.type == "cpu"
               or (leaf.tensor.is_meta and prepared.encoded[index].coded is not None)
               for index, leaf in enumerate(prepared.leaves))


def test_prepared_host_copy_holds_codes_not_the_state(tmp_path: Path) -> None:
    states = training_states(2)
    ckptzip.save(states[0], tmp_path / "a.ckz")
    base = open_base(str(tmp_path / "a.ckz"))
    assert base is not None
    prepared = prepare(states[1], mode="excp", base=base)
    host = prepared.to_host()
    full = sum(leaf.nbytes for leaf in prepared.leaves)
    # weights and both moments become one uint8 code per element: about a quarter of fp32
    assert len(prepared.encoded) == 12  # 4 parameters and their 2 moments each
    assert stored_host_bytes(host) < 0.3 * full
    assert on_host(host)
    # written as is, it decodes to what a plain save of the same state decodes to
    ckptzip.save(host, tmp_path / "b.ckz")
    ckptzip.save(states[1], tmp_path / "c.ckz", mode="excp", base=tmp_path / "a.ckz")
    assert_same(ckptzip.load(tmp_path / "b.ckz"), ckptzip.load(tmp_path / "c.ckz"))


def test_device_paths_peak_memory_counted_to_the_op(tmp_path: Path) -> None:
    """The lossy modes' torch ops (a GPU's path) on lossy_speed.py's square state of side 2048,
    their peak counted after every op (``benchmarks/probes/device_memory.py --exact``), stay
    within what session 30 left: adaptive 1.20x the state (session 26: 1.23x; 1.72x before
    its in-place passes), ExCP 0.76x and BitSnap 0.75x (0.83x before its sparse coding took
    the kept values and positions a piece at a time). Issue 25 asks a GPU for 1.2x; this
    catches a change that brings back a whole-tensor temporary (a weight is 0.08x here)."""
    import ctypes
    import re

    if not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("the exact count reads glibc's mallinfo2 (glibc 2.33 or later)")
    probe = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "device_memory.py"
    done = subprocess.run([sys.executable, str(probe), "--square", "2048", "--path", "torch",
                           "--exact", "--modes", "adaptive,excp,bitsnap"],
                          capture_output=True, text=True, check=True, timeout=600)
    peaks = {row[0]: float(row[5].rstrip("x"))
             for row in (re.split(r"\s*\|\s*", line.strip("| ")) for line in done.stdout.splitlines())
             if len(row) == 7 and row[0] in ("adaptive", "excp", "bitsnap")}
    assert peaks.keys() == {"adaptive", "excp", "bitsnap"}, done.stdout
    assert peaks["adaptive"] <= 1.25, done.stdout
    assert peaks["excp"] <= 0.85 and peaks["bitsnap"] <= 0.85, done.stdout


def test_prepared_state_refuses_a_second_base(tmp_path: Path) -> None:
    states = training_states(1)
    with pytest.raises(ckptzip.ConfigError, match="carries its base"):
        ckptzip.save(prepare(states[0]), tmp_path / "x.ckz", base=tmp_path / "y.ckz")


@pytest.mark.parametrize("mode", ["excp", "adaptive"])
def test_manager_device_path_matches_the_host_path(tmp_path: Path, mode: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The device-first path (forced on CPU tensors) writes checkpoints that restore exactly like
    the synchronous path's, chained, with a keyframe every 3."""
    states = training_states(5)
    calls = []
    original = CheckpointManager._prepare_on_device

    def spy(self: CheckpointManager, step: int, state: Any, resumed_from: int | None) -> Prepared:
        calls.append(step)
        return original(self, step, state, resumed_from)

    monkeypatch.setattr(CheckpointManager, "_on_device", lambda self, state: True)
    monkeypatch.setattr(CheckpointManager, "_prepare_on_device", spy)
    with CheckpointManager(tmp_path / "device", mode=mode, keyframe_every=3) as device:
        for step, state in enumerate(states):
            device.save(step, state)
        device.wait()
        restored_device = [device.restore(step) for step in range(len(states))]
    assert calls == list(range(len(states)))
    monkeypatch.undo()
    with CheckpointManager(tmp_path / "host", mode=mode, keyframe_every=3,
                           async_save=False) as host:
        for step, state in enumerate(states):
            host.save(step, state)
        restored_host = [host.restore(step) for step in range(len(states))]
    for a, b in zip(restored_device, restored_host):
        assert_same(a, b)
    depths = [ckptzip.open(tmp_path / "device" / manager_module.step_file(s)).chain_depth
              for s in range(len(states))]
    assert depths == [0, 1, 2, 0, 1]


def test_device_path_stores_added_low_rank_factors(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The adaptive mode's factor leaves, added by the plan, travel through the device-first
    path's host copy like the state's own, and restore exactly like the synchronous path's."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(160, 96, generator=generator)
    states = []
    for _ in range(3):
        update = torch.randn(160, 3, generator=generator) @ torch.randn(3, 96, generator=generator)
        weight = weight + 1e-3 * (update + 0.02 * torch.randn(160, 96, generator=generator))
        states.append({"w": weight.clone(), "step": len(states)})
    monkeypatch.setattr(CheckpointManager, "_on_device", lambda self, state: True)
    with CheckpointManager(tmp_path / "device", mode="adaptive") as device:
        for step, state in enumerate(states):
            device.save(step, state)
        device.wait()
        restored_device = [device.restore(step) for step in range(len(states))]
    monkeypatch.undo()
    with CheckpointManager(tmp_path / "host", mode="adaptive", async_save=False) as host:
        for step, state in enumerate(states):
            host.save(step, state)
        restored_host = [host.restore(step) for step in range(len(states))]
    for a, b in zip(restored_device, restored_host):
        assert_same(a, b)
    # the first delta codes a low-rank update (later ones also carry the base's rounding noise)
    with ckptzip.open(tmp_path / "device" / manager_module.step_file(1)) as delta:
        assert [leaf.name for leaf in delta.leaves] == ["w", "w:lowrank.u", "w:lowrank.v"]


def test_device_without_room_for_a_copy_transforms_before_returning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the device cannot hold a copy of the state, save() runs the transforms itself and
    hands the background only the host copy of the codes."""
    states = training_states(3)

    def no_room(state: Any, flat: Any = None) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    handed: list[type] = []
    original = CheckpointManager._write

    def spy(self: CheckpointManager, step: int, state: Any, resumed_from: int | None = None) -> Any:
        handed.append(type(state))
        return original(self, step, state, resumed_from)

    monkeypatch.setattr(CheckpointManager, "_on_device", lambda self, state: True)
    monkeypatch.setattr(manager_module, "device_snapshot", no_room)
    monkeypatch.setattr(CheckpointManager, "_write", spy)
    with CheckpointManager(tmp_path / "a", mode="excp") as manager:
        for step, state in enumerate(states):
            manager.save(step, state)
        restored = [manager.restore(step) for step in range(len(states))]
    assert handed == [Prepared] * len(states)
    monkeypatch.undo()
    with CheckpointManager(tmp_path / "b", mode="excp", async_save=False) as manager:
        for step, state in enumerate(states):
            manager.save(step, state)
        for step in range(len(states)):
            assert_same(restored[step], manager.restore(step))


def test_device_path_error_is_raised_by_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CheckpointManager, "_on_device", lambda self, state: True)
    with CheckpointManager(tmp_path, mode="excp") as manager:
        with pytest.raises(ckptzip.UnsupportedError):
            manager.save(0, {"w": torch.zeros(3), "bad": object()})
        assert manager.steps() == []


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("mode", ["excp", "bitsnap", "adaptive"])
def test_cuda_manager_saves_lossy_checkpoints_from_the_device(tmp_path: Path, mode: str) -> None:
    """Async saves of CUDA tensors go through the device path, return before the write, and
    restore exactly like synchronous saves of the same CUDA states."""
    states = training_states(4, "cuda")
    with CheckpointManager(tmp_path / "async", mode=mode) as manager:
        assert manager._on_device(flatten(states[0])[1])
        for step, state in enumerate(states):
            manager.save(step, state)
        restored_async = [manager.restore(step) for step in range(len(states))]
    with CheckpointManager(tmp_path / "sync", mode=mode, async_save=False) as manager:
        for step, state in enumerate(states):
            manager.save(step, state)
        restored_sync = [manager.restore(step) for step in range(len(states))]
    for a, b in zip(restored_async, restored_sync):
        assert_same(a, b)
    # the lossy deltas stay close to the training states they were made from
    for state, restored in zip(states[1:], restored_async[1:]):
        for name, value in state["model"].items():
            error = (restored["model"][name].double() - value.double().cpu()).norm()
            assert error <= 0.1 * value.double().norm() + 1e-6, name


@pytest.mark.cuda
@needs_cuda
def test_cuda_device_path_copies_less_to_the_host(tmp_path: Path) -> None:
    states = training_states(2, "cuda")
    ckptzip.save(states[0], tmp_path / "a.ckz")
    base = open_base(str(tmp_path / "a.ckz"))
    assert base is not None
    prepared = prepare(states[1], mode="excp", base=base)
    assert all(plan.array is not None and plan.array.device.type == "cuda"
               for plan in prepared.encoded.values())
    host = prepared.to_host()
    assert stored_host_bytes(host) < 0.3 * sum(leaf.nbytes for leaf in prepared.leaves)
    assert on_host(host)
    base.close()


def test_factoring_loads_the_devices_linear_algebra_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every low-rank factoring first makes sure its device's linear-algebra library is loaded
    (once, under a lock: see the CUDA test below); on the host there is nothing to load."""
    seen: list[torch.device] = []
    monkeypatch.setattr(factoring, "linalg_ready", seen.append)
    generator = torch.Generator().manual_seed(5)
    update = torch.randn(64, 4, generator=generator) @ torch.randn(4, 48, generator=generator)
    factoring.factor_update(update, float(update.square().sum()), 0.5)
    assert seen == [update.device]
    factoring._LINALG_READY.clear()
    monkeypatch.undo()
    factoring.linalg_ready(torch.device("cpu"))
    assert not factoring._LINALG_READY  # the host's LAPACK is linked in, not loaded lazily


@pytest.mark.cuda
@needs_cuda
def test_cuda_adaptive_save_on_many_threads_in_a_fresh_process(tmp_path: Path) -> None:
    """A fresh process's first adaptive save of CUDA tensors with low-rank updates, on 16
    threads: their first cuSOLVER calls came at once and failed ("lazy wrapper should be called
    at most once", pytorch/pytorch#90613) before the library was loaded ahead, under a lock."""
    script = f"""
import torch, ckptzip
from ckptzip.modes.adaptive import DEFAULT_BUDGET
g = torch.Generator().manual_seed(0)
base = {{f"w{{i}}": torch.randn(256, 192, generator=g) for i in range(16)}}
state = {{k: v + 1e-3 * torch.randn(256, 4, generator=g) @ torch.randn(4, 192, generator=g)
          for k, v in base.items()}}
ckptzip.save(base, {str(tmp_path / "base.ckz")!r})
ckptzip.save({{k: v.cuda() for k, v in state.items()}}, {str(tmp_path / "delta.ckz")!r},
             mode="adaptive", base={str(tmp_path / "base.ckz")!r}, threads=16)
ckptzip.save(state, {str(tmp_path / "host.ckz")!r}, mode="adaptive",
             base={str(tmp_path / "base.ckz")!r}, threads=16)
decoded = ckptzip.load({str(tmp_path / "delta.ckz")!r})
host = ckptzip.load({str(tmp_path / "host.ckz")!r})
for k, v in state.items():
    # what the host decodes, and the weight budget: the error within 0.75 of the update's norm
    assert torch.allclose(decoded[k].double(), host[k].double(), rtol=1e-3, atol=1e-6), k
    error = (decoded[k].double() - v.double()).norm() / (v - base[k]).double().norm()
    assert error <= DEFAULT_BUDGET["weight"] * 1.01, (k, float(error))
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_byte_gate_holds_the_work_in_flight_to_its_capacity() -> None:
    """``ordered_map``'s gate: the items running at once weigh at most its capacity, one heavier
    item runs alone, and the results come in order."""
    import threading
    import time

    from ckptzip.parallel import ByteGate, ordered_map

    weights = [4, 3, 5, 2, 12, 1, 6, 3, 3]
    held, most, lock = [0], [0], threading.Lock()

    def work(i: int) -> int:
        with lock:
            held[0] += weights[i]
            most[0] = max(most[0], held[0] if weights[i] <= 8 else 0)
            alone = held[0] == weights[i]
        time.sleep(0.01)
        with lock:
            held[0] -= weights[i]
        return i if weights[i] <= 8 or alone else -1

    results = list(ordered_map(work, range(len(weights)), 4,
                               gate=(ByteGate(8), weights.__getitem__)))
    assert results == list(range(len(weights)))  # in order, the heavy one (12) alone
    assert 5 <= most[0] <= 8  # more than one item ran at once, never above the capacity


def test_a_device_state_is_planned_a_share_at_a_time(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device (torch's path, forced here on the host) the groups planned at once hold at
    most DEVICE_PLAN_SHARE of the state (at least the largest group), and the bases wait on the
    host until their group's turn; on the host, where the native passes hold little, no gate."""
    import threading
    import time

    from ckptzip.hostpath import torch_ops_only
    from ckptzip.modes import adaptive, common

    states = training_states(2)
    ckptzip.save(states[0], tmp_path / "a.ckz")
    lock = threading.Lock()
    sizes: list[int] = []
    bases_on_host = []

    class Held:
        """How many groups, and how many of their bytes, a patched step holds at once."""

        def __init__(self) -> None:
            self.running = self.most = self.bytes = self.most_bytes = 0

        @contextlib.contextmanager
        def holding(self, leaves: Any, values: Any) -> Any:
            group = values.group
            size = sum(leaves[i].nbytes for i in group.members())
            with lock:
                self.running += 1
                self.bytes += size
                self.most = max(self.most, self.running)
                self.most_bytes = max(self.most_bytes, self.bytes)
            time.sleep(0.02)
            try:
                yield size
            finally:
                with lock:
                    self.running -= 1
                    self.bytes -= size

    planning, checking = Held(), Held()
    plan_group = adaptive.AdaptivePolicy.plan_group
    keep_unchanged = common.JointPolicy._keep_unchanged

    def counted(self: Any, leaves: Any, values: Any, base: Any) -> Any:
        with planning.holding(leaves, values) as size:
            sizes.append(size)
            return plan_group(self, leaves, values, base)

    def counted_check(leaves: Any, values: Any, base: Any, plans: Any) -> Any:
        # the groups' unchanged checks (a weight's base copied to the device): gated the same way
        with checking.holding(leaves, values):
            return keep_unchanged(leaves, values, base, plans)

    look = common.JointPolicy._look

    def recorded(self: Any, leaves: Any, group: Any, base: Any, kept: Any) -> Any:
        found = look(self, leaves, group, base, kept)  # a group's values before its plan
        if found is not None and found.w_base is not None:
            bases_on_host.append(found.w_base.device.type == "cpu")
        return found

    monkeypatch.setattr(adaptive.AdaptivePolicy, "plan_group", counted)
    monkeypatch.setattr(common.JointPolicy, "_look", recorded)
    monkeypatch.setattr(common, "DEVICE_PLAN_SHARE", 0.0)  # the largest group: one at a time
    # each group a task of its own (these are all small enough to share one: plan_tasks)
    monkeypatch.setattr(common, "GROUP_FIXED_BYTES", 0)
    monkeypatch.setattr(common.JointPolicy, "_keep_unchanged", staticmethod(counted_check))
    base = open_base(str(tmp_path / "a.ckz"))
    assert base is not None
    try:
        with torch_ops_only():
            prepare(states[1], mode="adaptive", base=base, threads=4)
        # the largest group's bytes at once
        assert planning.most_bytes <= max(sizes) and len(sizes) == 4
        assert bases_on_host and all(bases_on_host)
        assert 0 < checking.most_bytes <= max(sizes)
        largest = max(sizes)
        planning.most_bytes = checking.most_bytes = 0
        prepare(states[1], mode="adaptive", base=base, threads=4)  # the host: no gate
        assert planning.most_bytes > largest and planning.most > 1
        assert checking.most_bytes > largest
    finally:
        base.close()
