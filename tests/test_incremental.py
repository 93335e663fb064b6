"""Incremental checkpoints: coded against a base, bit-exact, found and checked on load."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptzip
from ckptzip import _native
from ckptzip.codecs.residual import KINDS

from .test_roundtrip import ALL_DTYPES, assert_bit_equal, random_tensor


def training_states(steps: int, every: int, seed: int = 0) -> list[dict]:
    """Consecutive full states of a small model trained with AdamW."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(512, 64)
    states = []
    for step in range(1, steps + 1):
        batch = data[torch.randint(0, 512, (32,))]
        loss = (model(batch) - batch.flip(1)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            states.append(ckptzip.loads(ckptzip.dumps({"model": model.state_dict(),
                                                       "optimizer": opt.state_dict(), "step": step})))
    return states


def assert_states_equal(a, b) -> None:
    for name, value in a["model"].items():
        assert_bit_equal(value, b["model"][name])
    for pid, moments in a["optimizer"]["state"].items():
        for key, value in moments.items():
            assert_bit_equal(value, b["optimizer"]["state"][pid][key])
    assert a["step"] == b["step"]


@settings(max_examples=80, deadline=None)
@given(width=st.sampled_from([1, 2, 4, 8]), kind=st.sampled_from(sorted(KINDS)),
       n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_residual_kernels_are_exact_bijections(width, kind, n, seed) -> None:
    rng = np.random.default_rng(seed)
    new = rng.integers(0, 256, n * width, dtype=np.uint8)
    base = rng.integers(0, 256, n * width, dtype=np.uint8)
    if seed % 3 == 0:  # near-identical arrays: the case residuals exist for
        base = new.copy()
        base[:: 7] ^= 1
    delta = np.empty_like(new)
    _native.residual_encode(new, base, delta, width, KINDS[kind])
    back = delta.copy()
    _native.residual_decode(back, base, back, width, KINDS[kind])
    assert np.array_equal(back, new)


def test_float_diff_makes_small_changes_small() -> None:
    base = torch.tensor([1.0, -1.0, 0.0, -0.0, 3e-38], dtype=torch.float32)
    new = torch.nextafter(base, torch.full_like(base, 2.0))
    delta = np.empty(20, dtype=np.uint8)
    new_bytes, base_bytes = new.numpy().view(np.uint8), base.numpy().view(np.uint8)
    _native.residual_encode(new_bytes, base_bytes, delta, 4, KINDS["float-diff"])
    values = delta.view(np.uint32)
    assert values.max() <= 4  # one ulp up (zigzag: 2), whatever the sign; -0 -> +0 is one step


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_delta_of_every_dtype_is_bit_exact(dtype) -> None:
    base = {"t": random_tensor(dtype, (5000,), 1), "same": random_tensor(dtype, (300,), 2)}
    changed = base["t"].view(torch.uint8).clone()  # byte views: not every dtype has clone()
    changed[::97] ^= 3  # a few elements change
    same = base["same"].view(torch.uint8).clone()
    new = {"t": changed.view(dtype), "same": same.view(dtype), "fresh": random_tensor(dtype, (10,), 3)}
    blob = ckptzip.dumps(new, base=base)
    out = ckptzip.loads(blob, base=base)
    for key in new:
        assert_bit_equal(new[key], out[key])


def test_training_chain_on_disk(tmp_path: Path) -> None:
    states = training_states(40, 5)
    paths = []
    for state in states:
        path = tmp_path / f"step-{state['step']:04d}.ckz"
        ckptzip.save(state, path, base=paths[-1] if paths else None)
        paths.append(path)
        assert_states_equal(state, ckptzip.load(path))
    with ckptzip.open(paths[-1]) as last:
        assert last.chain_depth == len(paths) - 1
        assert last.base_ref["path"] == paths[-2].name
    dense = len(ckptzip.dumps(states[-1]))
    assert paths[-1].stat().st_size < dense * 0.92
    # the whole directory moves: bases are named relative to their deltas
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path, moved, ignore=shutil.ignore_patterns("moved"))
    assert_states_equal(states[-1], ckptzip.load(moved / paths[-1].name))


def test_a_delta_file_decodes_its_base_tensors_in_one_pass(tmp_path: Path, monkeypatch) -> None:
    """Loading a delta decodes the base tensors it needs with one read_leaves over all of them
    (their chunks spread over every thread), not tensor after tensor; each link of a chain
    does the same for its own base."""
    from ckptzip.reader import CheckpointFile

    states = training_states(30, 5)[:3]
    paths = []
    for state in states:
        paths.append(tmp_path / f"step-{state['step']:04d}.ckz")
        ckptzip.save(state, paths[-1], base=paths[-2] if len(paths) > 1 else None)
    calls: list[tuple[str, int]] = []
    real = CheckpointFile.read_leaves

    def spy(self, indices, **kwargs):
        calls.append((Path(self.name).name, len(indices)))
        return real(self, indices, **kwargs)

    monkeypatch.setattr(CheckpointFile, "read_leaves", spy)
    assert_states_equal(states[-1], ckptzip.load(paths[-1], threads=2))
    with ckptzip.open(paths[-1]) as last:
        deltas = sum("base" in leaf.extra for leaf in last.leaves)
    by_file = {name: [n for f, n in calls if f == name] for name, _ in calls}
    assert deltas >= 2
    assert all(len(by_file[path.name]) == 1 for path in paths), calls  # one pass each
    assert by_file[paths[1].name][0] >= deltas  # covering the last file's delta tensors


def test_a_delta_save_decodes_its_file_base_in_windows(tmp_path: Path, monkeypatch) -> None:
    """Saving against a base file decodes the base tensors a window of PREFETCH_BYTES at a time
    (one read_leaves each), so that all threads decode and only the window is held; the file
    is the same whatever the window."""
    from ckptzip import writer
    from ckptzip.reader import CheckpointFile

    states = training_states(20, 5)[:2]
    base_path = tmp_path / "base.ckz"
    ckptzip.save(states[0], base_path)
    calls: list[int] = []
    real = CheckpointFile.read_leaves

    def spy(self, indices, **kwargs):
        calls.append(len(indices))
        return real(self, indices, **kwargs)

    monkeypatch.setattr(CheckpointFile, "read_leaves", spy)
    blobs = []
    for window in (64 << 20, 20_000):
        monkeypatch.setattr(writer, "PREFETCH_BYTES", window)
        calls.clear()
        path = tmp_path / f"delta-{window}.ckz"
        ckptzip.save(states[1], path, base=base_path, threads=2)
        blobs.append((path.read_bytes(), list(calls)))
    (whole, whole_calls), (windowed, windowed_calls) = blobs
    assert whole == windowed
    assert max(whole_calls) >= 8 and len(whole_calls) < len(windowed_calls), blobs[0][1]
    monkeypatch.undo()
    assert_states_equal(states[1], ckptzip.load(tmp_path / f"delta-{20_000}.ckz"))


def test_keyframe_every_bounds_the_chain(tmp_path: Path) -> None:
    states = training_states(30, 5)
    previous = None
    depths = []
    for state in states:
        path = tmp_path / f"s{state['step']}.ckz"
        ckptzip.save(state, path, base=previous, keyframe_every=3)
        with ckptzip.open(path) as ckpt:
            depths.append(ckpt.chain_depth)
        previous = path
    assert depths == [0, 1, 2, 0, 1, 2]


def test_missing_and_wrong_bases_are_reported(tmp_path: Path) -> None:
    states = training_states(20, 10)
    first, second = tmp_path / "a.ckz", tmp_path / "b.ckz"
    ckptzip.save(states[0], first)
    ckptzip.save(states[1], second, base=first)
    os.rename(first, tmp_path / "elsewhere.ckz")
    with pytest.raises(ckptzip.BaseMismatchError, match=r"b\.ckz.*base 'a\.ckz'.*missing"):
        ckptzip.load(second)
    assert_states_equal(states[1], ckptzip.load(second, base=tmp_path / "elsewhere.ckz"))
    ckptzip.save(states[1], first)  # a different checkpoint under the base's name
    with pytest.raises(ckptzip.BaseMismatchError, match="not the checkpoint this delta was coded"):
        ckptzip.load(second)
    wrong_state = training_states(20, 10, seed=1)[0]
    with pytest.raises(ckptzip.BaseMismatchError, match="CRC mismatch"):
        ckptzip.loads(ckptzip.dumps(states[1], base=states[0]), base=wrong_state)
    with pytest.raises(ckptzip.BaseMismatchError, match="coded against an in-memory base"):
        ckptzip.loads(ckptzip.dumps(states[1], base=states[0]))


def test_a_delta_saved_over_its_own_base_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save(state, P, base=P) would replace the base with a delta naming itself as its base:
    both checkpoints lost while the save succeeds. Refused, however the two name one file (the
    same string, a relative path, ``..``, a symlink either way, an open checkpoint, a prepared
    state's base); a hard link's other name survives the atomic replace and is allowed."""
    from ckptzip.chain import same_file
    from ckptzip.planning import prepare
    from ckptzip.reader import open_base

    states = training_states(20, 10)
    (tmp_path / "run").mkdir()
    base = tmp_path / "run" / "a.ckz"
    ckptzip.save(states[0], base)
    written = base.read_bytes()
    (tmp_path / "latest.ckz").symlink_to(base)
    (tmp_path / "linked").symlink_to(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    for target, named in [(base, base), (str(base), base), ("run/a.ckz", base),
                          (tmp_path / "run" / ".." / "run" / "a.ckz", base),
                          (f"file://{base}", base), (base, "latest.ckz"), ("latest.ckz", base),
                          (tmp_path / "linked" / "a.ckz", base)]:
        with pytest.raises(ckptzip.ConfigError, match=r"a\.ckz.*base.*both lost.*new path"):
            ckptzip.save(states[1], target, base=named)
    with ckptzip.open(base) as checkpoint, pytest.raises(ckptzip.ConfigError, match="new path"):
        ckptzip.save(states[1], base, base=checkpoint)
    opened = open_base(base)
    assert opened is not None
    with pytest.raises(ckptzip.ConfigError, match="new path"):
        ckptzip.save(prepare(states[1], base=opened), "run/a.ckz")
    assert base.read_bytes() == written and sorted(os.listdir(tmp_path / "run")) == ["a.ckz"]
    assert (tmp_path / "latest.ckz").is_symlink()
    assert_states_equal(states[0], ckptzip.load(base))

    ckptzip.save(states[1], tmp_path / "run" / "b.ckz", base=base)  # a new path: fine
    assert_states_equal(states[1], ckptzip.load(tmp_path / "run" / "b.ckz"))
    os.link(base, tmp_path / "hard.ckz")  # one file, two names: the save replaces one name only
    assert not same_file(tmp_path / "hard.ckz", base)
    ckptzip.save(states[1], tmp_path / "hard.ckz", base=base)
    assert_states_equal(states[1], ckptzip.load(tmp_path / "hard.ckz"))
    assert base.read_bytes() == written
    assert same_file("s3://bucket/run/a.ckz", "S3A://Bucket/run/a.ckz/")
    assert not same_file("s3://bucket/run/a.ckz", "s3://bucket/run/b.ckz")
    assert not same_file("s3://bucket/a.ckz", str(base)) and not same_file("memory://a/b", "s3://a/b")


def test_a_file_of_the_base_chain_is_never_written_over(tmp_path: Path) -> None:
    """A save over an earlier link of its base's chain (a <- b <- c, then save(..., a, base=c))
    would replace a file the chain reads: b, c and the new file would all lose their base while
    the save succeeds. Refused before anything is written; the chain still loads."""
    states = training_states(40, 10)
    a, b, c = (tmp_path / name for name in ("a.ckz", "b.ckz", "c.ckz"))
    ckptzip.save(states[0], a)
    ckptzip.save(states[1], b, base=a)
    ckptzip.save(states[2], c, base=b)
    written = {path: path.read_bytes() for path in (a, b, c)}
    for target in (a, b, tmp_path / "sub" / ".." / "a.ckz"):
        with pytest.raises(ckptzip.ConfigError, match=r"link of the base chain.*without its base"):
            ckptzip.save(states[3], target, base=c)
    with ckptzip.open(c) as opened, pytest.raises(ckptzip.ConfigError, match="link of the base"):
        ckptzip.save(states[3], a, base=opened)
    assert {path: path.read_bytes() for path in (a, b, c)} == written
    assert_states_equal(states[2], ckptzip.load(c))
    ckptzip.save(states[3], tmp_path / "d.ckz", base=c)  # the next step's file: fine
    assert_states_equal(states[3], ckptzip.load(tmp_path / "d.ckz"))


def test_chains_stop_at_max_chain_and_deeper_ones_still_load(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``keyframe_every=None`` a chain grew without bound: past about 245 links a load
    ran out of Python's recursion limit and called a healthy file's header invalid JSON. Saves
    now start a keyframe at MAX_CHAIN links; a chain deeper than the process's recursion limit
    allows (here the limit is lowered instead) still loads."""
    import sys

    from ckptzip import planning

    monkeypatch.setattr(planning, "MAX_CHAIN", 12)
    previous = None
    weight = torch.arange(64, dtype=torch.float32)
    for step in range(14):
        weight = weight + 1
        path = tmp_path / f"{step}.ckz"
        ckptzip.save({"w": weight}, path, base=previous)
        previous = path
    depths = [ckptzip.open(tmp_path / f"{step}.ckz").chain_depth for step in range(14)]
    assert depths == [*range(12), 0, 1]
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(len(__import__("inspect").stack()) + 40)
        assert torch.equal(ckptzip.load(tmp_path / "11.ckz")["w"], torch.arange(64) + 12.0)
    finally:
        sys.setrecursionlimit(max(limit, sys.getrecursionlimit()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_delta_load_holds_one_state_whatever_the_chain_depth(tmp_path: Path) -> None:
    """Each link allocated its output buffers before decoding its base, so a load held a copy
    of the state per link (9x the state at depth 7, 22x at depth 31). Now the peak over the
    loaded state does not grow with the depth."""
    import subprocess

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4_000_000, generator=generator)  # 16 MB
    previous = None
    for step in range(9):
        weight[torch.randint(0, weight.numel(), (100_000,), generator=generator)] += 0.01
        path = tmp_path / f"{step}.ckz"
        ckptzip.save({"w": weight}, path, base=previous)
        previous = path
    # VmHWM, not ru_maxrss: a child's ru_maxrss keeps the high-water mark of the pytest
    # process it was forked from
    probe = ("import sys, ckptzip\n"
             "def kb(key): return int(next(l for l in open('/proc/self/status')"
             " if l.startswith(key)).split()[1]) * 1024\n"
             "before = kb('VmRSS')\n"
             "ckptzip.load(sys.argv[1], threads=1)\n"
             "print(kb('VmHWM') - before)")
    env = {**os.environ, "CKPTZIP_MALLOC": "system"}
    peaks = [int(subprocess.run([sys.executable, "-c", probe, str(tmp_path / f"{step}.ckz")],
                                capture_output=True, text=True, check=True, env=env).stdout)
             for step in (1, 8)]
    assert peaks[1] < peaks[0] + 16_000_000, peaks  # was about 6 states more at depth 8


def test_one_flipped_bit_of_the_base_is_a_mismatch_not_damage() -> None:
    """A residual chunk's base is checked through the decoded bytes' CRC, and by its own CRC
    only when those fail: a base off by one bit still names the base, and a damaged delta with
    the right base still names the damage."""
    base = {"w": torch.randn(300_000), "b": torch.randn(20_000)}  # one chunk, then several
    new = {k: v + 1e-6 * torch.randn_like(v) for k, v in base.items()}
    blob = ckptzip.dumps(new, base=base)
    assert len(blob) < 0.8 * len(ckptzip.dumps(new))  # coded against the base
    for name in base:
        wrong = {k: v.clone() for k, v in base.items()}
        wrong[name].view(torch.int32)[len(wrong[name]) // 2] ^= 1
        with pytest.raises(ckptzip.BaseMismatchError, match=f"tensor '{name}'.*CRC mismatch"):
            ckptzip.loads(blob, base=wrong)
    damaged = bytearray(blob)
    damaged[len(blob) // 2] ^= 0x10
    with pytest.raises(ckptzip.CorruptError, match="damaged") as info:
        ckptzip.loads(bytes(damaged), base=base)
    assert not isinstance(info.value, ckptzip.BaseMismatchError)


def test_bad_keyframe_every() -> None:
    with pytest.raises(ckptzip.ConfigError):
        ckptzip.dumps({}, keyframe_every=0)


def test_context_bucketed_planes_are_exact_and_chosen_when_they_pay() -> None:
    states = training_states(20, 10)
    base = {k: v.bfloat16() for k, v in states[0]["model"].items()}
    new = {k: v.bfloat16() for k, v in states[1]["model"].items()}
    blob = ckptzip.dumps(new, base=base)
    out = ckptzip.loads(blob, base=base)
    for key, value in new.items():
        assert_bit_equal(value, out[key])
    with ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as ckpt:
        serializers = {type(leaf.pipeline.serializer).__name__ for leaf in ckpt.leaves}
    assert "ContextPlanes" in serializers


def test_trials_size_a_quick_sample_and_a_full_one_only_when_close(monkeypatch) -> None:
    """Against a base, each tensor's candidates are sized on a 16 KiB sample first; the 64 KiB
    one follows only when the two best scores lie within TRIAL_MARGIN of each other."""
    from ckptzip import pipeline, planning

    sized: list[int] = []
    real = pipeline.Pipeline.encoded_size
    monkeypatch.setattr(pipeline.Pipeline, "encoded_size",
                        lambda self, raw, base=None: sized.append(len(raw)) or real(self, raw, base))
    base = torch.randn(200_000)
    state = {"w": base + 1e-4 * torch.randn(200_000)}  # a small update: the delta wins clearly
    blob = ckptzip.dumps(state, base={"w": base})
    assert sized and set(sized) == {planning.QUICK_TRIAL_BYTES}
    monkeypatch.setattr(planning, "TRIAL_MARGIN", 100.0)  # no score counts as clear: both samples
    sized.clear()
    assert ckptzip.dumps(state, base={"w": base}) == blob  # the same choice either way
    assert sorted(set(sized)) == [planning.QUICK_TRIAL_BYTES, planning.TRIAL_BYTES]


def test_ctxplanes_must_follow_a_residual() -> None:
    from ckptzip.pipeline import Pipeline

    with pytest.raises(ckptzip.FormatError, match="ctxplanes"):
        Pipeline.from_config([{"id": "ctxplanes", "width": 2, "rotate": 0}])


def test_a_local_delta_never_fetches_a_remote_base_its_header_names(tmp_path) -> None:
    """The header is untrusted: a local file naming a URL as its base is refused, not fetched,
    until the caller passes that base explicitly; a delta stored at the same place loads."""
    pytest.importorskip("fsspec")
    torch.manual_seed(3)
    first = {"w": torch.randn(256, 64)}
    second = {"w": first["w"] + 1e-3 * torch.randn(256, 64)}
    remote_base = "memory://ckptzip-remote-base/a.ckz"
    ckptzip.save(first, remote_base)
    local = tmp_path / "b.ckz"
    ckptzip.save(second, local, base=remote_base)
    with ckptzip.open(local) as ckpt:
        assert ckpt.base_ref is not None and ckpt.base_ref["path"] == remote_base
    with pytest.raises(ckptzip.BaseMismatchError, match="pass it as base="):
        ckptzip.load(local)
    assert torch.equal(ckptzip.load(local, base=remote_base)["w"], second["w"])
    ckptzip.save(second, "memory://ckptzip-remote-base/b.ckz", base=remote_base)  # same origin
    assert torch.equal(ckptzip.load("memory://ckptzip-remote-base/b.ckz")["w"], second["w"])
    completed = subprocess.run([sys.executable, "-m", "ckptzip.cli", "inspect", str(local)],
                               capture_output=True, text=True)
    assert "remote, not followed" in completed.stdout + completed.stderr


def test_a_base_given_its_decoded_bytes_decodes_nothing(tmp_path: Path, monkeypatch) -> None:
    """A caller that holds what a base decodes to (it just loaded it) hands those bytes to the
    base with ``Base.cache``: the delta saved and loaded against it is the one the file base
    gives, and no chunk of the chain under it is decoded. Bytes of the wrong size are refused."""
    from ckptzip.chain import Base
    from ckptzip.errors import BaseMismatchError
    from ckptzip.reader import CheckpointFile, FileBase
    from ckptzip.tree import flatten

    states = training_states(30, 5)[:3]
    paths = [tmp_path / f"step-{i}.ckz" for i in range(3)]
    ckptzip.save(states[0], paths[0])
    ckptzip.save(states[1], paths[1], base=paths[0])
    decoded = ckptzip.load(paths[1])
    ckptzip.save(states[2], tmp_path / "plain.ckz", base=paths[1])

    def warm() -> Base:
        base = FileBase(CheckpointFile.open(paths[1]), owned=True)
        for leaf in flatten(decoded)[1]:
            if base.tensor(leaf.name) is not None:
                base.cache(leaf.name, leaf.host_bytes().copy())
        return base

    decodes: list[str] = []
    real = CheckpointFile.read_leaves
    monkeypatch.setattr(CheckpointFile, "read_leaves",
                        lambda self, indices, **kw: decodes.append(self.name) or real(self, indices, **kw))
    ckptzip.save(states[2], paths[2], base=warm())
    assert_states_equal(states[2], ckptzip.load(paths[2], base=warm()))
    assert not any(Path(name).name in (paths[0].name, paths[1].name) for name in decodes), decodes
    assert paths[2].read_bytes() == (tmp_path / "plain.ckz").read_bytes()
    base = FileBase(CheckpointFile.open(paths[1]), owned=True)
    name = next(leaf.name for leaf in flatten(decoded)[1] if base.tensor(leaf.name) is not None)
    with pytest.raises(BaseMismatchError, match="raw bytes"):
        base.cache(name, np.zeros(3, np.uint8))
    with pytest.raises(BaseMismatchError, match="no such tensor"):
        base.cache("no.such.tensor", np.zeros(3, np.uint8))
    base.close()
