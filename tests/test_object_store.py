"""ckptzip on object storage, against a real S3 server: SeaweedFS on 127.0.0.1 (tests/s3server.py),
used through s3fs as users use it. Streaming multipart saves, ranged parallel reads, a
CheckpointManager and DCP on a bucket prefix, the CLI, and faults: a part refused, a read-only
bucket, the server killed mid-save, the writer killed mid-save."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip import objstore
from ckptzip.cli import main as cli_main
from ckptzip.objstore import HEAD_BYTES, Lease, MultipartUpload, ObjectStore, S3Store, parts_in_flight
from ckptzip.storage import FETCHES_PER_THREAD, LOCK_NAME

from .s3server import SeaweedS3, unavailable_reason

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled:UserWarning",
    "ignore:Detected an existing checkpoint:UserWarning",
)

REPO = Path(__file__).resolve().parent.parent


def training_state(step: int, size: int = 200_000) -> dict[str, Any]:
    """Weights, moments and counters that change a little from step to step."""
    torch.manual_seed(0)
    weights = torch.randn(size)
    torch.manual_seed(step + 1)
    return {"model": {"w": weights + step * 1e-3 * torch.randn(size), "b": torch.arange(7.0) * step},
            "optim": {"exp_avg": torch.randn(size // 4)}, "step": step, "name": "run3"}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


def big_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """About 27 MB stored: a first part, two more parts and a last one of 8 MiB parts."""
    torch.manual_seed(seed)
    return {"w": torch.randn(8_000_000), "bias": torch.randn(1000)}


def uploads(server: SeaweedS3, bucket: str) -> list[dict[str, Any]]:
    """Multipart uploads begun and neither completed nor aborted, in the bucket."""
    fs = server.filesystem()
    return list(fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads") or [])


def objects(server: SeaweedS3, path: str) -> list[str]:
    fs = server.filesystem()
    return sorted(name.rsplit("/", 1)[-1] for name in fs.ls(path, refresh=True))


# -- CheckpointManager on a bucket prefix ---------------------------------------------------------


def test_manager_on_a_bucket_prefix_keeps_everything_in_the_bucket(
    s3_server: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's first bug: the files went to a local directory named ``s3:``. Saves, listing,
    chains, retention and restores now all happen in the bucket, and nothing lands locally."""
    monkeypatch.chdir(tmp_path)
    bucket = s3_server.bucket()
    prefix = f"s3://{bucket}/run3"
    options = s3_server.storage_options()
    states = {step: training_state(step) for step in range(5)}
    # saved by hand under a name the manager does not write: not its file (listed, it would be
    # restored and taken as a base as step-00000001.ckz, which is not there)
    ckptzip.save(training_state(9), f"{prefix}/step-1.ckz", storage_options=options)
    with ckptzip.CheckpointManager(prefix, keep_last=2, keyframe_every=2,
                                   storage_options=options) as manager:
        assert manager.directory == prefix and manager.steps() == []
        for step, state in states.items():
            manager.save(step, state)
        manager.wait()
        # keyframes 0, 2, 4; deltas 1 (on 0) and 3 (on 2): keeping 3 and 4 keeps 2
        assert manager.steps() == [2, 3, 4]
        assert objects(s3_server, f"{bucket}/run3") == [
            LOCK_NAME, "step-00000002.ckz", "step-00000003.ckz", "step-00000004.ckz",
            "step-1.ckz"]
        with pytest.raises(ckptzip.Error, match=r"another CheckpointManager .*holds this prefix"):
            ckptzip.CheckpointManager(prefix, storage_options=options)
    assert os.listdir(tmp_path) == []  # no local directory named "s3:", nor anything else
    assert LOCK_NAME not in objects(s3_server, f"{bucket}/run3")  # released on close
    with ckptzip.open(f"{prefix}/step-00000003.ckz", storage_options=options) as delta:
        assert delta.base_ref is not None and delta.base_ref["path"] == "step-00000002.ckz"
    with ckptzip.CheckpointManager(prefix, storage_options=options) as again:
        assert again.steps() == [2, 3, 4]
        for step in (2, 3, 4):
            assert_same(again.restore(step), states[step])


