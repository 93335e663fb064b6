"""Resource faults: a full disk, a size limit, a permission error or a read error is a clear
ckptzip.Error (which errno, which file, what to do), the previous checkpoint stays intact and loads
bit-exactly, and no partial or temporary file is left behind.

Two kinds of fault: *injected* ones (an ``OSError`` raised from the file object's ``write``/
``flush``/``truncate``, ``os.fsync``, ``os.replace``, ``tempfile.mkstemp`` or ``os.pread`` at the
Nth call, for every N) and *real* kernel faults in child processes (``RLIMIT_FSIZE`` gives EFBIG,
a tiny tmpfs in a private mount namespace gives ENOSPC, a directory an unprivileged user cannot
write gives EACCES, a file cut short under an open reader gives a short read).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip import storage
from ckptzip.manager import CheckpointManager, step_file

from .reliability_counts import record
from .test_corruption import bits_equal

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def state(version: int, n: int = 60_000) -> dict[str, Any]:
    """A small deterministic state; ``version`` changes every value."""
    generator = torch.Generator().manual_seed(version)
    return {"w": torch.randn(n, generator=generator), "h": torch.randn(n // 2, generator=generator).half(),
            "ids": torch.arange(n // 4) + version, "version": version}


def leftovers(directory: Path, *keep: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name not in keep)


class Injector:
    """Raises ``OSError(err)`` at the ``fail_at``-th counted call (None: counts only)."""

    def __init__(self, fail_at: int | None, err: int = errno.ENOSPC) -> None:
        self.fail_at, self.err = fail_at, err
        self.calls = 0
        self.fired: str | None = None
        self.lock = threading.Lock()

    def tick(self, op: str) -> None:
        with self.lock:
            self.calls += 1
            if self.calls == self.fail_at:
                self.fired = op
                raise OSError(self.err, os.strerror(self.err))


class FaultyFile:
    """A file object whose ``write``, ``flush`` and ``truncate`` go through an Injector."""

    def __init__(self, real: Any, injector: Injector) -> None:
        self._real, self._injector = real, injector

    def write(self, data: Any) -> int:
        self._injector.tick("write")
        return int(self._real.write(data))

    def flush(self) -> None:
        self._injector.tick("flush")
        self._real.flush()

    def truncate(self, size: int | None = None) -> int:
        self._injector.tick("truncate")
        return int(self._real.truncate(size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __enter__(self) -> FaultyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()


def inject_write_faults(monkeypatch: pytest.MonkeyPatch, injector: Injector) -> None:
    """Route atomic_write's file object, fsync and rename through ``injector``."""
    real_fdopen, real_fsync, real_replace = os.fdopen, os.fsync, os.replace

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        return FaultyFile(real_fdopen(fd, *args, **kwargs), injector)

    def fsync(fd: int) -> None:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):  # the directory's fsync is best effort
            injector.tick("fsync")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        injector.tick("replace")
        real_replace(src, dst)

    monkeypatch.setattr(storage.os, "fdopen", fdopen)
    monkeypatch.setattr(storage.os, "fsync", fsync)
    monkeypatch.setattr(storage.os, "replace", replace)


# -- injected ENOSPC / EDQUOT / EIO at every write-side call -------------------------------------


