"""Faults while the command line reads and writes users' files (``sources``) and while any output
is written (``storage.atomic_write``): a full disk, a size limit, a permission refused or an
interrupt is a ckptzip.Error naming the user's path (or the interrupt itself), never a raw
OSError or torch's RuntimeError, and it leaves the previous output whole and no temporary file
or folder behind except under a name with the temporary marker.

Real faults where they can be had cheaply (RLIMIT_FSIZE, a tiny tmpfs in a private mount
namespace, the user nobody in a forked child), injected ones elsewhere. A SIGKILL is placed at
each step of replacing a directory, in forked children.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip import sources, storage
from ckptzip.storage import TEMP_MARKER

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534
NEW = {"files": {"a.txt": b"new a", "sub/b.txt": b"new b"}}
DIRECTORY = {"kind": "directory"}

needs_fork = pytest.mark.skipif(sys.platform != "linux", reason="forks and Linux's errors")
needs_root = pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                                reason="drops privileges to nobody, which needs root")


def listing(directory: Path | str) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path, with its bytes."""
    return {os.path.relpath(os.path.join(root, name), directory): Path(root, name).read_bytes()
            for root, _, names in os.walk(directory) for name in names}


def old_directory(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "previous.txt").write_bytes(b"the previous output")


def in_child(work: Callable[[], Any], *, user: int | None = None) -> tuple[int, Any]:
    """Run ``work`` in a forked child (as ``user``, if given); its wait status and what it
    returned, or the text of what it raised, as JSON."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            os.close(read)
            if user is not None:
                os.setgroups([])
                os.setgid(user)
                os.setuid(user)
            try:
                result: Any = {"returned": work()}
            except BaseException as exc:
                result = {"raised": type(exc).__name__, "message": str(exc)}
            os.write(write, json.dumps(result).encode())
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    status = os.waitpid(pid, 0)[1]
    return status, json.loads(data) if data else None


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory the user nobody can reach (pytest's tmp_path is 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="ckptzip-storage-"))
    try:
        directory.chmod(0o755)
        yield directory
    finally:
        shutil.rmtree(directory)


# -- 1. a directory's walk: an unreadable subdirectory is an error, not left out ------------------


@needs_root
def test_compressing_a_directory_with_an_unreadable_subdirectory_is_an_error(open_dir: Path) -> None:
    source = open_dir / "checkpoint-10"
    (source / "private").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "private" / "rng.json").write_text('{"seed": 1}')
    for path in (source, source / "config.json"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (source / "private").chmod(0o700)  # root's: nobody cannot list it
    status, result = in_child(lambda: sorted(sources.read_directory(str(source)).state["files"]),
                              user=NOBODY)
    assert status == 0 and result["raised"] == "Error", result  # it was ['config.json']
    assert result["message"].startswith(f"{source}/private: cannot read the directory "
                                        f"(Permission denied); make it readable"), result


def test_a_walk_error_anywhere_in_the_directory_is_an_error(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, injected (any user): an EIO listing a subdirectory."""
    (tmp_path / "run" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "a.json").write_text("{}")
    (tmp_path / "run" / "sub" / "b.json").write_text("{}")
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path).endswith("sub"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(ckptzip.Error, match=rf"{tmp_path}/run/sub: cannot read the directory "
                                            r"\(Input/output error\)"):
        sources.read_directory(str(tmp_path / "run"))


# -- 2. replacing a directory (decompress -f) ------------------------------------------------------


def swap_killed_at(step: int, target: str) -> Callable[[], None]:
    """What a child runs: write_directory over an existing ``target``, SIGKILLed at the
    ``step``-th rename (just after it) or removal of a directory (just before it)."""

    def work() -> None:
        real_rename, real_rmtree = os.rename, shutil.rmtree
        count = [0]

        def tick() -> None:
            count[0] += 1
            if count[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)

        def rename(src: Any, dst: Any, **kwargs: Any) -> None:
            real_rename(src, dst, **kwargs)
            tick()

        def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
            tick()
            real_rmtree(path, *args, **kwargs)

        os.rename, shutil.rmtree = rename, rmtree  # type: ignore[assignment]
        sources.write_directory(NEW, DIRECTORY, target)

    return work


OLD_FILES = {"previous.txt": b"the previous output"}
NEW_FILES = {"a.txt": b"new a", "sub/b.txt": b"new b"}


Files = dict[str, bytes]


def killed_swaps(tmp_path: Path) -> list[tuple[int, Files | None, dict[str, Files]]]:
    """For each step of replacing ``tmp_path/ck``, until a child finishes: its wait status,
    the files at ``ck`` then (None: no directory there) and what else ``tmp_path`` holds."""
    outcomes = []
    for step in range(1, 10):
        shutil.rmtree(tmp_path)
        old_directory(tmp_path / "ck")
        status, _ = in_child(swap_killed_at(step, str(tmp_path / "ck")))
        there = listing(tmp_path / "ck") if (tmp_path / "ck").is_dir() else None
        others = {n: listing(tmp_path / n) for n in os.listdir(tmp_path) if n != "ck"}
        outcomes.append((status, there, others))
        if status == 0:
            return outcomes
    raise AssertionError(f"the swap never finished: {outcomes}")


@needs_fork
def test_a_kill_while_replacing_a_directory_leaves_the_old_or_the_new_one(tmp_path: Path) -> None:
    """renameat2(RENAME_EXCHANGE) swaps the two in one step: killed at any step, the output's
    name holds a whole directory, old or new, and what else is left carries the temporary
    marker. (Two renames, as before, left no directory at the name when killed between them.)"""
    if not hasattr(ctypes.CDLL(None), "renameat2"):
        pytest.skip("no renameat2 in this C library")
    outcomes = killed_swaps(tmp_path)
    for status, there, others in outcomes:
        assert status in (0, signal.SIGKILL) and there is not None, outcomes
        assert there in (OLD_FILES, NEW_FILES), outcomes
        assert all(TEMP_MARKER in name for name in others), outcomes
    assert outcomes[-1][1:] == (NEW_FILES, {}), outcomes


class NoRenameat2:
    """A C library without renameat2 (glibc before 2.28, musl)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


@needs_fork
def test_without_renameat2_a_killed_replacement_leaves_only_marked_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback renames the old directory aside first: a kill between the renames leaves
    it under a name with the temporary marker (it was ``.ck.old-XXXX``), beside the new one."""
    monkeypatch.setattr(ctypes, "CDLL", NoRenameat2)
    outcomes = killed_swaps(tmp_path)
    assert len(outcomes) >= 3, outcomes  # killed after each rename, then at the removal
    for status, there, others in outcomes:
        assert status in (0, signal.SIGKILL), outcomes
        assert all(TEMP_MARKER in name for name in others), outcomes
        if there is None:  # between the renames: both are kept, under marked names
            assert sorted(others.values(), key=len) == [OLD_FILES, NEW_FILES], outcomes
        else:
            assert there in (OLD_FILES, NEW_FILES), outcomes
    assert outcomes[-1][1:] == (NEW_FILES, {}), outcomes


class FailingRenameat2:
    """A C library whose renameat2 fails with ``err``."""

    def __init__(self, err: int) -> None:
        self.err = err
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> FailingRenameat2:
        return self

    def renameat2(self, *args: Any) -> int:
        self.calls += 1
        ctypes.set_errno(self.err)
        return -1


@pytest.mark.parametrize("err", [errno.EINVAL, errno.ENOSYS])
def test_a_filesystem_without_rename_exchange_falls_back_to_two_renames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    library = FailingRenameat2(err)
    monkeypatch.setattr(ctypes, "CDLL", library)
    old_directory(tmp_path / "ck")
    sources.write_directory(NEW, DIRECTORY, str(tmp_path / "ck"))
    assert library.calls == 1 and listing(tmp_path / "ck") == NEW_FILES
    assert os.listdir(tmp_path) == ["ck"]


@pytest.mark.parametrize("err", [errno.EBUSY, errno.EPERM])
def test_a_refused_swap_is_an_error_naming_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """A mount point (EBUSY) or another user's directory in a sticky folder (EPERM): the
    rename's OSError was a traceback."""
    monkeypatch.setattr(ctypes, "CDLL", FailingRenameat2(err))
    old_directory(tmp_path / "ck")
    with pytest.raises(ckptzip.Error, match=rf"{tmp_path}/ck: cannot put the new directory in "
                                            rf"place of the existing one \({os.strerror(err)}\); "
                                            r"that one is intact.*pass another -o") as info:
        sources.write_directory(NEW, DIRECTORY, str(tmp_path / "ck"))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == err
    assert listing(tmp_path / "ck") == OLD_FILES and os.listdir(tmp_path) == ["ck"]


@needs_root
def test_another_users_directory_in_a_sticky_folder_is_a_clear_error(open_dir: Path) -> None:
    """Real: as nobody, over root's directory in a /tmp-like folder."""
    sticky = open_dir / "shared"
    old_directory(sticky / "out")
    sticky.chmod(0o1777)
    (sticky / "out").chmod(0o777)
    status, result = in_child(lambda: sources.write_directory(NEW, DIRECTORY, str(sticky / "out")),
                              user=NOBODY)
    assert status == 0 and result["raised"] == "Error", result
    assert result["message"].startswith(f"{sticky}/out: cannot put the new directory in place of "
                                        f"the existing one (Operation not permitted)"), result
    assert listing(sticky / "out") == OLD_FILES and os.listdir(sticky) == ["out"]


def test_decompress_f_over_a_link_to_a_directory_replaces_the_link(tmp_path: Path) -> None:
    """The link is replaced by the new directory; what it names is untouched, and nothing is
    left beside it (a `.link.old-XXXX` link was)."""
    old_directory(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    sources.write_directory(NEW, DIRECTORY, str(tmp_path / "link"))
    assert not (tmp_path / "link").is_symlink() and listing(tmp_path / "link") == NEW_FILES
    assert listing(tmp_path / "real") == OLD_FILES
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]


# -- 3. torch.save outputs: a full disk, a size limit, an interrupt --------------------------------


class FailingFile:
    """A file object whose ``fail_at``-th write raises ``failure``."""

    def __init__(self, real: Any, fail_at: int, failure: BaseException, counter: list[int]) -> None:
        self._real, self._fail_at, self._failure, self._counter = real, fail_at, failure, counter

    def write(self, data: Any) -> int:
        self._counter[0] += 1
        if self._counter[0] == self._fail_at:
            raise self._failure
        return int(self._real.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __enter__(self) -> FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()


def failing_writes(monkeypatch: pytest.MonkeyPatch, fail_at: int, failure: BaseException) -> list[int]:
    counter = [0]
    real = os.fdopen
    monkeypatch.setattr(storage.os, "fdopen",
                        lambda fd, *a, **k: FailingFile(real(fd, *a, **k), fail_at, failure, counter))
    return counter


STATE = {"w": torch.arange(50_000, dtype=torch.float32), "b": torch.ones(10)}


def torch_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    with monkeypatch.context() as patch:
        counter = failing_writes(patch, 0, OSError())
        sources.write_torch(STATE, str(tmp_path / "count.pt"))
    os.remove(tmp_path / "count.pt")
    return counter[0]


def test_a_full_disk_writing_a_torch_file_is_a_ckptzip_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save's zip writer swallowed the OSError and raised "[enforce fail at
    inline_container.cc] unexpected pos": now the .ckz outputs' message, at every write."""
    path = tmp_path / "s.pt"
    path.write_bytes(b"previous")
    writes = torch_writes(tmp_path, monkeypatch)
    assert writes >= 3
    for fail_at in range(1, writes + 1):
        with monkeypatch.context() as patch:
            failing_writes(patch, fail_at, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            with pytest.raises(ckptzip.Error) as info:
                sources.write_torch(STATE, str(path))
        message = str(info.value)
        assert message.startswith(f"{path}: write failed (No space left on device); nothing was "
                                  f"written and the previous file, if any, is intact; free space"), \
            (fail_at, message)
        assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
        assert path.read_bytes() == b"previous" and os.listdir(tmp_path) == ["s.pt"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_writing_a_torch_file_stays_an_interrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]) -> None:
    """Ctrl-C (or the command line's SIGTERM, a BaseException as these) inside a write was
    replaced by torch's RuntimeError: a traceback instead of exit status 130."""
    writes = torch_writes(tmp_path, monkeypatch)
    for fail_at in range(1, writes + 1):
        with monkeypatch.context() as patch:
            failing_writes(patch, fail_at, interrupt())
            with pytest.raises(interrupt):
                sources.write_torch(STATE, str(tmp_path / "s.pt"))
        assert os.listdir(tmp_path) == [], fail_at


@needs_fork
def test_an_interrupt_as_torch_save_finishes_does_not_abort_the_process(tmp_path: Path) -> None:
    """Ctrl-C as torch.save's zip writer is being closed leaves it unfinished; freed later (with
    the exception's frames, after the file was closed) it wrote its end into the closed file,
    and the ValueError in its C++ destructor aborted the process (SIGABRT)."""
    path = tmp_path / "s.pt"

    def work() -> str:
        def interrupted(self: Any, *args: Any) -> None:
            raise KeyboardInterrupt

        torch.serialization._open_zipfile_writer_buffer.__exit__ = interrupted  # type: ignore[method-assign]
        with contextlib.suppress(KeyboardInterrupt):
            sources.write_torch(STATE, str(path))
        gc.collect()
        return "survived"

    status, result = in_child(work)
    assert status == 0 and result == {"returned": "survived"}, (status, result)
    assert os.listdir(tmp_path) == []


@needs_fork
def test_a_file_size_limit_writing_a_torch_file_says_so(tmp_path: Path) -> None:
    """A real EFBIG (RLIMIT_FSIZE): the message names the limit, not free space."""
    path = tmp_path / "s.pt"

    def work() -> Any:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        sources.write_torch(STATE, str(path))

    status, result = in_child(work)
    assert status == 0 and result["raised"] == "Error", result
    assert result["message"].startswith(f"{path}: write failed (File too large); nothing was "
                                        f"written and the previous file, if any, is intact; "), result
    assert "file-size limit" in result["message"] and "free space" not in result["message"]
    assert os.listdir(tmp_path) == []


TMPFS_CHILD = """
import json, os, subprocess, sys
sys.path.insert(0, {root!r})
import torch, ckptzip
from ckptzip import sources
directory = sys.argv[1]
results = {{}}
def attempt(name, call):
    try:
        call()
        results[name] = "no error"
    except ckptzip.Error as exc:
        results[name] = "Error: " + str(exc)
    except BaseException as exc:
        results[name] = type(exc).__name__ + ": " + str(exc)
small, few = os.path.join(directory, "small"), os.path.join(directory, "few")
os.makedirs(small); os.makedirs(few)
for mount_point, options in ((small, "size=1m"), (few, "size=20m,nr_inodes=8")):
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", mount_point]).returncode:
        print(json.dumps({{"skip": "cannot mount a tmpfs here"}}))
        sys.exit(0)
attempt("pt", lambda: sources.write_torch({{"w": torch.randn(1_000_000)}}, small + "/s.pt"))
files = {{f"sub{{i}}/config.json": b"{{}}" for i in range(6)}}
attempt("dir", lambda: sources.write_directory({{"files": files}}, {{"kind": "directory"}},
                                               few + "/out"))
results["left"] = sorted(os.listdir(small)) + sorted(os.listdir(few))
for mount_point in (small, few):
    subprocess.run(["umount", mount_point])
print(json.dumps(results))
"""


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a private tmpfs needs root and unshare(1) on Linux")
def test_real_full_disks_decompressing_a_torch_file_and_a_directory(tmp_path: Path) -> None:
    """A tmpfs out of space (a .pt output: torch's RuntimeError was a traceback) and one out of
    inodes (a directory's subfolder: a raw OSError from os.makedirs)."""
    command = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
               TMPFS_CHILD.format(root=str(ROOT / "src")), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    if result.returncode and "unshare" in result.stderr:
        pytest.skip(f"unshare refused here: {result.stderr.strip()[-200:]}")
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    assert results["pt"].startswith(f"Error: {tmp_path}/small/s.pt: write failed (No space left "
                                    f"on device); nothing was written"), results
    assert results["dir"].startswith(f"Error: {tmp_path}/few/out/sub"), results
    assert "cannot create the directory (No space left on device)" in results["dir"], results
    assert TEMP_MARKER not in results["dir"], results
    assert results["left"] == [], results


# -- 4. a directory's subfolders and files: errors name the output's path --------------------------


def test_a_failed_subfolder_names_the_output_path_not_the_temporary_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.makedirs

    def makedirs(name: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(name).endswith("sub"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(name))
        real(name, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    out = tmp_path / "out"
    with pytest.raises(ckptzip.Error) as info:
        sources.write_directory(NEW, DIRECTORY, str(out))
    assert str(info.value).startswith(f"{out}/sub: cannot create the directory (No space left on "
                                      f"device)"), str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_a_failed_file_in_a_directory_names_the_output_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_writes(monkeypatch, 2, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    old_directory(tmp_path / "out")
    with pytest.raises(ckptzip.Error) as info:
        sources.write_directory(NEW, DIRECTORY, str(tmp_path / "out") + "/")
    message = str(info.value)
    assert message.startswith(f"{tmp_path}/out/sub/b.txt: write failed (No space left on device)")
    assert TEMP_MARKER not in message and info.value.__cause__.errno == errno.ENOSPC  # type: ignore[union-attr]
    assert listing(tmp_path / "out") == OLD_FILES and os.listdir(tmp_path) == ["out"]


# -- 5. long names ---------------------------------------------------------------------------------


def test_a_name_the_filesystem_takes_can_be_written(tmp_path: Path) -> None:
    """The temporary name was the name plus 18 bytes: 238 to 255-byte names failed with
    ENAMETOOLONG (and advice about permissions and free space)."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "run-" + "x" * (limit - 8) + ".ckz"
    assert len(name) == limit
    ckptzip.save({"w": torch.ones(10)}, tmp_path / name)
    assert torch.equal(ckptzip.load(tmp_path / name)["w"], torch.ones(10))
    folder = "d" * limit  # a directory's temporary folder, and a file of that length in it
    sources.write_directory({"files": {name: b"x"}}, DIRECTORY, str(tmp_path / folder))
    assert (tmp_path / folder / name).read_bytes() == b"x"
    assert sorted(os.listdir(tmp_path)) == sorted([name, folder])


def test_temporary_names_are_cut_by_whole_characters(tmp_path: Path) -> None:
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    for name in ("é" * 200, "a" + "日本" * 60, "short"):
        prefix = storage.temp_prefix(str(tmp_path), name)
        assert len(os.fsencode(prefix)) + 8 <= limit  # mkstemp adds 8 characters
        kept = prefix[1 : prefix.index(TEMP_MARKER)]
        assert kept and name.startswith(kept) and (kept == name) == (name == "short")
        prefix.encode("utf-8")  # no half characters (surrogate escapes would not encode)


# -- 6. an interrupt just as the temporary file or folder is made ----------------------------------


def test_an_interrupt_right_after_mkstemp_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mkstemp made the file, then Ctrl-C: inside it (its name never returned) or just after."""
    real = tempfile.mkstemp

    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        fd, _ = real(*args, **kwargs)
        os.close(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(storage.tempfile, "mkstemp", mkstemp)
    with pytest.raises(KeyboardInterrupt):
        ckptzip.save({"w": torch.ones(10)}, tmp_path / "a.ckz")
    with pytest.raises(KeyboardInterrupt), storage.atomic_write(tmp_path / "b.bin"):
        pass
    assert os.listdir(tmp_path) == []


def test_an_interrupt_right_after_mkdtemp_leaves_no_temporary_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tempfile.mkdtemp

    def mkdtemp(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(sources.tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(KeyboardInterrupt):
        sources.write_directory(NEW, DIRECTORY, str(tmp_path / "out"))
    assert os.listdir(tmp_path) == []


def test_another_writers_temporary_file_is_not_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an interrupted call removes by its prefix is its own: another save of the same name
    (its temporary file beside) keeps its file."""
    theirs = tmp_path / f".a.ckz{TEMP_MARKER}abcdef12345678"
    theirs.write_bytes(b"another writer's")
    real = tempfile.mkstemp

    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(storage.tempfile, "mkstemp", mkstemp)
    with pytest.raises(KeyboardInterrupt):
        ckptzip.save({"w": torch.ones(10)}, tmp_path / "a.ckz")
    assert os.listdir(tmp_path) == [theirs.name]


# -- 7. the decompressed directory's mode ----------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_a_decompressed_directory_has_the_mode_mkdir_gives(tmp_path: Path, umask: int) -> None:
    """It was always 0700 (mkdtemp's), unreadable to anyone else, its subfolders not."""
    previous = os.umask(umask)
    try:
        sources.write_directory(NEW, DIRECTORY, str(tmp_path / "out"))
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "out").stat().st_mode)
    assert mode == 0o777 & ~umask == stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert stat.S_IMODE((tmp_path / "out" / "sub").stat().st_mode) == mode
