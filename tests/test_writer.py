"""The writer's streaming container: header reservation, its rare overflow path, and memory."""

from __future__ import annotations

import io
import itertools
import os
import struct
import sys

import pytest
import torch

import ckptzip
from ckptzip import _native, sinks, writer
from ckptzip.container import PRELUDE_SIZE, load_header, store_header


def test_header_that_outgrows_its_reservation_moves_the_data(tmp_path, monkeypatch) -> None:
    state = {f"t{i}": torch.randn(3000 + i) for i in range(40)}
    monkeypatch.setattr(writer, "_header_estimate", lambda *args: (lambda: 16))
    monkeypatch.setattr(sinks.FileSink, "JOIN_BYTES", 0)  # streamed, as > 64 MiB
    moves: list[int] = []
    original = sinks.FileSink._move_data

    def counting_move(sink: sinks.FileSink, header_size: int) -> None:
        moves.append(header_size)
        original(sink, header_size)

    monkeypatch.setattr(sinks.FileSink, "_move_data", counting_move)
    path = tmp_path / "grown.ckz"
    report = ckptzip.save(state, path)
    assert len(moves) == 1
    assert report.stored_bytes == path.stat().st_size
    out = ckptzip.load(path)
    for key, value in state.items():
        assert torch.equal(out[key], value)
    with ckptzip.open(path) as ckpt:
        ckpt.verify()


def _counted_estimates(monkeypatch) -> list[int]:
    """The header estimates the writer's sinks take from now on, in order."""
    estimates: list[int] = []
    real = writer._header_estimate

    def counting(*args):
        estimate = real(*args)
        return lambda: estimates.append(estimate()) or estimates[-1]

    monkeypatch.setattr(writer, "_header_estimate", counting)
    return estimates


@pytest.mark.parametrize("mode", ["lossless", "excp", "bitsnap", "adaptive"])
def test_a_small_file_is_its_header_then_its_data_with_no_estimate(tmp_path, monkeypatch,
                                                                   mode) -> None:
    """A file of at most JOIN_BYTES of data keeps its chunks until the header is done and
    writes them right behind it: no header estimate is taken, no byte moves and the header
    carries no padding (a lossless file holds exactly the bytes of an in-memory save, which
    joins its chunks behind the exact header too)."""
    from tests.test_device import training_states

    estimates = _counted_estimates(monkeypatch)
    monkeypatch.setattr(sinks.FileSink, "_move_data", lambda sink, size: pytest.fail("moved"))
    states = training_states(2, layers=4)
    ckptzip.save(states[0], tmp_path / "k.ckz")
    path = tmp_path / f"{mode}.ckz"
    options = {} if mode == "lossless" else {"base": tmp_path / "k.ckz", "resumed": True}
    report = ckptzip.save(states[1], path, mode=mode, **options)
    assert not estimates
    blob = path.read_bytes()
    flags, length = struct.unpack_from("<IQ", blob, 12)
    stored = blob[PRELUDE_SIZE : PRELUDE_SIZE + length]
    assert store_header(load_header(stored, flags, "<test>")) == (stored, flags)  # no padding
    assert report.stored_bytes == len(blob) == PRELUDE_SIZE + length + _data_length(path)
    if mode == "lossless":  # a delta's header names its base as the file's relative path
        assert blob == ckptzip.dumps(states[1])
    with ckptzip.open(path) as ckpt:
        ckpt.verify()


def test_a_file_whose_data_outgrows_its_bound_writes_what_it_kept_behind_the_room(
        tmp_path, monkeypatch) -> None:
    """Where the data passes JOIN_BYTES after all (the writer's bound said it would not), the
    file reserves the header's room then (the estimate is taken once), writes the chunks it kept
    behind it and streams the rest, then drops the padding as a small file does: the same bytes
    as an in-memory save."""
    monkeypatch.setattr(sinks.FileSink, "JOIN_BYTES", 200_000)
    monkeypatch.setattr(writer, "_data_bound", lambda *args: 1000)
    estimates = _counted_estimates(monkeypatch)
    state = {f"t{i}": torch.randn(20_000) for i in range(24)}  # 1.9 MB, chunks of 80 KB
    path = tmp_path / "a.ckz"
    ckptzip.save(state, path, threads=2, chunk_bytes=80_000)
    assert len(estimates) == 1
    assert path.read_bytes() == ckptzip.dumps(state, chunk_bytes=80_000)
    out = ckptzip.load(path)
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_the_data_bound_counts_codes_and_arrays_not_the_raw_state(tmp_path) -> None:
    """A lossy delta's bound is its precoded chunks and its arrays, far below the state's raw
    bytes; a lossless state's is its raw bytes with the chunks' headers."""
    from ckptzip.planning import prepare
    from ckptzip.reader import open_base
    from tests.test_device import training_states

    states = training_states(2, layers=4)
    ckptzip.save(states[0], tmp_path / "k.ckz")
    base = open_base(tmp_path / "k.ckz")
    try:
        prepared = prepare(states[1], mode="adaptive", base=base, resumed=True)
        raw = sum(leaf.nbytes for leaf in prepared.leaves)
        bound = writer._data_bound(prepared.leaves, prepared.encoded)
        stored = len(ckptzip.dumps(states[1], mode="adaptive", base=tmp_path / "k.ckz",
                                   resumed=True))
        assert stored < bound and bound - (64 << 10) < raw / 2, (stored, bound, raw)
        assert writer._data_bound(prepared.leaves, {}) == raw + raw // 256 + (64 << 10)
    finally:
        base.close()


