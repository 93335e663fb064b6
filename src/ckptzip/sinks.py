"""Where a save's bytes go: a sink receives the stored chunks in order, then the header, and
puts the header in front (:mod:`ckptzip.storage` holds the sources a load reads from).

:func:`open_sink` picks one for a path: a local file written atomically (:class:`FileSink`), an
S3 multipart upload streamed as it is coded (:class:`StreamSink`), or, for ``dumps``, bytes in
memory (:class:`MemorySink`)."""

from __future__ import annotations

import contextlib
import io
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import IO

from . import _native
from .container import PRELUDE_SIZE, pack_prelude, store_header
from .objstore import MAX_PARTS, PART_BYTES, MultipartUpload, StorageOptions, parts_in_flight
from .parallel import executor
from .storage import atomic_write, remote_upload


class Sink(ABC):
    """Receives the stored chunks in order, then the header."""

    def __init__(self) -> None:
        self.position = 0  # bytes of data section written so far
        self.reserved = 0  # bytes set aside for the header

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        """Hints: ``header_size()`` estimates the stored header's length (a pass over the plans,
        so a sink calls it only if it places the data before the header is done), the data
        will be about ``data_size`` bytes at most, and ``threads`` threads code it."""

    @abstractmethod
    def write(self, data: bytes) -> None: ...

    @abstractmethod
    def finish(self, header: bytes) -> None:
        """Store the header's JSON in front of the data; afterwards ``reserved`` is the size of
        the header as stored."""


class MemorySink(Sink):
    """Builds the container as one bytes object (``_native.Assembler``: huge pages advised).

    Up to ``JOIN_BYTES`` of chunks are kept and copied behind the header at the end into an
    allocation of the exact size, which the allocator serves from its heap, warm when the
    previous result was freed. Beyond that, results are fresh mappings whatever the size asked,
    and keeping the chunks made the allocator map fresh memory for them too on every save (on a
    VM a fresh page's fault costs as long as coding it: 17,500 faults per dumps() of a 43 MB fp32
    state dict): then each chunk is copied into the result as it arrives, behind room for the
    header as estimated, and freed at once. The stored header is padded to that room, as a file
    writer pads it (a few KB on a result of over 16 MiB), and the data moves, in place, only when
    the header outgrows it: moving the 106 MB of a training state took 10 ms of a 200 ms dumps(),
    all of it on one thread.

    With several coding threads, the copies into the result are theirs too: the calling thread
    only sets each chunk's place aside (in order) and hands the copies, in batches, to the pool
    that codes. Copying a 106 MB result into fresh pages took 20-39 ms on the calling thread, a
    serial share that capped how far a save scales over cores.
    """

    #: Chunks kept for a final join, at most (measured: a bf16 GPT's 14 MB joined faults in
    #: nothing, while keeping 16-32 MB of a 36 MB result cost 5,000-8,600 faults per dumps).
    JOIN_BYTES = 16 << 20
    #: Bytes of chunks handed to the pool in one copy job (a job per chunk costs more to submit
    #: than some of its copies take).
    COPY_BATCH_BYTES = 2 << 20

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        self.assembler: _native.Assembler | None = None
        self.data_size = 0
        self.header_size: Callable[[], int] = lambda: 0
        self.header_room = 0
        self.threads = 1
        self.batch: list[tuple[int, bytes]] = []
        self.batch_bytes = 0
        self.copies: list[Future[None]] = []
        self.result = b""

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        self.header_size = header_size  # called only if the result outgrows JOIN_BYTES
        self.data_size = data_size
        self.threads = threads

    def write(self, data: bytes) -> None:
        if self.assembler is None and self.position + len(data) > self.JOIN_BYTES:
            # large: assemble in place from now on (the coding threads run meanwhile)
            self.header_room = self.header_size()
            self.assembler = _native.Assembler(PRELUDE_SIZE + self.header_room,
                                               max(self.data_size, self.JOIN_BYTES))
            parts, self.parts = self.parts, []
            for part in parts:
                self._add(self.assembler, part)
        if self.assembler is not None:
            self._add(self.assembler, data)
        else:
            self.parts.append(data)
        self.position += len(data)

    def _add(self, assembler: _native.Assembler, data: bytes) -> None:
        if self.threads > 1:
            self._place(assembler, data)
        else:
            assembler.append(data)

    def _place(self, assembler: _native.Assembler, data: bytes) -> None:
        """Set data's place aside now, in order, and have the pool copy it there."""
        if assembler.room < len(data):
            self._wait()  # growing moves the buffer: no copy may be running into it
        self.batch.append((assembler.claim(len(data)), data))
        self.batch_bytes += len(data)
        if self.batch_bytes >= self.COPY_BATCH_BYTES:
            self._submit()

    def _submit(self) -> None:
        if self.batch and self.assembler is not None:
            self.copies.append(executor(self.threads).submit(_copy_batch, self.assembler,
                                                             self.batch))
        self.batch, self.batch_bytes = [], 0

    def _wait(self) -> None:
        self._submit()
        copies, self.copies = self.copies, []
        for copy in copies:
            copy.result()

    def finish(self, header: bytes) -> None:
        self._wait()
        stored, flags = store_header(header)
        if self.assembler is not None and len(stored) < self.header_room:
            stored += b" " * (self.header_room - len(stored))  # the data stays where it is
        self.reserved = len(stored)
        head = pack_prelude(stored, flags) + stored
        assembler = self.assembler or _native.Assembler(len(head), self.position)
        for part in self.parts:
            assembler.append(part)
        self.parts = []
        self.result = assembler.finish(head)
        self.assembler = None


