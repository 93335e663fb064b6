"""ckptzip as PyTorch DCP's storage layer: single-process round trips and errors, then real
multi-process saves with torchrun (gloo, CPU) reloaded at other world sizes."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptzip
from ckptzip.dcp import CompressedReader, CompressedWriter

from .dcp_worker import load, mlp

WORKER = Path(__file__).with_name("dcp_worker.py")

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled:UserWarning",
    "ignore:Detected an existing checkpoint:UserWarning",
)


def sample_state(step: int = 1) -> dict:
    torch.manual_seed(step)
    return {
        "w": torch.randn(33, 17).to(torch.bfloat16),
        "ids": torch.arange(50, dtype=torch.int64) * step,
        "mask": torch.rand(9) > 0.5,
        "scalar": torch.tensor(2.5 * step),
        "empty": torch.empty(0, 3),
        "blob": io.BytesIO(b"\x00raw bytes\xff" * step),
        "meta": {"step": step, "name": "run-a", "lr": 1e-3},
    }


def empty_like(state: dict) -> dict:
    out = {k: torch.zeros_like(v) for k, v in state.items() if isinstance(v, torch.Tensor)}
    return {**out, "blob": io.BytesIO(), "meta": {"step": 0, "name": "", "lr": 0.0}}


def check_equal(state: dict, loaded: dict) -> None:
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    assert loaded["blob"].getvalue() == state["blob"].getvalue()
    assert loaded["meta"] == state["meta"]


def test_round_trip_single_process(tmp_path: Path) -> None:
    state = sample_state()
    dcp.save(state, storage_writer=CompressedWriter(tmp_path / "c", threads=2))
    assert sorted(os.listdir(tmp_path / "c")) == [".metadata", "__0_0.ckz"]
    with ckptzip.open(tmp_path / "c" / "__0_0.ckz") as rank_file:
        assert "w@0,0" in rank_file
    loaded = empty_like(state)
    dcp.load(loaded, storage_reader=CompressedReader(tmp_path / "c"))
    check_equal(state, loaded)


def test_delta_against_own_previous_file(tmp_path: Path) -> None:
    first = sample_state()
    second = {**first, "w": first["w"].clone(), "meta": {**first["meta"], "step": 2}}
    second["w"][0, :4] += 1
    dcp.save(first, storage_writer=CompressedWriter(tmp_path / "a"))
    dcp.save(second, storage_writer=CompressedWriter(tmp_path / "b", base=tmp_path / "a", keyframe_every=8))
    with ckptzip.open(tmp_path / "b" / "__0_0.ckz") as delta:
        assert delta.chain_depth == 1 and delta.base_ref["path"] == "../a/__0_0.ckz"
    loaded = empty_like(second)
    dcp.load(loaded, storage_reader=CompressedReader(tmp_path / "b"))
    check_equal(second, loaded)


def test_base_must_be_committed(tmp_path: Path) -> None:
    dcp.save(sample_state(), storage_writer=CompressedWriter(tmp_path / "a"))
    os.unlink(tmp_path / "a" / ".metadata")
    with pytest.raises(BaseException, match="not a complete DCP checkpoint"):
        dcp.save(sample_state(2), storage_writer=CompressedWriter(tmp_path / "b", base=tmp_path / "a"))


def test_unknown_mode() -> None:
    with pytest.raises(ckptzip.ConfigError, match="unknown mode"):
        CompressedWriter("unused", mode="zip")


def test_refuses_plain_dcp_checkpoint(tmp_path: Path) -> None:
    dcp.save(sample_state(), storage_writer=dcp.FileSystemWriter(tmp_path / "plain"))
    with pytest.raises(BaseException, match="FileSystemReader"):
        dcp.load(empty_like(sample_state()), storage_reader=CompressedReader(tmp_path / "plain"))


def test_file_from_another_save(tmp_path: Path) -> None:
    dcp.save(sample_state(1), storage_writer=CompressedWriter(tmp_path / "a"))
    dcp.save(sample_state(2), storage_writer=CompressedWriter(tmp_path / "b"))
    shutil.copy(tmp_path / "b" / "__0_0.ckz", tmp_path / "a" / "__0_0.ckz")
    with pytest.raises(BaseException, match="from another save"):
        dcp.load(empty_like(sample_state()), storage_reader=CompressedReader(tmp_path / "a"))


def torchrun(nproc: int, *args: str, env: dict[str, str] | None = None,
             worker: Path = WORKER) -> str:
    """Run ``worker`` (the DCP worker by default) on ``nproc`` ranks; its output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--standalone", str(worker), *args]
    with tempfile.TemporaryDirectory(prefix="torchrun-") as scratch:  # torchelastic_* folders
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TMPDIR": scratch,
               **(env or {})}
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                              cwd=WORKER.parent.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


