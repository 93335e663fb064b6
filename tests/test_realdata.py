"""Real data: a GPT trained inside the test on the Python standard library's own source."""

from __future__ import annotations

import copy

import pytest

import ckptzip
from ckptzip import peers
from ckptzip.demo.train import CONFIGS, load_data, make_trainer, same_state


@pytest.fixture(scope="module")
def run() -> list[dict]:
    """Full training states (weights, AdamW moments, scheduler, RNG) at steps 15 and 20."""
    config = CONFIGS["tiny"]
    train, _ = load_data(config)
    trainer = make_trainer(config, total_steps=20, seed=0)
    states = []
    for steps in (15, 5):
        trainer.train(train, steps)
        states.append(copy.deepcopy(trainer.state()))
    return states


def test_full_training_state_is_exact_and_beats_byte_planes_with_zstd(run) -> None:
    state = run[-1]
    blob = ckptzip.dumps(state)
    assert same_state(ckptzip.loads(blob), state)
    leaves = ckptzip.tree.flatten(state)[1]
    raw = sum(leaf.nbytes for leaf in leaves)
    ratio = raw / len(blob)
    assert ratio > 1.1
    zstd = peers.get("zstd-3")
    if not zstd.available():
        pytest.skip(f"zstandard is not installed: {zstd.unavailable_reason()}")
    zstd_bytes = sum(len(zstd.compress(leaf.host_bytes(), threads=1)) for leaf in leaves)
    assert ratio > raw / zstd_bytes * 1.05, (ratio, raw / zstd_bytes)


def test_weights_beat_byte_planes_with_zstd(run) -> None:
    """On weights, ckptzip's coder beats the classic byte-grouping + zstd baseline. (Early Adam
    moments of a tiny model hold long zero runs, unseen tokens' rows, which LZ matching catches
    and an order-0 coder does not; the full state is compared with plain zstd above.)"""
    planes = peers.get("zstd-1+planes")
    if not planes.available():
        pytest.skip(f"zstandard is not installed: {planes.unavailable_reason()}")
    weights = run[-1]["model"]
    leaves = ckptzip.tree.flatten(weights)[1]
    raw = sum(leaf.nbytes for leaf in leaves)
    peer_bytes = sum(
        len(planes.compress(leaf.host_bytes().view(leaf.dtype.numpy_dtype or "u1"), threads=1))
        for leaf in leaves
    )
    assert raw / len(ckptzip.dumps(weights)) > raw / peer_bytes


def test_delta_against_the_previous_checkpoint_is_exact_and_smaller(run, tmp_path) -> None:
    previous, latest = run
    base_path, delta_path = tmp_path / "step-15.ckz", tmp_path / "step-20.ckz"
    ckptzip.save(previous, base_path)
    ckptzip.save(latest, delta_path, base=base_path)
    assert same_state(ckptzip.load(delta_path), latest)
    assert delta_path.stat().st_size < len(ckptzip.dumps(latest)) * 0.97
    with ckptzip.open(delta_path) as ckpt:
        residual = [leaf for leaf in ckpt.leaves if leaf.pipeline.residual is not None]
        assert residual, "no tensor was coded against the base"