def test_injected_write_faults_at_every_call_keep_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ckpt.ckz"
    old, new = state(1), state(2)
    ckptzip.save(old, path, threads=1)
    previous = path.read_bytes()
    # a task (one write of its coded chunks) per 64 KiB chunk: faults land between many writes
    monkeypatch.setattr(ckptzip.parallel, "TASK_BYTES", 64 << 10)
    counter = Injector(None)
    with monkeypatch.context() as patch:
        inject_write_faults(patch, counter)
        ckptzip.save(new, path, threads=1, chunk_bytes=64 << 10)  # a dry run counts the calls
    assert counter.calls >= 10 and bits_equal(ckptzip.load(path), new)
    ckptzip.save(old, path, threads=1)
    assert path.read_bytes() == previous
    faults = 0
    ops: dict[str, int] = {}
    for err in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        for fail_at in range(1, counter.calls + 1):
            injector = Injector(fail_at, err)
            with monkeypatch.context() as patch:
                inject_write_faults(patch, injector)
                with pytest.raises(ckptzip.Error) as info:
                    ckptzip.save(new, path, threads=1, chunk_bytes=64 << 10)
            assert injector.fired is not None, f"fault {fail_at} did not fire"
            faults += 1
            ops[injector.fired] = ops.get(injector.fired, 0) + 1
            message = str(info.value)
            assert str(path) in message and os.strerror(err) in message, message
            assert "previous file, if any, is intact" in message and "retry" in message
            assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == err
            assert leftovers(tmp_path) == ["ckpt.ckz"]  # no temporary file left
            assert path.read_bytes() == previous
    assert bits_equal(ckptzip.load(path), old)
    assert set(ops) == {"write", "flush", "truncate", "fsync", "replace"}
    record("faults.injected_write", calls_per_save=counter.calls, faults=faults, errors=faults,
           ops=ops, previous_intact=faults, temp_files_left=0)


def test_injected_eacces_creating_the_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ckpt.ckz"
    ckptzip.save(state(1), path)
    fired = []

    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        fired.append(1)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(storage.tempfile, "mkstemp", mkstemp)
    with pytest.raises(ckptzip.Error, match=rf"{path}: cannot create a file in {tmp_path}: "
                                            r"Permission denied; .*writable"):
        ckptzip.save(state(2), path)
    assert fired and leftovers(tmp_path) == ["ckpt.ckz"]
    assert bits_equal(ckptzip.load(path), state(1))


def test_real_rename_failure_keeps_the_target(tmp_path: Path) -> None:
    """A directory in the checkpoint's place: the kernel refuses the rename (EISDIR)."""
    path = tmp_path / "ckpt.ckz"
    path.mkdir()
    (path / "inside").write_text("x")
    with pytest.raises(ckptzip.Error, match=r"ckpt\.ckz: write failed \(Is a directory\)"):
        ckptzip.save(state(1), path)
    assert leftovers(tmp_path) == ["ckpt.ckz"] and (path / "inside").read_text() == "x"


# -- real kernel faults in child processes --------------------------------------------------------

CHILD_PRELUDE = """
import errno, json, os, resource, signal, subprocess, sys
import torch, ckptzip
sys.path.insert(0, {root!r})
from tests.test_faults import state, leftovers
from tests.test_corruption import bits_equal
"""

RLIMIT_CHILD = CHILD_PRELUDE + """
directory = sys.argv[1]
path = os.path.join(directory, "ckpt.ckz")
ckptzip.save(state(1), path, threads=1)
previous = open(path, "rb").read()
new_size = len(ckptzip.dumps(state(2), threads=1, chunk_bytes=64 << 10))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the kernel then fails the write with EFBIG
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
results = {{"faults": 0, "errno": [], "messages": set(), "intact": 0, "clean": 0}}
for limit in range(0, new_size, max(1, new_size // 40)):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        ckptzip.save(state(2), path, threads=1, chunk_bytes=64 << 10)
    except ckptzip.Error as exc:
        results["faults"] += 1
        results["errno"].append(getattr(exc.__cause__, "errno", None))
        results["messages"].add(str(exc))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    results["intact"] += open(path, "rb").read() == previous and bits_equal(ckptzip.load(path), state(1))
    results["clean"] += leftovers(directory) == ["ckpt.ckz"]
results["messages"] = sorted(results["messages"])
print(json.dumps(results))
"""


