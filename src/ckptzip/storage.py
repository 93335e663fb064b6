"""Where bytes live: local files (atomic writes, positional reads) and fsspec URLs.

Writes are atomic: data goes to a temporary name in the destination's directory, is fsynced, then
renamed over the destination, and the directory is fsynced. A crash mid-save leaves the previous
file intact and the new one either complete or absent. Remote URLs are staged in a local temporary
file and uploaded whole once complete.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import IO, Any, Protocol

from .errors import DependencyError, Error

TEMP_MARKER = ".ckz-tmp-"

PathLike = str | os.PathLike[str]


def is_url(path: PathLike) -> bool:
    return "://" in os.fspath(path) and not os.fspath(path).startswith("file://")


def local_path(path: PathLike) -> str:
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def _fsspec_fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise DependencyError(f"{url}: URLs need fsspec: pip install fsspec") from None
    return fsspec.core.url_to_fs(url)


class Source(Protocol):
    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes | memoryview: ...

    def read_scratch(self, offset: int, length: int) -> bytes | memoryview:
        """Like ``read``, but the bytes may live in this thread's buffer for the source: valid
        until the thread's next ``read_scratch`` on it (the decoder's chunk spans)."""
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
        try:
            data = os.pread(self.fd, length, offset)
        except OSError as exc:
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
        buffer: bytearray | None = getattr(self._scratch, "buffer", None)
        if buffer is None or len(buffer) < length:
            buffer = self._scratch.buffer = bytearray(max(length, 1 << 20))
        view = memoryview(buffer)[:length]
        done = 0
        while done < length:
            try:
                got = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as exc:
                raise Error(f"{self.name}: read error at byte {offset + done}: {exc.strerror}; "
                            "check the disk or copy") from None
            if got == 0:
                raise Error(
                    f"{self.name}: the file shrank while being read (wanted {length} bytes at "
                    f"{offset}, got {done}); is another process rewriting it?"
                )
            done += got
        return view

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RemoteSource:
    """An fsspec file; reads are serialized because fsspec file objects are not thread-safe."""

    def __init__(self, url: str) -> None:
        fs, path = _fsspec_fs(url)
        self.name = url
        try:
            self.file: IO[bytes] = fs.open(path, "rb")
        except FileNotFoundError:
            raise Error(f"{url}: no such file") from None
        self.size = int(fs.size(path))
        self.lock = threading.Lock()

    def read(self, offset: int, length: int) -> bytes:
        with self.lock:
            self.file.seek(offset)
            data = self.file.read(length)
        if len(data) != length:
            raise Error(f"{self.name}: short read at byte {offset}; the object changed under us")
        return data

    read_scratch = read

    def close(self) -> None:
        self.file.close()


def open_source(path: PathLike) -> Source:
    if is_url(path):
        return RemoteSource(os.fspath(path))
    return FileSource(local_path(path))


def _umask() -> int:
    """The process umask, read without changing it (os.umask can only set it, racing threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem lets us open directories
        fd = os.open(directory or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_write(path: PathLike) -> Iterator[IO[bytes]]:
    """Yield a seekable binary file; on success it becomes ``path`` atomically, on error it is
    removed and ``path`` is untouched."""
    remote = is_url(path)
    target = os.fspath(path) if remote else local_path(path)
    directory = tempfile.gettempdir() if remote else (os.path.dirname(os.path.abspath(target)))
    base = os.path.basename(target.rstrip("/")) or "checkpoint"
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{base}{TEMP_MARKER}", dir=directory)
    except OSError as exc:
        raise Error(
            f"{target}: cannot create a file in {directory}: {exc.strerror}; check that the "
            f"directory exists and is writable, and that the disk is not full"
        ) from exc
    try:
        with os.fdopen(fd, "w+b") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~_umask())  # mkstemp makes 0600; match open()
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if remote:
            fs, remote_path = _fsspec_fs(target)
            fs.put_file(temp, remote_path)
            os.unlink(temp)
        else:
            os.replace(temp, target)
            _fsync_dir(directory)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise Error(
                f"{target}: write failed ({exc.strerror or exc}); nothing was written and the "
                f"previous file, if any, is intact; free space or fix permissions and retry"
            ) from exc
        raise