@pytest.fixture(scope="module")
def saved_by_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FSDP2 model and Adam state saved by 2 ranks (plain, async, delta, and a failed save)."""
    root = tmp_path_factory.mktemp("dcp")
    torchrun(2, "save", str(root))
    return root


def test_two_ranks_write_one_file_each(saved_by_two_ranks: Path) -> None:
    for name in ("full", "async", "delta"):
        assert sorted(os.listdir(saved_by_two_ranks / name)) == [".metadata", "__0_0.ckz", "__1_0.ckz"]
    for rank in (0, 1):
        with ckptzip.open(saved_by_two_ranks / "delta" / f"__{rank}_0.ckz") as delta:
            assert delta.base_ref["path"] == f"../full/__{rank}_0.ckz"
            assert any(leaf.pipeline.residual is not None for leaf in delta.leaves)


def test_rank_failing_mid_save_leaves_no_checkpoint(saved_by_two_ranks: Path) -> None:
    """Rank 1's disk filled up while it wrote over a complete checkpoint: the directory lost its
    .metadata (so DCP refuses it) and rank 1's previous file is intact, with no temporary left."""
    failed = saved_by_two_ranks / "fail"
    assert sorted(os.listdir(failed)) == ["__0_0.ckz", "__1_0.ckz"]
    with pytest.raises(BaseException, match=r"\.metadata"):
        dcp.load(empty_like(sample_state()), storage_reader=CompressedReader(failed))