def test_header_room_is_a_close_overestimate(tmp_path, monkeypatch) -> None:
    """A file's header is padded up to the writer's estimate (large files keep it): the
    estimate must cover the header, and the padding stay below the header's own size (here
    300 tensors of one chunk each, where the margin of 8 bytes a tensor weighs most)."""
    monkeypatch.setattr(sinks.FileSink, "JOIN_BYTES", 0)  # streamed and padded, as > 64 MiB
    monkeypatch.setattr(sinks.FileSink, "TRIM_DATA_BYTES", 0)
    moves: list[int] = []
    monkeypatch.setattr(sinks.FileSink, "_move_data", lambda sink, size: moves.append(size))
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(30)])
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = tmp_path / "padded.ckz"
    ckptzip.save(state, path)
    exact = len(ckptzip.dumps(state))  # joined behind the exact header
    padding = path.stat().st_size - exact
    assert not moves
    header = exact - _data_length(path)
    assert 0 < padding < header, (padding, header)


@pytest.mark.parametrize("mode", ["excp", "bitsnap", "adaptive"])
def test_lossy_header_room_covers_its_records_and_codebooks(tmp_path, monkeypatch, mode) -> None:
    """A lossy delta's header carries each tensor's error and policy records and its codebooks
    (BitSnap's k-means tables: 313 kB of the demo GPT's header); the estimate, taken before the
    chunk tables are known and deflated at the writer's own level, still covers it: no data is
    moved."""
    monkeypatch.setattr(sinks.FileSink, "JOIN_BYTES", 0)  # streamed and padded, as > 64 MiB
    monkeypatch.setattr(sinks.FileSink, "TRIM_DATA_BYTES", 0)
    moves: list[int] = []
    monkeypatch.setattr(sinks.FileSink, "_move_data", lambda sink, size: moves.append(size))
    from tests.test_device import training_states

    states = training_states(2, layers=12)
    ckptzip.save(states[0], tmp_path / "k.ckz")
    path = tmp_path / f"{mode}.ckz"
    ckptzip.save(states[1], path, mode=mode, base=tmp_path / "k.ckz", resumed=True)
    assert not moves
    with ckptzip.open(path) as ckpt:
        ckpt.verify()


def test_header_room_is_estimated_once_coding_has_begun(tmp_path, monkeypatch) -> None:
    """A file sink whose data outgrows the join takes the header's estimate when the first
    chunk is written, so the pool codes the next chunks meanwhile; a state with nothing to
    write never estimates."""
    monkeypatch.setattr(sinks.FileSink, "JOIN_BYTES", 0)  # streamed, as > 64 MiB
    events: list[str] = []
    estimate, encode_task = writer._header_estimate, writer._encode_task

    def recording_estimate(*args):
        inner = estimate(*args)
        return lambda: events.append("estimate") or inner()

    def recording_task(*args):
        events.append("coded")
        return encode_task(*args)

    monkeypatch.setattr(writer, "_header_estimate", recording_estimate)
    monkeypatch.setattr(writer, "_encode_task", recording_task)
    state = {f"t{i}": torch.randn(50_000) for i in range(8)}
    ckptzip.save(state, tmp_path / "a.ckz", threads=2)
    assert events.count("estimate") == 1 and events[0] == "coded", events
    out = ckptzip.load(tmp_path / "a.ckz")
    assert all(torch.equal(out[k], v) for k, v in state.items())
    events.clear()
    ckptzip.save({"step": 3, "name": "x"}, tmp_path / "b.ckz")
    assert "estimate" not in events
    assert ckptzip.load(tmp_path / "b.ckz") == {"step": 3, "name": "x"}