def test_managers_racing_for_one_prefix_exactly_one_wins(s3_server: SeaweedS3) -> None:
    """The lease is a conditional create (If-None-Match: *): of eight racing, one holds it."""
    url = f"s3://{s3_server.bucket()}/race/{LOCK_NAME}"
    store, path = ObjectStore.open(url, s3_server.storage_options())
    assert isinstance(store, S3Store)
    leases = [Lease(store, path, url, 30) for _ in range(8)]
    barrier = threading.Barrier(len(leases))
    won: list[Lease] = []
    refused: list[str] = []

    def take(lease: Lease) -> None:
        barrier.wait()
        try:
            lease.acquire()
            won.append(lease)
        except ckptzip.Error as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 7, refused
    won[0].release()


def test_a_manager_whose_lease_ran_out_stops_writing_and_another_takes_over(s3_server: SeaweedS3) -> None:
    """A holder that stops renewing (a stopped process, a partition) loses the prefix once its
    lease runs out: the next manager takes it over, the old one refuses to write, and its close
    does not delete the new holder's lease."""
    prefix = f"s3://{s3_server.bucket()}/run"
    options = s3_server.storage_options()
    first = ckptzip.CheckpointManager(prefix, async_save=False, lease_seconds=1.5, storage_options=options)
    first.save(1, training_state(1))
    lease = first._home.lease  # type: ignore[attr-defined]
    lease._stop.set()  # its renewals stop, as in a process stopped for longer than the lease
    lease._thread.join()
    with pytest.raises(ckptzip.Error, match="another CheckpointManager"):
        ckptzip.CheckpointManager(prefix, storage_options=options)
    time.sleep(1.6)
    second = ckptzip.CheckpointManager(prefix, async_save=False, storage_options=options)
    with pytest.raises(ckptzip.Error, match="no longer holds the prefix"):
        first.save(2, training_state(2))
    first.close()
    second.save(2, training_state(2))
    assert second.steps() == [1, 2]
    with pytest.raises(ckptzip.Error, match="another CheckpointManager"):
        ckptzip.CheckpointManager(prefix, storage_options=options)
    second.close()