def test_load_on_one_rank(saved_by_two_ranks: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(str(saved_by_two_ranks), mlp)


def test_load_on_three_ranks(saved_by_two_ranks: Path) -> None:
    torchrun(3, "load", str(saved_by_two_ranks))



def test_lossy_mode_per_rank_against_its_previous_shard(tmp_path: Path) -> None:
    """A lossy mode applies per rank: the first save is a lossless keyframe, the next codes each
    rank file's float tensors against the previous rank file's reconstruction."""
    torch.manual_seed(0)
    first = {"w": torch.randn(256, 64), "ids": torch.arange(10)}
    second = {"w": first["w"] + 1e-3 * torch.randn(256, 64), "ids": torch.arange(10)}
    dcp.save(first, storage_writer=CompressedWriter(tmp_path / "a", mode="adaptive"))
    dcp.save(second, storage_writer=CompressedWriter(tmp_path / "b", mode="adaptive", base=tmp_path / "a"))
    with ckptzip.open(tmp_path / "b" / "__0_0.ckz") as delta:
        assert delta.mode == "adaptive" and delta.chain_depth == 1
    loaded = {"w": torch.empty(256, 64), "ids": torch.empty(10, dtype=torch.int64)}
    dcp.load(loaded, storage_reader=CompressedReader(tmp_path / "b"))
    assert torch.equal(loaded["ids"], second["ids"])
    error = (loaded["w"] - second["w"]).norm() / (second["w"] - first["w"]).norm()
    # lossy, within the adaptive weight budget (the expected error of unbiased rounding, relative
    # to the update) up to sampling noise
    from ckptzip.modes.adaptive import DEFAULT_BUDGET
    assert 0 < error < 1.2 * DEFAULT_BUDGET["weight"]


@pytest.mark.parametrize("mode", ["lossless", "adaptive"])
def test_a_chain_holds_its_newest_rank_file_decoded(tmp_path: Path, mode: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each delta of a chain takes its base from the rank file held as decoded, reading no older
    file, and writes the same bytes as without (cache_decoded=False)."""
    from ckptzip import dcp as ckptzip_dcp
    from ckptzip.parallel import background_executor
    from ckptzip.reader import CheckpointFile

    torch.manual_seed(0)
    states = [{"w": torch.randn(256, 64), "v": torch.rand(256, 64), "ids": torch.arange(10)}]
    for _ in range(3):
        previous = states[-1]
        states.append({"w": previous["w"] + 1e-3 * torch.randn(256, 64),
                       "v": previous["v"] * 0.99, "ids": previous["ids"] + 1})
    reads: list[tuple[str, str]] = []
    read_leaves = CheckpointFile.read_leaves

    def recording(file: CheckpointFile, *args: Any, **kwargs: Any) -> Any:
        reads.append((saving[0], str(Path(file.name).parent.name)))
        return read_leaves(file, *args, **kwargs)

    monkeypatch.setattr(CheckpointFile, "read_leaves", recording)
    saving = [""]
    files = {}
    for cache in (False, True):
        ckptzip_dcp.forget_held()
        reads.clear()
        run = tmp_path / str(cache)
        for step, state in enumerate(states):
            saving[0] = f"step{step}"
            dcp.save(state, storage_writer=CompressedWriter(
                run / f"step{step}", mode=mode, base=run / f"step{step - 1}" if step else None,
                cache_decoded=cache))
            # the hold's decode of the file just written reads it on the hold's one thread, in
            # the background: wait for it, so its read is not counted as the next step's
            background_executor("ckptzip-hold").submit(lambda: None).result()
        others = [(saved, read) for saved, read in reads if saved != read]
        assert (others == []) == cache, others
        files[cache] = [(run / f"step{step}" / "__0_0.ckz").read_bytes() for step in range(4)]
        with ckptzip.open(run / "step3" / "__0_0.ckz") as last:
            assert last.chain_depth == 3
    assert files[True] == files[False]
    ckptzip_dcp.forget_held()
    with pytest.raises(ckptzip.ConfigError, match="cache_decoded"):
        CompressedWriter(tmp_path / "x", cache_decoded="yes")  # type: ignore[arg-type]


DTENSOR_SCRIPT = """
import os, sys, tempfile, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import ckptzip
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
model = torch.nn.Linear(8, 4)
fully_shard(model)
for save in (lambda state: ckptzip.save(state, os.path.join(tempfile.mkdtemp(), "a.ckz")),
             lambda state: ckptzip.CheckpointManager(tempfile.mkdtemp()).save(1, state)):
    try:
        save({"model": model.state_dict()})
    except ckptzip.UnsupportedError as error:
        print(error)
dist.destroy_process_group()
"""


def test_a_dtensor_state_is_refused_with_the_way_out() -> None:
    """ckptzip.save stores whole tensors: an FSDP2 shard must not be stored as if it were one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", DTENSOR_SCRIPT, str(port)], capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if "DTensor" in line]
    assert done.returncode == 0 and len(lines) == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert all(line.startswith("model.weight: a DTensor") and "CompressedWriter" in line
               for line in lines)


def test_a_refused_base_leaves_the_target_as_it_was(tmp_path: Path) -> None:
    """A save into a checkpoint with itself (or through a link to it) as its base, or with a
    base that is not there, withdrew the target's .metadata before it was refused: the good
    checkpoint no longer loaded. Each is refused first now."""
    state = sample_state()
    dcp.save(state, storage_writer=CompressedWriter(tmp_path / "a"))
    (tmp_path / "latest").symlink_to(tmp_path / "a")
    with pytest.raises(ckptzip.ConfigError, match="cannot be its own base"):
        CompressedWriter(tmp_path / "a", base=tmp_path / "latest")
    with pytest.raises(BaseException, match="not a complete DCP checkpoint"):
        dcp.save(sample_state(2), storage_writer=CompressedWriter(tmp_path / "a",
                                                                  base=tmp_path / "missing"))
    loaded = empty_like(state)
    dcp.load(loaded, storage_reader=CompressedReader(tmp_path / "a"))
    check_equal(state, loaded)


def test_lossy_modes_know_the_optimizers_states_in_dcp_items(tmp_path: Path) -> None:
    """DCP's items are flat keys (``optim.state.0.weight.exp_avg@0,0``): Adam's moments were
    coded as weights, at the weights' budget, and other optimizers' states lossy without a
    warning. They are moments, paired with their weights' shards, as in ckptzip.save."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train() -> dict:
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(16, 64)).pow(2).mean().backward()
            optimizer.step()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optim": optimizer_state}

    dcp.save(train(), storage_writer=CompressedWriter(tmp_path / "a", mode="adaptive"))
    dcp.save(train(), storage_writer=CompressedWriter(tmp_path / "b", mode="adaptive",
                                                      base=tmp_path / "a"))
    with ckptzip.open(tmp_path / "b" / "__0_0.ckz") as delta:
        first = {leaf.name: type(leaf.pipeline.transforms[0]).__name__
                 for leaf in delta.leaves if leaf.pipeline.transforms}
    moments = {name: kind for name, kind in first.items() if ".exp_avg" in name}
    assert len(moments) == 8 and "LossyResidual" not in moments.values(), moments