def _data_length(path) -> int:
    with ckptzip.open(path) as ckpt:
        return sum(leaf.stored_bytes for leaf in ckpt.leaves)


def test_file_and_memory_writers_agree_on_content(tmp_path) -> None:
    state = {"w": torch.randn(100_000).bfloat16(), "n": 1}
    path = tmp_path / "a.ckz"
    ckptzip.save(state, path)
    blob = ckptzip.dumps(state)
    with ckptzip.open(path) as from_file, ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as mem:
        assert from_file.id == mem.id  # the id names the content, however it was written
        assert from_file.header.raw["leaves"] == mem.header.raw["leaves"]


class _Scale(ckptzip.codecs.TensorToTensor):
    """Test-only lossy transform: fp32 -> fp16 of (x - base) / scale, scale learned at encode."""

    codec_id = "test-scale"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def get_config(self):
        return {"id": self.codec_id, "scale": self.scale}

    @classmethod
    def from_config(cls, config):
        return cls(float(config["scale"]))

    def encode(self, tensor, context):
        residual = tensor - (context.base if context.base is not None else 0)
        self.scale = float(residual.abs().max()) or 1.0
        return (residual / self.scale).half()

    def decode(self, tensor, context):
        value = tensor.float() * self.scale
        return value + context.base if context.base is not None else value


class _HalfPolicy(ckptzip.policy.LosslessPolicy):
    mode = "test-half"

    def plan_state(self, leaves, base, progress=None, *, resumed=False, threads=1):
        from ckptzip.codecs.base import TransformContext

        planned = {}
        for index, leaf in enumerate(leaves):
            if leaf.dtype.name != "float32":
                continue
            has_base = base is not None and base.tensor(leaf.name) is not None
            context = TransformContext(leaf.name, base.value(leaf.name) if has_base else None)
            stage = _Scale()
            array = stage.encode(leaf.tensor, context)
            pipeline = ckptzip.pipeline.Pipeline(
                transforms=(stage,), serializer=ckptzip.codecs.BytePlanes(2, 1),
                compressors=(ckptzip.codecs.Entropy(),))
            planned[index] = ckptzip.policy.Encoded(pipeline, array, {"error": {"max": 0.001}}, has_base)
        return planned


