"""The writer's streaming container: header reservation, its rare overflow path, and memory."""

from __future__ import annotations

import torch

import ckptzip
from ckptzip import writer


def test_header_that_outgrows_its_reservation_moves_the_data(tmp_path, monkeypatch) -> None:
    state = {f"t{i}": torch.randn(3000 + i) for i in range(40)}
    monkeypatch.setattr(writer, "_estimate_header", lambda *args: 16)
    moves: list[int] = []
    original = writer.FileSink._move_data

    def counting_move(sink: writer.FileSink, header_size: int) -> None:
        moves.append(header_size)
        original(sink, header_size)

    monkeypatch.setattr(writer.FileSink, "_move_data", counting_move)
    path = tmp_path / "grown.ckz"
    report = ckptzip.save(state, path)
    assert len(moves) == 1
    assert report.stored_bytes == path.stat().st_size
    out = ckptzip.load(path)
    for key, value in state.items():
        assert torch.equal(out[key], value)
    with ckptzip.open(path) as ckpt:
        ckpt.verify()


def test_file_and_memory_writers_agree_on_content(tmp_path) -> None:
    state = {"w": torch.randn(100_000).bfloat16(), "n": 1}
    path = tmp_path / "a.ckz"
    ckptzip.save(state, path)
    blob = ckptzip.dumps(state)
    with ckptzip.open(path) as from_file, ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as mem:
        assert from_file.id == mem.id  # the id names the content, however it was written
        assert from_file.header.raw["leaves"] == mem.header.raw["leaves"]
