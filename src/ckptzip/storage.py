"""Where bytes live: local files (atomic writes, positional reads) and fsspec URLs.

Writes are atomic: data goes to a temporary name in the destination's directory, is fsynced, then
renamed over the destination, and the directory is fsynced. A crash mid-save leaves the previous
file intact and the new one either complete or absent. On S3 a save streams as a multipart upload
that becomes the object only when complete (``objstore``, ``sinks.open_sink``); on other fsspec
filesystems it is staged in a local temporary file and uploaded whole once complete.

Remote reads are ranged requests, several in flight while the reader's threads decode
(:class:`RemoteSource`). :func:`open_directory` gives a CheckpointManager its directory or
bucket prefix, locked against a second manager.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from stat import S_ISREG
from typing import IO, Any, Protocol

from .errors import Error
from .objstore import (
    HEAD_BYTES,
    CommitGuard,
    Lease,
    MultipartUpload,
    ObjectStore,
    S3Store,
    StorageOptions,
    commit_guard,
    filesystem,
)

TEMP_MARKER = ".ckz-tmp-"
LOCK_NAME = ".ckptzip.lock"
#: Range requests a remote source keeps outstanding per reading thread (fetched ahead of the
#: decoders, each a task's span of at most 4 MiB).
FETCHES_PER_THREAD = 2

PathLike = str | os.PathLike[str]


def is_url(path: PathLike) -> bool:
    return "://" in os.fspath(path) and not os.fspath(path).startswith("file://")


def local_path(path: PathLike) -> str:
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


class Source(Protocol):
    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes | memoryview: ...

    def read_scratch(self, offset: int, length: int) -> bytes | memoryview:
        """Like ``read``, but the bytes may live in this thread's buffer for the source: valid
        until the thread's next ``read_scratch`` on it (the decoder's chunk spans)."""
        ...

    def expect(self, spans: list[tuple[int, int]], threads: int) -> None:
        """A hint: these spans (offset, length) are read next, about in this order, by
        ``threads`` threads. A remote source starts fetching them; local ones read on demand."""
        ...

    def close(self) -> None: ...


class BytesSource:
    def __init__(self, data: bytes | bytearray | memoryview, name: str = "<bytes>") -> None:
        self.view = memoryview(data).cast("B")
        self.name = name
        self.size = len(self.view)

    def read(self, offset: int, length: int) -> memoryview:
        return self.view[offset : offset + length]

    read_scratch = read

    def expect(self, spans: list[tuple[int, int]], threads: int) -> None:
        """In memory already: nothing to fetch."""

    def close(self) -> None:
        self.view.release()


class FileSource:
    """A local file read with ``os.pread``: thread-safe and GIL-free while reading."""

    def __init__(self, path: str) -> None:
        self.name = path
        try:
            self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            raise Error(f"{path}: no such file") from None
        except OSError as exc:
            raise Error(f"{path}: cannot open: {exc.strerror}") from None
        self.size = os.fstat(self.fd).st_size
        self._scratch = threading.local()

    def read(self, offset: int, length: int) -> bytes:
        self._check_open()
        try:
            data = os.pread(self.fd, length, offset)
        except OSError as exc:
            self._check_open()  # closed while this thread read
            raise Error(
                f"{self.name}: read error at byte {offset}: {exc.strerror}; check the disk or copy"
            ) from None
        if len(data) != length:
            raise Error(
                f"{self.name}: the file shrank while being read (wanted {length} bytes at "
                f"{offset}, got {len(data)}); is another process rewriting it?"
            )
        return data

    def read_scratch(self, offset: int, length: int) -> bytes | memoryview:
        """Reads into a buffer that each thread reuses: a fresh ``bytes`` per span would be
        fresh memory, faulted in page by page on every read."""
        if not hasattr(os, "preadv"):
            return self.read(offset, length)
        self._check_open()
        buffer: bytearray | None = getattr(self._scratch, "buffer", None)
        if buffer is None or len(buffer) < length:
            buffer = self._scratch.buffer = bytearray(max(length, 1 << 20))
        view = memoryview(buffer)[:length]
        done = 0
        while done < length:
            try:
                got = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as exc:
                self._check_open()  # closed while this thread read
                raise Error(f"{self.name}: read error at byte {offset + done}: {exc.strerror}; "
                            "check the disk or copy") from None
            if got == 0:
                raise Error(
                    f"{self.name}: the file shrank while being read (wanted {length} bytes at "
                    f"{offset}, got {done}); is another process rewriting it?"
                )
            done += got
        return view

    def expect(self, spans: list[tuple[int, int]], threads: int) -> None:
        """A local file is read on demand (``pread`` from the decoding threads)."""

    def _check_open(self) -> None:
        if self.fd < 0:  # closed (another thread may still be reading): not a disk's fault
            raise Error(f"{self.name}: the checkpoint was closed; open it again to read it")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # a checkpoint opened and dropped unclosed (ckptzip.open(p).metadata in a loop) kept its
        # descriptor until the process ran out of them; as a Python file object, it is closed
        # when collected, with a ResourceWarning (shown under -W default or python -X dev)
        if getattr(self, "fd", -1) >= 0:
            warnings.warn(f"unclosed checkpoint {self.name!r}: close it, or open it in a with "
                          f"block", ResourceWarning, stacklevel=2)
            self.close()


class RemoteSource:
    """An object read with ranged requests (thread-safe).

    Told what comes next (:meth:`expect`), it keeps up to ``FETCHES_PER_THREAD`` requests per
    reading thread outstanding, so the object is fetched while the threads decode, and only the
    spans asked for are fetched: a lazy ``get_tensor`` costs the head and that tensor's chunks.
    The first request takes ``HEAD_BYTES`` at once (prelude and header in one round trip).
    ``bytes_fetched`` and ``requests`` count what it fetched.
    """

    def __init__(self, url: str, storage_options: StorageOptions = None) -> None:
        self.name = url
        self.store, self.path = ObjectStore.open(url, storage_options)
        self.size = self.store.size(self.path, url)
        self.bytes_fetched = 0
        self.requests = 0
        self._lock = threading.Lock()
        # its own lock: a fetch done already runs its callback at once, maybe under self._lock
        self._counting = threading.Lock()
        self._ahead: deque[tuple[int, int]] = deque()
        self._fetching: dict[tuple[int, int], concurrent.futures.Future[bytes]] = {}
        self._window = 0
        head = min(self.size, HEAD_BYTES)
        self._head = self._wait(self._fetch(0, head), 0, head) if head else b""

    def _fetch(self, offset: int, length: int) -> concurrent.futures.Future[bytes]:
        future = self.store.fetch(self.path, offset, offset + length)

        def count(done: concurrent.futures.Future[bytes]) -> None:
            if not done.cancelled() and done.exception() is None:
                with self._counting:
                    self.bytes_fetched += len(done.result())
                    self.requests += 1

        future.add_done_callback(count)
        return future

    def _wait(self, future: concurrent.futures.Future[bytes], offset: int, length: int) -> bytes:
        try:
            data = future.result()
        except FileNotFoundError:
            raise Error(f"{self.name}: the object is gone (deleted while being read?)") from None
        except Exception as exc:
            raise Error(f"{self.name}: reading bytes {offset}+{length} failed "
                        f"({type(exc).__name__}: {exc}); check the endpoint, the credentials and "
                        f"that the object still exists, then retry") from exc
        if len(data) != length:
            raise Error(f"{self.name}: short read at byte {offset} (wanted {length} bytes, got "
                        f"{len(data)}); the object changed while being read")
        return data

    def expect(self, spans: list[tuple[int, int]], threads: int) -> None:
        with self._lock:
            for future in self._fetching.values():
                future.cancel()
            self._fetching.clear()
            if not self.store.async_reads:
                return
            head = len(self._head)
            self._ahead = deque(span for span in spans if span[0] + span[1] > head)
            self._window = FETCHES_PER_THREAD * max(1, threads)
            self._fill()

    def _fill(self) -> None:
        """Start fetches of the next expected spans while fewer than the window are outstanding
        (call with the lock held)."""
        while self._ahead and len(self._fetching) < self._window:
            span = self._ahead.popleft()
            self._fetching[span] = self._fetch(*span)

    def read(self, offset: int, length: int) -> bytes | memoryview:
        if offset + length <= len(self._head):
            return memoryview(self._head)[offset : offset + length]
        with self._lock:
            future = self._fetching.pop((offset, length), None)
            if future is None:
                with contextlib.suppress(ValueError):
                    self._ahead.remove((offset, length))
            self._fill()
        if future is None:
            future = self._fetch(offset, length)
        return self._wait(future, offset, length)

    read_scratch = read

    def close(self) -> None:
        with self._lock:
            self._ahead.clear()
            for future in self._fetching.values():
                future.cancel()
            self._fetching.clear()


def exists(path: PathLike, storage_options: StorageOptions = None) -> bool:
    """Whether a file (or object, for a URL) is there."""
    if not is_url(path):
        return os.path.exists(local_path(path))
    fs, fs_path = filesystem(os.fspath(path), storage_options)
    fs.invalidate_cache(fs_path)
    return bool(fs.exists(fs_path))


def open_source(path: PathLike, storage_options: StorageOptions = None) -> Source:
    if is_url(path):
        return RemoteSource(os.fspath(path), storage_options)
    if os.path.isdir(local_path(path)):
        raise Error(f"{os.fspath(path)}: a directory, not a .ckz file; name the .ckz (a "
                    f"directory is compressed into one: ckptzip compress DIR)")
    return FileSource(local_path(path))


def remote_upload(path: PathLike, storage_options: StorageOptions = None) -> MultipartUpload | None:
    """A streamed, all-or-nothing upload to ``path`` where its store has one (S3), else None
    (local paths: :func:`atomic_write`; other stores: staged locally, put whole)."""
    if not is_url(path):
        return None
    store, fs_path = ObjectStore.open(os.fspath(path), storage_options)
    return store.upload(fs_path, os.fspath(path))


def _umask() -> int:
    """The process umask, read without changing it (os.umask can only set it, racing threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def directory_mode() -> int:
    """The permission bits a plain ``mkdir`` gives a directory (0777 less the umask)."""
    return 0o777 & ~_umask()


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem lets us open directories
        fd = os.open(directory or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: The random characters ``tempfile.mkstemp``/``mkdtemp`` append to a prefix.
_TEMP_RANDOM = 8
#: The hex characters of :func:`temp_prefix`'s token.
_TOKEN_HEX = 6
#: How old (by its last write) the temporary file of a write that died must be before the
#: next write of the same name removes it: the span between a writer's mkstemp and its lock,
#: by a wide margin.
STALE_TEMP_SECONDS = 60.0


def temp_prefix(directory: str, name: str, tag: str = "") -> str:
    """A prefix for ``tempfile.mkstemp``/``mkdtemp`` in ``directory`` beside ``name``:
    ``.NAME.ckz-tmp-TAGTOKEN``. TOKEN is random, so what one call made can be found by its
    prefix even when an interrupt struck inside mkstemp, before its name came back
    (:func:`remove_temp`); NAME is cut short where the whole name (with the 8 characters
    mkstemp adds) would pass the filesystem's limit on a name's length, so a name that limit
    allows can be written (a 240-byte name plus 18 bytes did not fit in 255)."""
    try:
        limit = os.pathconf(directory or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = -1
    limit = limit if limit > 0 else 255  # -1: no limit told
    tail = f"{TEMP_MARKER}{tag}{secrets.token_hex(_TOKEN_HEX // 2)}"
    room = limit - len(os.fsencode("." + tail)) - _TEMP_RANDOM
    while name and len(os.fsencode(name)) > room:
        name = name[: max(0, min(len(name) - 1, room))]  # by characters: whole UTF-8 sequences
    return f".{name}{tail}"


def remove_temp(directory: str, prefix: str, made: str = "") -> None:
    """Remove the temporary file or folder ``made``; when its name is not known (an interrupt
    inside mkstemp, after it created the file), whatever in ``directory`` carries ``prefix``
    (from :func:`temp_prefix`: this call's own). Best effort: errors are ignored."""
    names = [made] if made else []
    if not made:
        with contextlib.suppress(OSError):
            names = [os.path.join(directory, name) for name in os.listdir(directory)
                     if name.startswith(prefix)]
    for path in names:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def remove_dead_writes(directory: str, prefix: str) -> None:
    """Remove the temporary files a killed write of the same name left in ``directory`` (a
    SIGKILL or a power cut runs no cleanup): those named like ``prefix`` (a
    :func:`temp_prefix` of no tag), regular files, that no process holds the lock of (a writer
    holds its file's ``flock`` until it ends, and the kernel drops it when the writer dies) and
    that nothing wrote to for :data:`STALE_TEMP_SECONDS`. Writes of other names are never
    touched, nor where the filesystem refuses locks. Best effort: errors are ignored."""
    stem = prefix[:-_TOKEN_HEX]
    pattern = re.compile(re.escape(stem) + f"[0-9a-f]{{{_TOKEN_HEX}}}[a-z0-9_]{{{_TEMP_RANDOM}}}")
    try:
        names = [name for name in os.listdir(directory or ".") if pattern.fullmatch(name)]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            found = os.fstat(fd)
            if not S_ISREG(found.st_mode) or time.time() - found.st_mtime < STALE_TEMP_SECONDS:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError: a writer holds it
            if os.lstat(path).st_ino == found.st_ino:
                os.unlink(path)
        except OSError:
            continue
        finally:
            os.close(fd)


#: What to do when a store refused a whole file's upload (a 403 is a PermissionError: not the
#: local disk's permissions).
REMOTE_WRITE_ADVICE = ("check the endpoint, the credentials and that the bucket exists and may "
                       "be written, then retry")


def _what_to_do(err: int | None) -> str:
    """The advice for a failed write, by its errno."""
    if err == errno.EFBIG:
        return ("the file passes a file-size limit (the process's, ulimit -f, or the "
                "filesystem's largest file); raise the limit or write elsewhere, then retry")
    if err == errno.ENAMETOOLONG:
        return "shorten the file's name or its path, then retry"
    return "free space or fix permissions and retry"


@contextlib.contextmanager
def atomic_write(path: PathLike, storage_options: StorageOptions = None,
                 mode: int | None = None) -> Iterator[IO[bytes]]:
    """Yield a seekable binary file; on success it becomes ``path`` atomically, on error it is
    removed and ``path`` is untouched. A URL's file is a local temporary one, put whole at the
    end (``sinks.open_sink`` streams to S3 instead). ``mode``: a local file's permission bits
    (the command line passes its input's, as gzip and zstd do), set before the file appears;
    by default what ``open()`` gives."""
    remote = is_url(path)
    target = os.fspath(path) if remote else local_path(path)
    directory = tempfile.gettempdir() if remote else (os.path.dirname(os.path.abspath(target)))
    base = os.path.basename(target.rstrip("/")) or "checkpoint"
    prefix = temp_prefix(directory, base)
    if not remote:
        remove_dead_writes(directory, prefix)
    temp = ""
    try:  # from before mkstemp: an interrupt as it returns must not leave its file behind
        try:
            fd, temp = tempfile.mkstemp(prefix=prefix, dir=directory)
            with contextlib.suppress(OSError):  # held until the write ends: the file is live
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            advice = (_what_to_do(exc.errno) if exc.errno == errno.ENAMETOOLONG else
                      "check that the directory exists and is writable, and that the disk is "
                      "not full")
            raise Error(f"{target}: cannot create a file in {directory}: {exc.strerror}; "
                        f"{advice}") from exc
        with os.fdopen(fd, "w+b") as handle:
            # mkstemp makes 0600; match open(), or the mode asked for
            os.fchmod(handle.fileno(), 0o666 & ~_umask() if mode is None else mode)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if remote:
            fs, remote_path = filesystem(target, storage_options)
            try:
                fs.put_file(temp, remote_path)
            except Exception as exc:
                if isinstance(exc, OSError):
                    raise
                raise Error(f"{target}: upload failed ({type(exc).__name__}: {exc}); the previous "
                            f"object, if any, is intact; check the endpoint and the credentials, "
                            f"then retry") from exc
            os.unlink(temp)
        else:
            os.replace(temp, target)
            _fsync_dir(directory)
    except BaseException as exc:
        if temp or not isinstance(exc, Error):  # an Error before mkstemp returned: nothing made
            remove_temp(directory, prefix, temp)
        if isinstance(exc, OSError):
            raise Error(
                f"{target}: write failed ({exc.strerror or exc}); nothing was written and the "
                f"previous file, if any, is intact; "
                f"{REMOTE_WRITE_ADVICE if remote else _what_to_do(exc.errno)}"
            ) from exc
        raise


class Directory(Protocol):
    """Where a CheckpointManager keeps its files: a local directory or a bucket prefix, held by
    this manager alone for as long as it is open."""

    #: The absolute path or the URL, for messages and for the files' own names.
    location: str

    def join(self, name: str) -> str:
        """The path or URL of the file ``name`` in it."""
        ...

    def listing(self) -> dict[str, tuple[Any, ...]]:
        """Its files by path or URL, each with a stamp that changes whenever the file does."""
        ...

    def stamp(self, path: str) -> tuple[Any, ...] | None:
        """The stamp of one file (None: it does not exist)."""
        ...

    def remove(self, path: str) -> None: ...

    def check(self) -> None:
        """Raise if this manager no longer holds the directory (a lease that ran out)."""
        ...

    def writing(self, path: str) -> contextlib.AbstractContextManager[None]:
        """The context of a save to ``path``: on a bucket, the save completes only while this
        manager holds the prefix and the object is what it was now (``objstore.CommitGuard``)."""
        ...

    def close(self) -> None:
        """Release the directory."""
        ...


class LocalDirectory:
    """A local directory, held with an exclusive ``flock`` on ``.ckptzip.lock``: the kernel drops
    it when the holder dies, so no stale lock outlives a process. Temporary files a crashed
    writer left are removed on opening (the lock is held: nobody else writes)."""

    def __init__(self, path: str) -> None:
        self.location = os.path.abspath(path)
        try:
            os.makedirs(self.location, exist_ok=True)
        except OSError as exc:
            raise Error(f"{self.location}: cannot create the checkpoint directory "
                        f"({exc.strerror or exc}); pick a directory this process may write") from exc
        self._fd = self._lock()
        try:
            self._remove_stale_temp_files()
        except BaseException:
            os.close(self._fd)
            raise

    def _lock(self) -> int:
        path = os.path.join(self.location, LOCK_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise Error(f"{path}: cannot open the directory's lock file ({exc.strerror or exc}); "
                        f"the manager needs write access to {self.location}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if holder == str(os.getpid()):
                raise Error(
                    f"{self.location}: a CheckpointManager of this process holds this directory; "
                    f"close() it first (or open managers in a with block, which closes them)"
                ) from None
            raise Error(
                f"{self.location}: another CheckpointManager (process {holder}) is writing this "
                f"directory; close it first, or give this run its own directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _remove_stale_temp_files(self) -> None:
        for name in os.listdir(self.location):
            if TEMP_MARKER in name:
                try:
                    os.remove(os.path.join(self.location, name))
                except OSError as exc:
                    raise Error(f"{self.location}: cannot remove the stale temporary file {name} "
                                f"({exc.strerror or exc}); remove it by hand") from exc

    def join(self, name: str) -> str:
        return os.path.join(self.location, name)

    def listing(self) -> dict[str, tuple[Any, ...]]:
        """The regular files of the directory, by path, with their stamps (a FIFO named like a
        step would block the read of its header; an entry that cannot be looked at, a link in
        a loop, is not a checkpoint either)."""
        try:
            names = os.listdir(self.location)
        except OSError as exc:
            raise Error(f"{self.location}: cannot list the directory ({exc.strerror or exc}); "
                        f"was it removed or unmounted? Put it back, or open a manager on "
                        f"another") from None
        found = {}
        for name in names:
            path = self.join(name)
            stamp = self.stamp(path)
            if stamp is not None:
                found[path] = stamp
        return found

    def stamp(self, path: str) -> tuple[Any, ...] | None:
        """Size and mtime of a regular file; None for anything else, or nothing."""
        try:
            stat = os.stat(path)
        except OSError:  # gone, a link in a loop, no permission: not a checkpoint of ours
            return None
        if not S_ISREG(stat.st_mode):
            return None
        return (stat.st_size, stat.st_mtime_ns)

    def remove(self, path: str) -> None:
        os.remove(path)

    def check(self) -> None:
        """A flock is held until released: nothing to check."""

    def writing(self, path: str) -> contextlib.AbstractContextManager[None]:
        """A flock is held until released, and the kernel's: nothing to guard."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Release the lock, for every process sharing its descriptor too (a DataLoader's
        workers forked while the manager was open hold a copy: closing ours alone would keep
        the lock until they exit), then close it."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1

    def __del__(self) -> None:
        # a manager dropped unclosed (a notebook cell run again, a loop that raised) kept the
        # directory locked for the rest of the process; released when collected, with a
        # ResourceWarning, as an unclosed file is
        if getattr(self, "_fd", -1) >= 0:
            warnings.warn(f"unclosed CheckpointManager directory {self.location!r}: close() the "
                          f"manager, or use it in a with block", ResourceWarning, stacklevel=2)
            self.close()


class ObjectDirectory:
    """A prefix of an object store (``s3://bucket/run3``), held with a :class:`~ckptzip.objstore.Lease`
    on ``<prefix>/.ckptzip.lock``. Uploads a killed writer left unfinished under the prefix are
    aborted on opening (the lease is held: nobody else writes)."""

    def __init__(self, url: str, storage_options: StorageOptions = None,
                 lease_seconds: float | None = None) -> None:
        self.location = url.rstrip("/")
        self.store, self.path = ObjectStore.open(self.location, storage_options)
        lock = self.join(LOCK_NAME)
        self.lease = Lease(self.store, f"{self.path}/{LOCK_NAME}", lock,
                           *(() if lease_seconds is None else (lease_seconds,)))
        self.lease.acquire()
        try:
            self.store.abort_uploads(self.path)
        except Exception as exc:
            self.lease.release()
            raise Error(f"{self.location}: cannot list or abort unfinished uploads under the prefix "
                        f"({type(exc).__name__}: {exc}); the manager needs that permission") from exc

    def join(self, name: str) -> str:
        return f"{self.location}/{name}"

    def listing(self) -> dict[str, tuple[Any, ...]]:
        try:
            entries = self.store.listing(self.path)
        except Exception as exc:
            raise Error(f"{self.location}: cannot list the prefix ({type(exc).__name__}: {exc}); "
                        f"check the endpoint and the credentials") from exc
        return {self.join(name): stamp for name, stamp in entries.items()}

    def stamp(self, path: str) -> tuple[Any, ...] | None:
        try:
            return self.store.stamp(self.store.path_of(path))
        except Exception as exc:
            raise Error(f"{path}: cannot stat ({type(exc).__name__}: {exc}); check the endpoint "
                        f"and the credentials") from exc

    def remove(self, path: str) -> None:
        self.lease.check()
        try:
            self.store.remove(self.store.path_of(path))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise Error(f"{path}: cannot delete ({type(exc).__name__}: {exc}); the manager needs "
                        f"delete access to {self.location}") from exc

    def check(self) -> None:
        self.lease.check()

    def writing(self, path: str) -> contextlib.AbstractContextManager[None]:
        if not isinstance(self.store, S3Store):  # other stores put a file whole, unconditionally
            return contextlib.nullcontext()
        where = self.store.path_of(path)
        try:
            etag = self.store.etag(where)
        except Exception as exc:
            raise Error(f"{path}: cannot stat ({type(exc).__name__}: {exc}); check the endpoint "
                        f"and the credentials") from exc
        lease = self.lease  # not self: an event loop's copy of the context may outlive the save
        return commit_guard(CommitGuard(where, lambda: lease.check(), etag))

    def close(self) -> None:
        self.lease.release()

    def __del__(self) -> None:
        # a manager dropped unclosed kept renewing its lease for the rest of the process, and
        # every new manager on the prefix was refused naming this process; released when
        # collected, with a ResourceWarning, as a local directory's lock is
        lease = getattr(self, "lease", None)
        if lease is not None and lease.tag is not None:
            warnings.warn(f"unclosed CheckpointManager prefix {self.location!r}: close() the "
                          f"manager, or use it in a with block", ResourceWarning, stacklevel=2)
            with contextlib.suppress(Exception):  # a store gone: the lease runs out by itself
                self.close()


def open_directory(location: PathLike, storage_options: StorageOptions = None,
                   lease_seconds: float | None = None) -> Directory:
    """A CheckpointManager's directory (a local path) or bucket prefix (a URL), held."""
    if is_url(location):
        return ObjectDirectory(os.fspath(location), storage_options, lease_seconds)
    return LocalDirectory(local_path(location))