def run_child(code: str, *args: str, user: int | None = None, wrap: list[str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = [*(wrap or []), sys.executable, "-c", code.format(root=str(ROOT)), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def last_json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics are Linux's")
def test_real_efbig_from_rlimit_fsize(tmp_path: Path) -> None:
    results = last_json(run_child(RLIMIT_CHILD, str(tmp_path)))
    faults = results["faults"]
    assert faults >= 30, results
    assert set(results["errno"]) == {errno.EFBIG}, results  # the kernel really refused
    assert results["intact"] == faults and results["clean"] == faults, results
    for message in results["messages"]:
        assert "ckpt.ckz: write failed (File too large)" in message and "intact" in message
    record("faults.real_efbig", faults=faults, errors=faults, previous_intact=results["intact"],
           temp_files_left=faults - results["clean"])


TMPFS_CHILD = CHILD_PRELUDE + """
from ckptzip.manager import CheckpointManager
directory = sys.argv[1]
if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", directory]).returncode:
    print(json.dumps({{"skip": "cannot mount a tmpfs here"}}))
    sys.exit(0)
path = os.path.join(directory, "ckpt.ckz")
ckptzip.save(state(1, 30_000), path, threads=1)
previous = open(path, "rb").read()
results = {{"faults": 0, "saved": 0, "errno": [], "messages": set(), "intact": 0, "clean": 0}}
filler = os.path.join(directory, "filler")
free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
for size in range(0, free, 4096):  # leave every amount of free space, page by page
    with open(filler, "wb") as handle:
        handle.write(b"\\0" * (free - size))
    try:
        ckptzip.save(state(2, 30_000), path, threads=1, chunk_bytes=16 << 10)
    except ckptzip.Error as exc:
        results["faults"] += 1
        results["errno"].append(getattr(exc.__cause__, "errno", None))
        results["messages"].add(str(exc))
        same = open(path, "rb").read() == previous
        results["intact"] += same and bits_equal(ckptzip.load(path), state(1, 30_000))
    else:
        results["saved"] += 1
        assert bits_equal(ckptzip.load(path), state(2, 30_000))
        break
    finally:
        os.remove(filler)
    results["clean"] += leftovers(directory) == ["ckpt.ckz"]
# a manager whose background save meets the full disk
os.remove(path)
manager = CheckpointManager(directory, threads=1)
manager.save(1, state(1, 30_000))
manager.wait()
with open(filler, "wb") as handle:
    handle.write(b"\\0" * (os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize - 8192))
manager.save(2, state(2, 30_000))
results["manager"], results["manager_errno"] = "no error", None
try:
    manager.wait()
except ckptzip.Error as exc:
    results["manager"] = str(exc)
    results["manager_errno"] = getattr(exc.__cause__.__cause__, "errno", None)
results["manager_latest"] = manager.latest_step()
results["manager_restores"] = bits_equal(manager.restore(), state(1, 30_000))
results["manager_files"] = leftovers(directory, "filler", ".ckptzip.lock")
os.remove(filler)
manager.save(3, state(3, 30_000))  # space freed: saving goes on
manager.close()
results["manager_after"] = CheckpointManager(directory).steps()
results["messages"] = sorted(results["messages"])
subprocess.run(["umount", directory])
print(json.dumps(results))
"""


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a private tmpfs needs root and unshare(1) on Linux")
def test_real_enospc_on_a_full_tmpfs(tmp_path: Path) -> None:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = run_child(TMPFS_CHILD, str(mount_point), wrap=["unshare", "--mount", "--propagation", "private"])
    if result.returncode and "unshare" in result.stderr:
        pytest.skip(f"unshare refused here: {result.stderr.strip()[-200:]}")
    results = last_json(result)
    if "skip" in results:
        pytest.skip(results["skip"])
    faults = results["faults"]
    assert faults >= 10 and results["saved"] == 1, results  # failed until the space sufficed
    assert set(results["errno"]) == {errno.ENOSPC}, results
    assert results["intact"] == faults and results["clean"] == faults, results
    for message in results["messages"]:
        assert "ckpt.ckz: write failed (No space left on device)" in message, message
        assert "free space" in message
    assert "step 2" in results["manager"] and "No space left on device" in results["manager"]
    assert results["manager_errno"] == errno.ENOSPC
    assert results["manager_latest"] == 1 and results["manager_restores"]
    assert results["manager_files"] == [step_file(1)]  # no partial step 2, no temp file
    assert results["manager_after"] == [1, 3]
    record("faults.real_enospc_tmpfs", faults=faults, errors=faults,
           previous_intact=results["intact"], temp_files_left=faults - results["clean"],
           manager_fault="ckptzip.Error naming step 2, latest_step() stays 1")


# -- permissions: a real EACCES, as an unprivileged user ------------------------------------------

NOBODY_CHILD = CHILD_PRELUDE + """
from ckptzip.manager import CheckpointManager
directory = sys.argv[1]
path = os.path.join(directory, "ckpt.ckz")
ckptzip.load(path)  # imports everything lazily loaded, while still root
os.setgid({nobody}); os.setuid({nobody})
results = {{"uid": os.getuid()}}
def attempt(name, call):
    try:
        call()
        results[name] = "no error"
    except ckptzip.Error as exc:
        results[name] = "ckptzip.Error: " + str(exc)
    except Exception as exc:
        results[name] = type(exc).__name__ + ": " + str(exc)
attempt("save", lambda: ckptzip.save(state(2), path, threads=1))
results["intact"] = bits_equal(ckptzip.load(path), state(1))
results["files"] = leftovers(directory)
attempt("load_unreadable", lambda: ckptzip.load(os.path.join(directory, "secret.ckz")))
attempt("manager", lambda: CheckpointManager(directory))
attempt("manager_new_dir", lambda: CheckpointManager(os.path.join(directory, "sub")))
print(json.dumps(results))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the unprivileged user can enter but not write (pytest's tmp_path is 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="ckptzip-perm-"))
    try:
        directory.chmod(0o755)
        ckptzip.save(state(1), directory / "ckpt.ckz", threads=1)
        (directory / "ckpt.ckz").chmod(0o644)
        ckptzip.save(state(3), directory / "secret.ckz", threads=1)
        (directory / "secret.ckz").chmod(0o600)
        yield directory
    finally:
        shutil.rmtree(directory)


def nobody_results(directory: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.skip("drops privileges from root; as a normal user, run it with a read-only dir")
    code = NOBODY_CHILD.replace("{nobody}", str(NOBODY))
    results = last_json(run_child(code, str(directory)))
    assert results["uid"] == NOBODY
    return results


def test_real_permission_errors_as_an_unprivileged_user(shared_dir: Path) -> None:
    results = nobody_results(shared_dir)
    assert results["save"].startswith(
        f"ckptzip.Error: {shared_dir}/ckpt.ckz: cannot create a file in {shared_dir}: Permission denied"
    ), results
    assert "writable" in results["save"]
    assert results["intact"] and results["files"] == ["ckpt.ckz", "secret.ckz"]
    assert results["load_unreadable"] == (
        f"ckptzip.Error: {shared_dir}/secret.ckz: cannot open: Permission denied"
    ), results
    record("faults.real_eacces", faults=2, errors=2, previous_intact=1, temp_files_left=0)


def test_manager_on_an_unwritable_directory_is_a_ckptzip_error(shared_dir: Path) -> None:
    results = nobody_results(shared_dir)
    for key in ("manager", "manager_new_dir"):
        assert results[key].startswith(f"ckptzip.Error: {shared_dir}"), results[key]
        assert "Permission denied" in results[key]


# -- read errors mid-load -------------------------------------------------------------------------


class FailingPread:
    """Counts (and fails at the fail_at-th) positional read, by os.pread or os.preadv (the
    decoder reads chunk spans into a reused buffer)."""

    def __init__(self, fail_at: int | None, err: int = errno.EIO) -> None:
        self.injector = Injector(fail_at, err)
        self.real = os.pread
        self.real_v = getattr(os, "preadv", None)

    def __call__(self, fd: int, length: int, offset: int) -> bytes:
        self.injector.tick("pread")
        return self.real(fd, length, offset)

    def preadv(self, fd: int, buffers: list[memoryview], offset: int) -> int:
        self.injector.tick("pread")
        assert self.real_v is not None
        return self.real_v(fd, buffers, offset)


def patch_reads(monkeypatch: pytest.MonkeyPatch, reads: FailingPread) -> None:
    monkeypatch.setattr(storage.os, "pread", reads)
    if reads.real_v is not None:
        monkeypatch.setattr(storage.os, "preadv", reads.preadv)


@pytest.mark.parametrize("threads", [1, 3])
def test_injected_read_errors_at_every_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    base, path = tmp_path / "base.ckz", tmp_path / "delta.ckz"
    ckptzip.save(state(1), base, chunk_bytes=32 << 10)
    nudged = state(1)
    nudged["w"][::50] += 1
    ckptzip.save(nudged, path, base=base, chunk_bytes=32 << 10)
    counter = FailingPread(None)
    patch_reads(monkeypatch, counter)
    assert bits_equal(ckptzip.load(path, threads=threads), nudged)
    reads = counter.injector.calls
    # headers and chunk spans of both files (the base's tensors are read in one pass)
    assert reads >= 5
    named = {"delta.ckz": 0, "base.ckz": 0}
    for fail_at in range(1, reads + 1):
        failing = FailingPread(fail_at)
        patch_reads(monkeypatch, failing)
        with pytest.raises(ckptzip.Error, match=r"read error at byte \d+: Input/output error; "
                                                r"check the disk") as info:
            ckptzip.load(path, threads=threads)
        assert failing.injector.fired == "pread"
        message = str(info.value)
        assert message.startswith(f"{path}: "), message  # always the file asked for
        # ... and the base too, when the failed read was the base's
        named["base.ckz" if f"cannot be read: {base}: read error" in message
              else "delta.ckz"] += 1
    assert named["delta.ckz"] and named["base.ckz"]
    # lazily: get_tensor after a successful open
    patch_reads(monkeypatch, FailingPread(None))
    for fail_at in range(1, 4):
        with ckptzip.open(path, threads=threads) as ckpt:
            failing = FailingPread(fail_at)
            patch_reads(monkeypatch, failing)
            with pytest.raises(ckptzip.Error, match=r"\.ckz: read error at byte"):
                ckpt.get_tensor("w")
            assert failing.injector.fired
            patch_reads(monkeypatch, FailingPread(None))
            assert bits_equal(ckpt.get_tensor("h"), nudged["h"])  # the file is still usable
    monkeypatch.undo()
    assert bits_equal(ckptzip.load(path), nudged)
    record(f"faults.injected_eio_threads{threads}", faults=reads + 3, errors=reads + 3,
           named_delta=named["delta.ckz"], named_base=named["base.ckz"])


def test_real_short_read_of_a_file_cut_under_an_open_reader(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.ckz"
    ckptzip.save(state(1), path)
    with ckptzip.open(path) as ckpt:
        os.truncate(path, path.stat().st_size // 2)
        with pytest.raises(ckptzip.Error, match=r"ckpt\.ckz: the file shrank while being read"):
            ckpt.load()


# -- a manager's background save hitting ENOSPC ---------------------------------------------------


def test_manager_background_enospc_surfaces_and_keeps_the_latest_good_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ckptzip.parallel, "TASK_BYTES", 1)  # a write per chunk
    counter = Injector(None)
    with monkeypatch.context() as patch:  # a dry run counts the calls
        inject_write_faults(patch, counter)
        ckptzip.save(state(2), tmp_path / "dry.ckz", threads=1)
    os.remove(tmp_path / "dry.ckz")
    assert counter.calls >= 8
    manager = CheckpointManager(tmp_path, threads=1, keep_last=1)
    manager.save(1, state(1))
    manager.wait()
    faults = 0
    for fail_at in (1, 2, counter.calls // 2, counter.calls):
        injector = Injector(fail_at)
        with monkeypatch.context() as patch:
            inject_write_faults(patch, injector)
            manager.save(2, state(2))
            with pytest.raises(ckptzip.Error, match=r"saving step 2 in the background failed: "
                               r".*step-00000002\.ckz: write failed \(No space left on device\)"):
                manager.save(3, state(3))  # the next call reports it (and saves nothing)
        assert injector.fired
        faults += 1
        assert manager.latest_step() == 1 and manager.steps() == [1]
        assert leftovers(tmp_path, ".ckptzip.lock") == [step_file(1)]
        assert bits_equal(manager.restore(), state(1))
    manager.save(2, state(2))  # space is back
    manager.close()
    with CheckpointManager(tmp_path) as reopened:
        assert reopened.steps() == [1, 2] and bits_equal(reopened.restore(2), state(2))
    record("faults.manager_background_enospc", faults=faults, errors=faults, latest_kept=faults)