def _copy_batch(assembler: _native.Assembler, batch: list[tuple[int, bytes]]) -> None:
    for offset, data in batch:
        assembler.write_at(offset, data)


class FileSink(Sink):
    """Writes chunks into a seekable file, the header in front.

    A file whose data section will take at most ``JOIN_BYTES`` (the writer's bound, at
    :meth:`reserve`: a lossy delta's coded arrays, a small state's raw bytes) is written when the
    header is done: its chunks are kept until then and follow the header exactly, no estimate of
    the header taken, no byte moved. Such files were laid out so before, by moving their data
    once the header was known, and a lossy delta spent 10-30 ms of its save's serial tail on the
    estimate and as long again on the move (BitSnap's k-means tables make the demo GPT's header
    313 KB of JSON).

    Any other file streams its chunks behind a space reserved for the header: the writer's
    estimate of the stored header with a margin, taken when the first chunk arrives (the pool
    coding the next ones meanwhile), so the header is usually padded with spaces (a few KB). If
    the header outgrows it (rare), or if a small file would carry padding (moving its data is
    cheap), the data section is moved once to fit the header exactly.
    """

    #: Files whose data will take at most this much keep it in memory until the header is done.
    JOIN_BYTES = 64 << 20
    #: Files whose data section is at most this large drop their padding: moving them is cheap.
    TRIM_DATA_BYTES = 64 << 20
    #: Padding below this is left in place.
    TRIM_MIN_PADDING = 256
    #: Bytes of data written between two requests to start their writeback (0: none).
    WRITEBACK_BYTES = 8 << 20

    def __init__(self, handle: IO[bytes]) -> None:
        super().__init__()
        self.handle = handle
        self.header_size: Callable[[], int] | None = None
        #: The chunks kept for the header's end (a file of a small data section); None: the data
        #: goes to the file as it comes.
        self.kept: list[bytes] | None = None
        #: Data bytes whose writeback was requested; None once the file cannot take a request.
        self.written_back: int | None = 0

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        self.header_size = header_size
        if data_size <= self.JOIN_BYTES and self.position == 0:
            self.kept = []

    def _place_data(self) -> None:
        """Set the header's room aside: the estimate is taken when the first chunk is to be
        written, while the pool codes the next ones (taken before, it held them all back); the
        chunks kept so far (the data outgrew its bound) go behind it."""
        assert self.header_size is not None
        kept, self.kept = self.kept or [], None
        self.reserved = self.header_size()
        self.header_size = None
        self.handle.seek(PRELUDE_SIZE + self.reserved)
        for data in kept:
            self.handle.write(data)

    def write(self, data: bytes) -> None:
        if self.kept is not None and self.position + len(data) <= self.JOIN_BYTES:
            self.kept.append(data)
            self.position += len(data)
            return
        if self.header_size is not None:
            self._place_data()
        self.handle.write(data)
        self.position += len(data)
        if self.written_back is not None and self.WRITEBACK_BYTES and (
                self.position - self.written_back >= self.WRITEBACK_BYTES):
            self._start_writeback()

    def _start_writeback(self) -> None:
        """Ask the kernel to start writing the data written since the last request."""
        assert self.written_back is not None
        try:
            self.handle.flush()
            fd = self.handle.fileno()
        except (OSError, ValueError):  # no descriptor (io.UnsupportedOperation is both)
            self.written_back = None
            return
        start = PRELUDE_SIZE + self.reserved + self.written_back
        if _native.writeback(fd, start, self.position - self.written_back):
            self.written_back = self.position
        else:
            self.written_back = None  # another system, or a file that cannot: fsync does it all

    def finish(self, header: bytes) -> None:
        self.header_size = None  # still set only if no data came: nothing was reserved
        stored, flags = store_header(header)
        kept, self.kept = self.kept, None
        if kept is not None:  # the data follows the header exactly
            self.reserved = len(stored)
        else:
            padding = self.reserved - len(stored)
            trim = padding >= self.TRIM_MIN_PADDING and self.position <= self.TRIM_DATA_BYTES
            if padding < 0 or trim:
                self._move_data(len(stored))
        stored += b" " * (self.reserved - len(stored))
        self.handle.seek(0)
        self.handle.write(pack_prelude(stored, flags))
        self.handle.write(stored)
        for data in kept or ():
            self.handle.write(data)
        self.handle.truncate(PRELUDE_SIZE + self.reserved + self.position)
        self.handle.seek(0, 2)

    def _move_data(self, header_size: int) -> None:
        """Shift the data section so that it starts right after a header of ``header_size``."""
        shift = header_size - self.reserved
        start = PRELUDE_SIZE + self.reserved
        block = 8 << 20
        # copy away from the direction of the shift, so no byte is overwritten before it moves
        offsets = list(range(start, start + self.position, block))
        for offset in reversed(offsets) if shift > 0 else offsets:
            size = min(block, start + self.position - offset)
            self.handle.seek(offset)
            data = self.handle.read(size)
            self.handle.seek(offset + shift)
            self.handle.write(data)
        self.reserved = header_size