def test_whole_tensor_transforms_with_and_without_base(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(ckptzip.codecs.base._REGISTRY, "test-scale", _Scale)
    monkeypatch.setitem(ckptzip.modes.MODES, "test-half", _HalfPolicy)
    first = {"w": torch.randn(300, 200), "ids": torch.arange(5)}
    second = {"w": first["w"] + 1e-3 * torch.randn(300, 200), "ids": torch.arange(5)}
    a, b = tmp_path / "a.ckz", tmp_path / "b.ckz"
    ckptzip.save(first, a, mode="test-half")
    ckptzip.save(second, b, mode="test-half", base=a)
    out_a, out_b = ckptzip.load(a), ckptzip.load(b)
    assert out_a["w"].dtype == torch.float32 and out_a["w"].shape == (300, 200)
    assert torch.allclose(out_a["w"], first["w"], atol=float(first["w"].abs().max()) / 500)
    # closed loop: b is coded against a's reconstruction, and decodes on top of it
    assert torch.allclose(out_b["w"], second["w"], atol=1e-5)
    assert torch.equal(out_b["ids"], second["ids"])
    with ckptzip.open(b) as ckpt:
        leaf = ckpt.leaves[0]
        assert leaf.array_dtype.name == "float16" and leaf.extra["error"] == {"max": 0.001}
        assert leaf.extra["base"]["name"] == "w" and ckpt.chain_depth == 1
    with pytest.raises(ckptzip.ConfigError, match="unknown mode"):
        ckptzip.dumps(first, mode="nope")
    with pytest.raises(ckptzip.ConfigError, match="bad options"):
        ckptzip.dumps(first, mode="lossless", colour="red")


def test_saved_files_follow_the_umask(tmp_path) -> None:
    path = tmp_path / "mode.ckz"
    ckptzip.save({"w": torch.ones(3)}, path)
    assert path.stat().st_mode & 0o777 == 0o666 & ~ckptzip.storage._umask()


def test_small_files_carry_no_header_padding(tmp_path) -> None:
    state = {f"t{i}": torch.randn(100 + i) for i in range(30)}
    path = tmp_path / "small.ckz"
    ckptzip.save(state, path)
    assert path.stat().st_size == len(ckptzip.dumps(state))  # exactly the in-memory layout
    out = ckptzip.load(path)
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_gc_is_paused_only_on_the_main_thread_and_restored() -> None:
    import gc
    import threading

    from ckptzip.parallel import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: stays off
    finally:
        gc.enable()
    seen: list[bool] = []

    def background() -> None:
        with gc_paused():
            seen.append(gc.isenabled())

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == [True]  # a background save leaves the collector to training


def test_tasks_shrink_to_keep_every_thread_busy() -> None:
    """A small state on many threads is cut into smaller tasks (at least TASKS_PER_THREAD per
    thread, down to a chunk); the bytes written do not depend on it."""
    from ckptzip.parallel import TASK_BYTES, TASKS_PER_THREAD, task_bytes

    assert task_bytes(100 << 20, 1) == TASK_BYTES
    assert task_bytes(22 << 20, 16) == (22 << 20) // (16 * TASKS_PER_THREAD) < TASK_BYTES
    assert task_bytes(1 << 40, 16) == TASK_BYTES
    state = {f"w{i}": torch.randn(256, 1024) for i in range(6)}  # 6 MiB
    one = ckptzip.dumps(state, threads=1)
    assert ckptzip.dumps(state, threads=8) == one
    out = ckptzip.loads(one, threads=8)
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_save_report_names_the_file_and_each_tensors_stored_bytes(tmp_path) -> None:
    """A SaveReport carries what dcp.CompressedWriter needs of the file it wrote: the content id
    and the stored bytes at each key path (a tied tensor's at both of its paths)."""
    shared = torch.randn(64, 32)
    state = {"a": shared, "b": {"c": torch.arange(1000)}, "tied": shared, "raw": b"xyz" * 50}
    path = tmp_path / "r.ckz"
    report = ckptzip.save(state, path)
    with ckptzip.open(path) as f:
        assert report.id == f.id and len(report.id) == 32
        stored = {leaf.name: leaf.stored_bytes for leaf in f.leaves}
    assert report.stored_bytes_at == {"a": stored["a"], "b.c": stored["b.c"], "tied": stored["a"],
                                      "raw": stored["raw"]}


def test_file_sink_starts_the_writeback_of_its_data_as_it_goes(tmp_path, monkeypatch) -> None:
    """Every WRITEBACK_BYTES of data the sink asks the kernel to start writing what was written
    since the last request: the requests cover the data section in order, from behind the
    header's room, and the file reads back."""
    requests: list[tuple[int, int]] = []
    native_writeback = sinks._native.writeback

    def recording(fd: int, offset: int, length: int) -> bool:
        requests.append((offset, length))
        return native_writeback(fd, offset, length)

    monkeypatch.setattr(sinks.FileSink, "WRITEBACK_BYTES", 64 << 10)
    monkeypatch.setattr(sinks._native, "writeback", recording)
    monkeypatch.setattr(sinks.FileSink, "JOIN_BYTES", 0)  # the data stays where it was put
    monkeypatch.setattr(sinks.FileSink, "TRIM_DATA_BYTES", 0)
    state = {f"t{i}": torch.randn(40_000) for i in range(32)}
    path = tmp_path / "a.ckz"
    ckptzip.save(state, path, threads=2)
    assert len(requests) >= 2, requests
    start = requests[0][0]
    with ckptzip.open(path) as ckpt:
        data_start = ckpt.data_start
    assert start == data_start, (start, data_start)
    for (offset, length), (following, _) in itertools.pairwise(requests):
        assert length >= 64 << 10 and following == offset + length
    assert requests[-1][0] + requests[-1][1] <= path.stat().st_size
    out = ckptzip.load(path)
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_writeback_is_taken_by_a_file_and_declined_elsewhere(tmp_path) -> None:
    with open(tmp_path / "f", "wb") as handle:
        handle.write(b"x" * 100_000)
        handle.flush()
        assert _native.writeback(handle.fileno(), 0, 100_000) is sys.platform.startswith("linux")
    read, write = os.pipe()
    try:
        assert _native.writeback(write, 0, 10) is False  # a pipe has no file range
    finally:
        os.close(read)
        os.close(write)
    with pytest.raises(ValueError, match="writeback"):
        _native.writeback(0, -1, 10)
    # a handle with no descriptor: the sink writes on without asking
    buffer = io.BytesIO()
    sink = sinks.FileSink(buffer)
    sink.JOIN_BYTES = 0  # streamed, as > 64 MiB
    sink.reserve(lambda: 64)
    sink.write(b"y" * (sink.WRITEBACK_BYTES + 1))
    assert sink.written_back is None
    assert buffer.getvalue()[PRELUDE_SIZE + 64:] == b"y" * (sink.WRITEBACK_BYTES + 1)