def test_manager_on_a_store_without_multipart_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other fsspec filesystems (``memory://`` here; GCS, Azure) get the same manager: saves
    staged locally and put whole, the lease without conditional writes."""
    monkeypatch.chdir(tmp_path)
    prefix = "memory://ckptzip-manager-test/run"
    with ckptzip.CheckpointManager(prefix, keep_last=1, keyframe_every=2) as manager:
        for step in range(3):
            manager.save(step, training_state(step))
        manager.wait()
        assert manager.steps() == [2]
        with pytest.raises(ckptzip.Error, match="another CheckpointManager"):
            ckptzip.CheckpointManager(prefix)
        assert_same(manager.restore(), training_state(2))
    assert os.listdir(tmp_path) == []


# -- streaming writes and ranged reads ------------------------------------------------------------


def test_a_save_streams_in_parts_and_the_object_appears_only_when_complete(
    s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.bucket()
    url = f"s3://{bucket}/big.ckz"
    options = s3_server.storage_options()
    state = big_state()
    seen: dict[str, Any] = {"parts": [], "in_flight": 0}
    put, commit = MultipartUpload.put, MultipartUpload.commit

    def counting_put(self: MultipartUpload, number: int, data: io.BytesIO) -> None:
        put(self, number, data)
        seen["parts"].append((number, data.getbuffer().nbytes))
        seen["in_flight"] = max(seen["in_flight"], len(self.pending))

    def slow_commit(self: MultipartUpload, first: io.BytesIO) -> None:
        seen["visible_before_commit"] = s3_server.filesystem().exists(f"{bucket}/big.ckz")
        seen["uploads_before_commit"] = len(uploads(s3_server, bucket))
        time.sleep(0.5)  # the report's seconds must include the upload's end
        commit(self, first)

    def no_local_copy(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a save to S3 made a local temporary file")

    monkeypatch.setattr(MultipartUpload, "put", counting_put)
    monkeypatch.setattr(MultipartUpload, "commit", slow_commit)
    monkeypatch.setattr(tempfile, "mkstemp", no_local_copy)
    started = time.perf_counter()
    report = ckptzip.save(state, url, threads=2, storage_options=options)
    wall = time.perf_counter() - started
    monkeypatch.undo()

    numbers = [number for number, _ in seen["parts"]]
    assert numbers[:-1] == list(range(2, len(numbers) + 1)) and numbers[-1] == 1, numbers
    assert len(numbers) >= 4  # parts 2.. went up while coding, then part 1 with the header
    assert all(size == objstore.PART_BYTES for number, size in seen["parts"][:-2])
    assert 1 <= seen["in_flight"] <= parts_in_flight(2) == 2
    assert seen["visible_before_commit"] is False and seen["uploads_before_commit"] == 1
    assert report.seconds >= 0.5 and report.seconds <= wall
    fs = s3_server.filesystem()
    assert fs.size(f"{bucket}/big.ckz") == report.stored_bytes
    assert uploads(s3_server, bucket) == []
    assert_same(ckptzip.load(url, storage_options=options), state)


def test_a_small_save_is_one_put(s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{s3_server.bucket()}/small.ckz"
    calls: list[str] = []
    call = S3Store.call

    def spy(self: S3Store, method: str, **kwargs: Any) -> Any:
        calls.append(method)
        return call(self, method, **kwargs)

    monkeypatch.setattr(S3Store, "call", spy)
    state = training_state(3, size=1000)
    ckptzip.save(state, url, storage_options=s3_server.storage_options())
    assert calls == ["put_object"]
    assert_same(ckptzip.load(url, storage_options=s3_server.storage_options()), state)


def test_load_keeps_range_requests_in_flight_and_get_tensor_fetches_only_its_chunks(
    s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    url = f"s3://{s3_server.bucket()}/layers.ckz"
    options = s3_server.storage_options()
    torch.manual_seed(1)
    state = {**{f"layer{i}": torch.randn(1_000_000) for i in range(8)}, "bias": torch.randn(3000)}
    ckptzip.save(state, url, storage_options=options)
    active, most = 0, 0
    cat_file = s3fs.S3FileSystem._cat_file

    async def observed(self: Any, path: str, *args: Any, **kwargs: Any) -> bytes:
        nonlocal active, most
        active += 1  # on fsspec's one event loop thread: no lock needed
        most = max(most, active)
        try:
            await asyncio.sleep(0.02)  # a little latency, as a real store has
            return await cat_file(self, path, *args, **kwargs)
        finally:
            active -= 1

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", observed)
    threads = 4
    with ckptzip.open(url, threads=threads, storage_options=options) as ckpt:
        size = ckpt.source.size
        assert_same(ckpt.load(), state)
        fetched = ckpt.source.bytes_fetched  # type: ignore[attr-defined]
    assert 2 <= most <= FETCHES_PER_THREAD * threads, most
    assert size <= fetched <= size + HEAD_BYTES

    with ckptzip.open(url, storage_options=options) as ckpt:
        assert torch.equal(ckpt.get_tensor("bias"), state["bias"])
        leaf = next(leaf for leaf in ckpt.leaves if leaf.name == "bias")
        fetched, requests = ckpt.source.bytes_fetched, ckpt.source.requests  # type: ignore[attr-defined]
    assert fetched <= HEAD_BYTES + leaf.stored_bytes and requests <= 2, (fetched, requests)
    assert fetched < size / 100


def test_deltas_chain_across_the_bucket(s3_server: SeaweedS3) -> None:
    prefix = f"s3://{s3_server.bucket()}/chain"
    options = s3_server.storage_options()
    first, second = training_state(1), training_state(2)
    ckptzip.save(first, f"{prefix}/a.ckz", storage_options=options)
    ckptzip.save(second, f"{prefix}/b.ckz", base=f"{prefix}/a.ckz", storage_options=options)
    with ckptzip.open(f"{prefix}/b.ckz", storage_options=options) as delta:
        assert delta.base_ref is not None and delta.base_ref["path"] == "a.ckz"
        assert any(leaf.pipeline.residual is not None for leaf in delta.leaves)
    assert_same(ckptzip.load(f"{prefix}/b.ckz", storage_options=options), second)
    # a delta over its own base (the same object, however the URL is spelt): refused, nothing
    # written, both objects as they were
    for target in (f"{prefix}/b.ckz", f"s3a://{prefix[len('s3://'):]}/b.ckz"):
        with pytest.raises(ckptzip.ConfigError, match=r"b\.ckz.*base.*both lost.*new path"):
            ckptzip.save(first, target, base=f"{prefix}/b.ckz", storage_options=options)
    assert objects(s3_server, prefix[len("s3://"):]) == ["a.ckz", "b.ckz"]
    assert_same(ckptzip.load(f"{prefix}/b.ckz", storage_options=options), second)


def test_keys_with_a_hash_and_deltas_across_folders_of_a_bucket(s3_server: SeaweedS3) -> None:
    """A ``#`` in a prefix made every key under it compare as one object (urllib took the rest
    for a fragment): a manager refused its second step as a save over its base, and a chain
    there said it looped. A delta in another folder of the bucket named its base by absolute URL,
    so a moved run did not load (DCP's steps are folders). Both as a local directory does."""
    from ckptzip.manager import CheckpointManager

    bucket, options = s3_server.bucket(), s3_server.storage_options()
    first, second = training_state(1), training_state(2)
    hashed = f"s3://{bucket}/run #1"
    ckptzip.save(first, f"{hashed}/a.ckz", storage_options=options)
    ckptzip.save(second, f"{hashed}/b.ckz", base=f"{hashed}/a.ckz", storage_options=options)
    assert_same(ckptzip.load(f"{hashed}/b.ckz", storage_options=options), second)
    with CheckpointManager(f"s3://{bucket}/run #2", storage_options=options) as manager:
        for step in (1, 2):
            manager.save(step, training_state(step))
        manager.wait()
        assert manager.steps() == [1, 2]
        assert_same(manager.restore(2), second)
    ckptzip.save(first, f"s3://{bucket}/run/step-1/a.ckz", storage_options=options)
    ckptzip.save(second, f"s3://{bucket}/run/step-2/b.ckz", base=f"s3://{bucket}/run/step-1/a.ckz",
                 storage_options=options)
    with ckptzip.open(f"s3://{bucket}/run/step-2/b.ckz", storage_options=options) as delta:
        assert delta.base_ref is not None and delta.base_ref["path"] == "../step-1/a.ckz"
    fs = s3_server.filesystem()
    for name in ("step-1/a.ckz", "step-2/b.ckz"):
        fs.copy(f"{bucket}/run/{name}", f"{bucket}/moved/{name}")
        fs.rm(f"{bucket}/run/{name}")
    assert_same(ckptzip.load(f"s3://{bucket}/moved/step-2/b.ckz", storage_options=options), second)


def test_cli_with_storage_options(s3_server: SeaweedS3, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    source = tmp_path / "model.safetensors"
    torch.manual_seed(5)
    save_file({"w": torch.randn(300, 40), "b": torch.randn(40).bfloat16()}, source)
    url = f"s3://{s3_server.bucket()}/models/model.safetensors.ckz"
    options = [f"--storage-option=client_kwargs.endpoint_url={s3_server.endpoint}",
               "--storage-option=key=ckptzip", "--storage-option=secret=ckptzip-secret",
               "--storage-option=config_kwargs.retries.max_attempts=1", "-q"]
    assert cli_main(["compress", str(source), "-o", url, *options]) == 0
    assert cli_main(["compress", str(source), "-o", url, *options]) == 1  # exists: needs -f
    assert cli_main(["verify", url, *options]) == 0
    back = tmp_path / "back.safetensors"
    assert cli_main(["decompress", url, "-o", str(back), *options]) == 0
    assert back.read_bytes() == source.read_bytes()
    assert not (tmp_path / "s3:").exists() and not Path("s3:").exists()


# -- faults against the real server ---------------------------------------------------------------


def test_a_part_refused_aborts_the_upload_and_keeps_the_previous_checkpoint(
    s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.bucket()
    url = f"s3://{bucket}/step.ckz"
    options = s3_server.storage_options()
    previous = big_state(1)
    ckptzip.save(previous, url, storage_options=options)
    submit = S3Store.submit

    def refusing(self: S3Store, method: str, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if method == "upload_part" and kwargs["PartNumber"] == 3:
            failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
            failed.set_exception(OSError(errno.EIO, "injected: the server refused part 3"))
            return failed
        return submit(self, method, **kwargs)

    monkeypatch.setattr(S3Store, "submit", refusing)
    with pytest.raises(ckptzip.Error) as caught:
        ckptzip.save(big_state(2), url, storage_options=options)
    monkeypatch.undo()
    message = str(caught.value)
    assert url in message and "part 3" in message and "previous object, if any, is intact" in message
    assert uploads(s3_server, bucket) == []  # aborted: no parts left behind
    assert objects(s3_server, bucket) == ["step.ckz"]
    assert_same(ckptzip.load(url, storage_options=options), previous)


def test_a_read_only_bucket_fails_saves_clearly_and_keeps_the_previous(s3_server: SeaweedS3) -> None:
    bucket = s3_server.bucket()
    options = s3_server.storage_options(retries=1)
    small, big = training_state(1), big_state(3)
    ckptzip.save(small, f"s3://{bucket}/small.ckz", storage_options=options)
    ckptzip.save(big, f"s3://{bucket}/big.ckz", storage_options=options)
    s3_server.read_only(bucket)
    try:
        for name, state in (("small", training_state(2)), ("big", big_state(4))):
            url = f"s3://{bucket}/{name}.ckz"
            with pytest.raises(ckptzip.Error, match="may be written, then retry") as caught:
                ckptzip.save(state, url, storage_options=options)
            assert url in str(caught.value)
        with pytest.raises(ckptzip.Error, match="lease"):
            ckptzip.CheckpointManager(f"s3://{bucket}/run", storage_options=options)
        assert_same(ckptzip.load(f"s3://{bucket}/small.ckz", storage_options=options), small)
        assert_same(ckptzip.load(f"s3://{bucket}/big.ckz", storage_options=options), big)
    finally:
        s3_server.read_only(bucket, False)
    assert uploads(s3_server, bucket) == []
    assert objects(s3_server, bucket) == ["big.ckz", "small.ckz"]


def test_the_server_killed_mid_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real crash of the store during a CheckpointManager save: the save fails with an error
    naming the URL, and once the server is back the previous step restores; the upload the dead
    server could not abort is aborted by the next manager's start."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no S3 server for this test: {reason}")
    with SeaweedS3(tmp_path / "weed") as server:
        bucket = server.bucket()
        prefix = f"s3://{bucket}/run"
        options = server.storage_options(retries=1)
        manager = ckptzip.CheckpointManager(prefix, async_save=False, storage_options=options)
        manager.save(1, training_state(1))
        put = MultipartUpload.put

        def crashing_put(self: MultipartUpload, number: int, data: io.BytesIO) -> None:
            put(self, number, data)
            if number == 3:
                concurrent.futures.wait(self.pending.values())
                server.kill()

        monkeypatch.setattr(MultipartUpload, "put", crashing_put)
        with pytest.raises(ckptzip.Error, match=f"{prefix}/step-00000002.ckz: .*failed"):
            manager.save(2, big_state())
        monkeypatch.undo()
        server.start()  # the same ports and data
        assert manager.steps() == [1]
        assert_same(manager.restore(1), training_state(1))
        manager.close()
        left = len(uploads(server, bucket))
        with ckptzip.CheckpointManager(prefix, storage_options=options) as again:
            assert uploads(server, bucket) == [] and again.steps() == [1]
        assert left <= 1  # what the crash left: at most the one unfinished upload


WRITER_KILLED = textwrap.dedent("""
    import concurrent.futures, json, os, signal, sys
    import torch, ckptzip
    from ckptzip.objstore import MultipartUpload
    prefix, options = sys.argv[1], json.loads(sys.argv[2])
    manager = ckptzip.CheckpointManager(prefix, async_save=False, lease_seconds=3,
                                        storage_options=options)
    manager.save(1, {"w": torch.arange(1000.0)})
    put = MultipartUpload.put
    def dying_put(self, number, data):
        put(self, number, data)
        if number == 3:
            concurrent.futures.wait(self.pending.values())  # parts on the server, then die
            os.kill(os.getpid(), signal.SIGKILL)
    MultipartUpload.put = dying_put
    torch.manual_seed(0)
    manager.save(2, {"w": torch.randn(8_000_000)})
""")


def test_the_writer_killed_mid_save(s3_server: SeaweedS3) -> None:
    """SIGKILL of the training process mid-upload: no step-2 object, the unfinished upload is
    left (S3 keeps its parts, invisible), the dead holder's lease keeps a new manager out until
    it runs out, and that new manager aborts the upload and restores step 1."""
    bucket = s3_server.bucket()
    prefix = f"s3://{bucket}/run"
    options = s3_server.storage_options()
    child = subprocess.run([sys.executable, "-c", WRITER_KILLED, prefix, json.dumps(options)],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert child.returncode == -9, child.stderr[-3000:]
    assert objects(s3_server, f"{bucket}/run") == [LOCK_NAME, "step-00000001.ckz"]
    assert len(uploads(s3_server, bucket)) == 1
    deadline = time.monotonic() + 15
    while True:
        try:
            manager = ckptzip.CheckpointManager(prefix, storage_options=options)
            break
        except ckptzip.Error as exc:
            assert "another CheckpointManager" in str(exc)
            assert time.monotonic() < deadline, "the dead writer's lease never ran out"
            time.sleep(0.5)
    with manager:
        assert uploads(s3_server, bucket) == []
        assert manager.steps() == [1]
        assert torch.equal(manager.restore()["w"], torch.arange(1000.0))


# -- DCP on the bucket ---------------------------------------------------------------------------


def test_dcp_saved_by_two_ranks_loads_on_one_and_three(
    s3_server: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .dcp_worker import load, mlp
    from .test_dcp import torchrun

    bucket = s3_server.bucket()
    root = f"s3://{bucket}/dcp"
    env = {"CKPTZIP_TEST_STORAGE_OPTIONS": json.dumps(s3_server.storage_options()),
           "CKPTZIP_TEST_REFS": str(tmp_path)}
    torchrun(2, "save", root, env=env)
    for name in ("full", "async", "delta"):
        assert objects(s3_server, f"{bucket}/dcp/{name}") == [".metadata", "__0_0.ckz", "__1_0.ckz"]
    assert objects(s3_server, f"{bucket}/dcp/fail") == ["__0_0.ckz", "__1_0.ckz"]  # no commit
    assert uploads(s3_server, bucket) == []
    with ckptzip.open(f"{root}/delta/__1_0.ckz", storage_options=s3_server.storage_options()) as delta:
        # relative, so that a moved run loads (session 41: it named the base by absolute URL)
        assert delta.base_ref is not None and delta.base_ref["path"] == "../full/__1_0.ckz"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(root, mlp)
    torchrun(3, "load", root, env=env)


def test_the_chain_benchmark_quick(tmp_path: Path) -> None:
    """benchmarks/object_store_chain.py on a small state: a held chain's deltas fetch less than
    an unheld chain's, which fetches its base chain, and both upload the same bytes (the same
    files)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    script = REPO / "benchmarks" / "object_store_chain.py"
    done = subprocess.run(
        [sys.executable, str(script), "--width", "128", "--checkpoints", "3", "--repeat", "1",
         "--threads", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    saves = json.loads((tmp_path / "object_store_chain-quick.json").read_text())["saves"]
    for mode in ("lossless", "adaptive"):
        held, unheld = saves[mode][0], saves[f"{mode}-unheld"][0]
        assert [s["up_mb"] for s in held] == [s["up_mb"] for s in unheld]
        # depth 2: unheld decodes both earlier checkpoints; held reads headers (and, lossy, the
        # delta it just wrote)
        assert held[2]["down_mb"] < unheld[2]["down_mb"] / 2, (held, unheld)
    assert saves["torch.save+s3fs"][0][2]["down_mb"] == 0


def test_a_frozen_server_fails_a_save_within_its_deadline(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that stops answering (SIGSTOP) mid-save: the save hung for good, since botocore
    bounds the wait for an answer but not a PUT whose body is being sent. Every request now has
    a deadline from the configured timeouts (``objstore.request_deadline``): the save fails
    with an error naming the URL, and the previous object is intact once the server is back."""
    import signal

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no S3 server for this test: {reason}")
    assert objstore.request_deadline({}) == 1440.0  # botocore's defaults: 2 x 120 s x 6 tries
    assert objstore.request_deadline({"connect_timeout": 2, "read_timeout": 3,
                                      "retries": {"max_attempts": 1}}) == objstore.MIN_REQUEST_DEADLINE
    monkeypatch.setattr(objstore, "MIN_REQUEST_DEADLINE", 1.0)
    with SeaweedS3(tmp_path / "weed") as server:
        url = f"s3://{server.bucket()}/a.ckz"
        options = server.storage_options(retries=1)
        options["config_kwargs"].update(connect_timeout=1, read_timeout=2)  # a deadline of 12 s
        ckptzip.save(training_state(1), url, storage_options=options)
        assert server.process is not None
        failed: list[BaseException] = []

        def save() -> None:
            try:
                ckptzip.save(big_state(), url, storage_options=options)
            except BaseException as exc:  # reported below
                failed.append(exc)

        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            thread = threading.Thread(target=save, daemon=True)
            thread.start()
            thread.join(120)
            assert not thread.is_alive(), "the save still hangs"
            assert time.monotonic() - started < 100
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert failed and isinstance(failed[0], ckptzip.Error), failed
        assert url in str(failed[0]) and "no " in str(failed[0])
        assert_same(ckptzip.load(url, storage_options=options), training_state(1))


def test_a_scheme_no_filesystem_handles_is_named_as_the_urls() -> None:
    """``S3://`` was blamed on the storage_options ("the filesystem refused its
    storage_options: Protocol not known: S3")."""
    pytest.importorskip("fsspec")
    with pytest.raises(ckptzip.ConfigError, match=r"no filesystem handles the scheme 'S3'; did you "
                                                  r"mean s3://"):
        ckptzip.save({"w": torch.ones(3)}, "S3://bucket/a.ckz")


@pytest.mark.parametrize("stall", ["before the lease check", "between check and request"])
@pytest.mark.parametrize("size", [50_000, 3_000_000], ids=["one put", "multipart"])
def test_a_manager_stalled_past_its_lease_never_replaces_the_new_holders_step(
        s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch, stall: str, size: int) -> None:
    """A manager stopped (SIGSTOP, a paused VM) inside its save of step 2, after its lease check,
    came back after another had taken the prefix over, restored step 1 and saved steps 2 and 3:
    its upload replaced the new holder's step 2, and step 3 no longer restored (session 41's
    hunt). The lease is checked again just before the object appears, and the last request is
    conditional on the object the save found: the stalled save fails, the new steps stay."""
    from ckptzip import objstore

    prefix = f"s3://{s3_server.bucket()}/run"
    options = s3_server.storage_options()
    first = ckptzip.CheckpointManager(prefix, async_save=False, lease_seconds=1.5,
                                      storage_options=options)
    first.save(1, training_state(1, size))
    ours = training_state(2, size)
    ours["marker"] = "stalled"
    real_commit = objstore.MultipartUpload.commit
    taken_over: list[ckptzip.CheckpointManager] = []

    def stalled_commit(upload: Any, part: Any) -> None:
        if not taken_over:  # this save stalls past its lease; another manager takes over
            lease = first._home.lease  # type: ignore[attr-defined]
            lease._stop.set()
            lease._thread.join()
            time.sleep(1.6)
            if stall == "between check and request":  # it checked just before it stopped
                monkeypatch.setattr(lease, "check", lambda: None)

            def take_over() -> None:  # another process: its own thread and context
                second = ckptzip.CheckpointManager(prefix, async_save=False, storage_options=options)
                taken_over.append(second)
                second.restore(1)
                second.save(2, training_state(2, size))
                second.save(3, training_state(3, size))

            other = threading.Thread(target=take_over)
            other.start()
            other.join()
        real_commit(upload, part)

    monkeypatch.setattr(objstore.MultipartUpload, "commit", stalled_commit)
    # (a multipart upload's parts went first; the new holder's start aborted the upload)
    expected = "no longer holds the prefix" if stall == "before the lease check" else \
        "another writer wrote this object since this save began" if size < 1_000_000 else \
        "multipart upload does not exist"
    with pytest.raises(ckptzip.Error, match=expected):
        first.save(2, ours)
    monkeypatch.setattr(objstore.MultipartUpload, "commit", real_commit)
    second = taken_over[0]
    assert second.steps() == [1, 2, 3]
    assert "marker" not in second.restore(2)
    assert_same(second.restore(3), training_state(3, size))
    second.close()
    first.close()


def test_a_manager_dropped_unclosed_releases_its_prefix(s3_server: SeaweedS3) -> None:
    """As a local directory's lock is: a manager dropped without close() (a notebook cell run
    again) renewed its lease for the life of the process, and every new manager on the prefix
    was refused, naming this process (session 41's hunt)."""
    import gc

    prefix = f"s3://{s3_server.bucket()}/run"
    options = s3_server.storage_options()
    manager = ckptzip.CheckpointManager(prefix, async_save=False, storage_options=options)
    manager.save(1, training_state(1))
    with pytest.warns(ResourceWarning, match="unclosed CheckpointManager prefix"):
        del manager
        gc.collect()
    with ckptzip.CheckpointManager(prefix, storage_options=options) as again:
        assert again.steps() == [1]