class StreamSink(Sink):
    """Streams the container to an object store as it is coded, as a multipart upload.

    The data section goes up in parts as they fill, a few in flight (the upload blocks beyond
    that); its first part stays here until the header is known, and goes up last as part 1,
    behind the prelude and the header. So the header takes its exact size (nothing reserved,
    nothing moved), memory holds a few parts whatever the checkpoint's size, and the object
    appears, whole, only when the upload completes.
    """

    def __init__(self, upload: MultipartUpload) -> None:
        super().__init__()
        self.upload = upload
        self.part_bytes = PART_BYTES
        self.first = bytearray()
        self.buffer = bytearray()
        self.number = 2

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        self.part_bytes = max(PART_BYTES, -(-data_size // (MAX_PARTS - 1)))  # S3's part limit
        self.upload.in_flight = parts_in_flight(threads)

    def write(self, data: bytes) -> None:
        self.position += len(data)
        view = memoryview(data)
        if len(self.first) < self.part_bytes:
            take = self.part_bytes - len(self.first)
            self.first += view[:take]
            view = view[take:]
        self.buffer += view
        while len(self.buffer) >= self.part_bytes:
            part = io.BytesIO()  # owning its bytes: the HTTP client reads it without a copy
            with memoryview(self.buffer) as filled:
                part.write(filled[: self.part_bytes])
            del self.buffer[: self.part_bytes]
            self.upload.put(self.number, part)
            del part
            self.number += 1

    def finish(self, header: bytes) -> None:
        stored, flags = store_header(header)
        self.reserved = len(stored)
        if self.buffer:  # the last part, the only one that may be small
            self.upload.put(self.number, io.BytesIO(self.buffer))
            self.buffer = bytearray()
        first = io.BytesIO(pack_prelude(stored, flags) + stored)
        first.seek(0, io.SEEK_END)
        first.write(self.first)
        self.first = bytearray()
        self.upload.commit(first)


@contextlib.contextmanager
def open_sink(path: str, storage_options: StorageOptions = None,
              mode: int | None = None) -> Iterator[Sink]:
    """The sink of a save to ``path``, all or nothing: a local file (temporary name, fsync,
    rename; ``mode``: its permission bits, see :func:`~ckptzip.storage.atomic_write`), a
    streamed multipart upload on S3 (aborted on failure), or on other fsspec stores a local
    temporary file put whole at the end."""
    upload = remote_upload(path, storage_options)
    if upload is None:
        with atomic_write(path, storage_options, mode) as handle:
            yield FileSink(handle)
        return
    try:
        yield StreamSink(upload)
    except BaseException:
        upload.abort()
        raise
