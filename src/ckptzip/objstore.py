"""Object stores (S3, and whatever else fsspec reaches) as a home for checkpoints.

What ckptzip needs of a store, and how each kind gives it:

* **Ranged reads**, many at once: ``_cat_file(path, start, end)`` of any asynchronous fsspec
  filesystem (s3fs, gcsfs, adlfs, http) runs on fsspec's event loop, so a reader keeps several
  range requests in flight while its threads decode (:class:`ObjectStore.fetch`). Synchronous
  filesystems (``memory://``) read on demand.
* **Streamed, all-or-nothing writes**: on S3 a multipart upload (:class:`MultipartUpload`). Its
  parts go up as they are coded, a few at a time, and the object exists under its name only
  once the upload is completed; a failed save aborts it. Other filesystems have no such thing
  that fsspec exposes: their saves are staged in a local temporary file and put whole
  (``storage.atomic_write``).
* **A lease** for :class:`ckptzip.CheckpointManager` (:class:`Lease`): object stores have no
  ``flock``. On S3 the lease object is created with ``If-None-Match: *`` and renewed, taken over
  or deleted with ``If-Match`` on its ETag, so two managers can never both hold it. Elsewhere the
  same protocol runs without conditional writes, which only detects a second manager.

``storage_options`` are the keyword arguments of the fsspec filesystem, as with pandas, dask or
torch's ``FsspecWriter``: ``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}``
for s3fs. fsspec's own configuration (``FSSPEC_S3_*`` environment variables) applies as well.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, DependencyError, Error

StorageOptions = Mapping[str, Any] | None

#: The S3 limits on multipart uploads: every part but the last at least 5 MiB, 10,000 parts.
MIN_PART_BYTES = 5 << 20
MAX_PARTS = 10_000
#: Parts of a streamed upload: big enough that a request's overhead is small, small enough that
#: a few in flight hold little memory.
PART_BYTES = 8 << 20


def parts_in_flight(threads: int) -> int:
    """Parts uploading at once, at most, for a save coded by ``threads`` threads: one per two
    threads, from 2 to 16 (the writer blocks beyond it, so memory stays a few parts). Each part
    in flight costs about twice its size (the socket's write buffer copies it): on the 2-core
    test machine 4 in flight measured 70-80 MB of extra memory and 2 almost none, at the same
    speed against a local server; a real store's latency wants more on a larger host."""
    return min(16, max(2, threads // 2))

#: What a reader fetches with its first request: the prelude and, for most checkpoints, the
#: whole header (15 KB for a 300-tensor training state), in one round trip.
HEAD_BYTES = 64 << 10

WRITE_ADVICE = ("nothing was written under this name and the previous object, if any, is intact; "
                "check the endpoint, the credentials and that the bucket exists and may be "
                "written, then retry")


def filesystem(url: str, storage_options: StorageOptions = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` made with ``storage_options``, and the path in it."""
    try:
        import fsspec
    except ImportError:
        raise DependencyError(f"{url}: URLs need fsspec: pip install fsspec") from None
    try:
        return fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as exc:
        raise DependencyError(f"{url}: {exc}") from None
    except (TypeError, ValueError) as exc:
        scheme = url.split("://", 1)[0]
        if "Protocol not known" in str(exc):  # fsspec's words for a scheme it has no filesystem of
            lower = f"; did you mean {scheme.lower()}://?" if scheme != scheme.lower() else ""
            raise ConfigError(f"{url}: no filesystem handles the scheme {scheme!r}{lower} (S3 is "
                              f"s3://bucket/key, in lower case)") from None
        raise ConfigError(f"{url}: the filesystem refused its storage_options: {exc}") from None


def _status(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind an exception (s3fs translates botocore's
    errors into OSErrors, keeping the original as the cause)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return (response.get("Error", {}).get("Code"),
                    response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
        seen = seen.__cause__ or seen.__context__
    return None, None


def _precondition_failed(exc: BaseException) -> bool:
    code, status = _status(exc)
    return isinstance(exc, FileExistsError) or code in ("PreconditionFailed", "ConditionalRequestConflict") \
        or status in (409, 412)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ObjectStore:
    """One fsspec filesystem, with what ckptzip needs of it (the generic kind; see
    :class:`S3Store`). Paths are the filesystem's (``bucket/key``), URLs only name things in
    messages."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    @staticmethod
    def open(url: str, storage_options: StorageOptions = None) -> tuple[ObjectStore, str]:
        fs, path = filesystem(url, storage_options)
        try:
            from s3fs import S3FileSystem
        except ImportError:
            return ObjectStore(fs), path
        return (S3Store(fs) if isinstance(fs, S3FileSystem) else ObjectStore(fs)), path

    # -- reading --------------------------------------------------------------------------
    def size(self, path: str, url: str) -> int:
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            raise Error(f"{url}: no such object; check the bucket and the key (a missing "
                        f"bucket reads the same), e.g. by listing the prefix") from None
        except Exception as exc:
            raise Error(f"{url}: cannot stat ({_describe(exc)}); check the endpoint and the "
                        f"credentials") from exc
        if info.get("type") == "directory":
            raise Error(f"{url}: a prefix (directory), not a checkpoint object")
        return int(info["size"])

    @property
    def async_reads(self) -> bool:
        """Whether reads can be in flight while the caller does other work (fsspec's loop)."""
        return bool(getattr(self.fs, "async_impl", False))

    def fetch(self, path: str, start: int, end: int) -> concurrent.futures.Future[bytes]:
        """Bytes ``[start, end)`` of the object: on an asynchronous filesystem a request under
        way, else read now."""
        if self.async_reads:
            return self._submit(self.fs._cat_file(path, start=start, end=end))
        future: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        try:
            future.set_result(self.fs.cat_file(path, start=start, end=end))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.fs.loop)

    # -- listing and removing -------------------------------------------------------------
    def listing(self, path: str) -> dict[str, tuple[Any, ...]]:
        """The objects directly under ``path``, by name, with a stamp that changes whenever
        the object does (size and ETag or modification time)."""
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        return {entry["name"].rstrip("/").rsplit("/", 1)[-1]: self._stamp(entry)
                for entry in entries if entry.get("type") != "directory"}

    def stamp(self, path: str) -> tuple[Any, ...] | None:
        """The stamp of one object, as :meth:`listing` gives it (None: there is none)."""
        self.fs.invalidate_cache(path)
        try:
            return self._stamp(self.fs.info(path))
        except FileNotFoundError:
            return None

    @staticmethod
    def _stamp(entry: dict[str, Any]) -> tuple[Any, ...]:
        return (int(entry.get("size") or 0),
                str(entry.get("ETag") or entry.get("etag") or entry.get("mtime")
                    or entry.get("LastModified") or entry.get("created") or ""))

    def path_of(self, url: str) -> str:
        """The filesystem's path of a URL of this store."""
        return str(self.fs._strip_protocol(url))

    def remove(self, path: str) -> None:
        self.fs.rm_file(path)
        self.fs.invalidate_cache(path)

    def abort_uploads(self, path: str) -> int:
        """Abort unfinished uploads of objects directly under ``path`` (what a killed writer
        leaves); how many. Only S3 has them."""
        return 0

    # -- writing --------------------------------------------------------------------------
    def upload(self, path: str, url: str) -> MultipartUpload | None:
        """A streamed upload to ``path``, or None where this store has none."""
        return None

    # Small objects with a tag to condition on (the lease). Generically the tag is a digest of
    # the content and the checks are not atomic: a second writer is detected, not excluded.
    def create(self, path: str, data: bytes) -> str | None:
        """Write ``data`` at ``path`` unless something is there: its tag, or None."""
        self.fs.invalidate_cache(path)
        if self.fs.exists(path):
            return None
        self.fs.pipe_file(path, data)
        return hashlib.sha256(data).hexdigest()

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The object's content and tag, or None if there is none."""
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def replace(self, path: str, data: bytes, tag: str) -> str | None:
        """Overwrite the object if its tag is still ``tag``: the new tag, or None."""
        current = self.get(path)
        if current is None or current[1] != tag:
            return None
        self.fs.pipe_file(path, data)
        return hashlib.sha256(data).hexdigest()

    def delete(self, path: str, tag: str) -> None:
        """Delete the object if its tag is still ``tag``."""
        current = self.get(path)
        if current is not None and current[1] == tag:
            self.fs.rm_file(path)


#: The least time ckptzip waits for one request to an S3 store before it gives up on it.
MIN_REQUEST_DEADLINE = 300.0


def request_deadline(config: dict[str, Any]) -> float:
    """How long one request may take in all, from botocore's ``Config`` (``config_kwargs``):
    twice its connect and read timeouts over every attempt, at least
    :data:`MIN_REQUEST_DEADLINE` (botocore's defaults: 1,440 s). botocore bounds the wait for
    an answer, but not a request whose body is being sent to a server that stopped reading (a
    PUT to a frozen server hung for good), so ckptzip bounds the whole."""
    found = config.get("retries")
    retries: dict[str, Any] = found if isinstance(found, dict) else {}
    attempts: Any = retries.get("max_attempts", retries.get("total_max_attempts", 5))
    timeouts: list[Any] = [config.get("connect_timeout", 60), config.get("read_timeout", 60)]
    try:
        per_attempt = sum(float(t) for t in timeouts)
        return max(MIN_REQUEST_DEADLINE, 2 * per_attempt * (int(attempts) + 1))
    except (TypeError, ValueError):
        return MIN_REQUEST_DEADLINE * 4


class S3Store(ObjectStore):
    """S3 and S3-compatible stores through s3fs: multipart uploads and conditional writes.
    No request is waited for longer than :func:`request_deadline`."""

    def __init__(self, fs: Any) -> None:
        super().__init__(fs)
        config = getattr(fs, "config_kwargs", None)
        self.deadline = request_deadline(config if isinstance(config, dict) else {})

    def call(self, method: str, **kwargs: Any) -> Any:
        return self.wait(self._submit(self.fs._call_s3(method, **kwargs)))

    def wait(self, future: concurrent.futures.Future[Any]) -> Any:
        """``future.result()``, or a TimeoutError (an OSError: a store's failure, reported as
        such) once :attr:`deadline` has passed, the request cancelled."""
        try:
            return future.result(timeout=self.deadline)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer in {self.deadline:g} s; is the store up and "
                               f"reachable?") from None

    def submit(self, method: str, **kwargs: Any) -> concurrent.futures.Future[Any]:
        return self._submit(self.fs._call_s3(method, **kwargs))

    def _where(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)
        return bucket, key

    def upload(self, path: str, url: str) -> MultipartUpload:
        return MultipartUpload(self, path, url)

    def abort_uploads(self, path: str) -> int:
        bucket, prefix = self._where(path.rstrip("/") + "/")
        aborted = 0
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        while True:
            page = self.call("list_multipart_uploads", **request)
            for upload in page.get("Uploads") or []:
                if "/" not in upload["Key"][len(prefix):]:
                    with contextlib.suppress(FileNotFoundError):  # aborted already
                        self.call("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                                  UploadId=upload["UploadId"])
                    aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            request.update(KeyMarker=page.get("NextKeyMarker"),
                           UploadIdMarker=page.get("NextUploadIdMarker"))

    def create(self, path: str, data: bytes) -> str | None:
        bucket, key = self._where(path)
        try:
            reply = self.call("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except Exception as exc:
            if _precondition_failed(exc):
                return None
            raise
        finally:
            self.fs.invalidate_cache(path)
        return str(reply["ETag"])

    def etag(self, path: str) -> str | None:
        """The object's ETag now (None: there is none)."""
        bucket, key = self._where(path)
        try:
            return str(self.call("head_object", Bucket=bucket, Key=key)["ETag"])
        except FileNotFoundError:
            return None

    def get(self, path: str) -> tuple[bytes, str] | None:
        bucket, key = self._where(path)
        try:
            reply = self.call("get_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        body = reply["Body"]
        try:
            data = self.wait(self._submit(body.read()))
        finally:
            body.close()
        return data, str(reply["ETag"])

    def replace(self, path: str, data: bytes, tag: str) -> str | None:
        bucket, key = self._where(path)
        try:
            reply = self.call("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=tag)
        except (FileNotFoundError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) or _precondition_failed(exc):
                return None
            raise
        return str(reply["ETag"])

    def delete(self, path: str, tag: str) -> None:
        bucket, key = self._where(path)
        try:
            self.call("delete_object", Bucket=bucket, Key=key, IfMatch=tag)
        except OSError as exc:
            if not (isinstance(exc, FileNotFoundError) or _precondition_failed(exc)):
                raise
        finally:
            self.fs.invalidate_cache(path)


@dataclass(frozen=True)
class CommitGuard:
    """What must still hold for a write of the object at ``path`` (a filesystem path) to
    complete: ``check()`` passes (the writer, a manager, still holds its lease) and the object is
    what it was when the save began (``etag``; None: there was none). A manager stalled past its
    lease (a stopped process) must not replace the step the new holder wrote since: the last
    request is conditional on it (``If-Match`` / ``If-None-Match``)."""

    path: str
    check: Callable[[], None]
    etag: str | None


_COMMIT_GUARDS: ContextVar[tuple[CommitGuard, ...]] = ContextVar("ckptzip_commit_guards",
                                                                 default=())


@contextlib.contextmanager
def commit_guard(guard: CommitGuard) -> Iterator[None]:
    """Apply ``guard`` to the writes of its object made in this context (this thread's save)."""
    token = _COMMIT_GUARDS.set((*_COMMIT_GUARDS.get(), guard))
    try:
        yield
    finally:
        _COMMIT_GUARDS.reset(token)


def _guard_of(path: str) -> CommitGuard | None:
    return next((guard for guard in _COMMIT_GUARDS.get() if guard.path == path), None)


class MultipartUpload:
    """One object written as an S3 multipart upload, all or nothing.

    Parts 2, 3, ... go up as they are given, at most ``in_flight`` at once (``put`` blocks
    beyond that, so memory stays a few parts whatever the object's size); part 1 comes
    last, with :meth:`commit`, so that the writer can put the checkpoint's header in front of
    the data it has already sent. Nothing exists under the name until the upload completes;
    :meth:`abort` (on any failure) drops the parts. An object that fits in its first part is
    one PUT instead. Every failure of the store is a :class:`ckptzip.Error` naming the URL.
    """

    def __init__(self, store: S3Store, path: str, url: str) -> None:
        self.store = store
        self.url = url
        self.bucket, self.key = store._where(path)
        self.path = path
        self.upload_id: str | None = None
        self.pending: dict[int, concurrent.futures.Future[Any]] = {}
        self.etags: dict[int, str] = {}
        self.in_flight = parts_in_flight(1)
        #: Bytes sent, and the requests that sent them.
        self.bytes_sent = 0
        self.requests = 0

    def _failed(self, what: str, exc: BaseException) -> Error:
        error = Error(f"{self.url}: {what} failed ({_describe(exc)}); {WRITE_ADVICE}")
        error.__cause__ = exc
        return error

    def put(self, number: int, data: io.BytesIO) -> None:
        """Send part ``number`` (2 or more; at least 5 MiB unless it is the last). A BytesIO
        that owns its buffer: the HTTP client reads it in place (bytes would be copied)."""
        data.seek(0)
        if self.upload_id is None:
            try:
                reply = self.store.call("create_multipart_upload", Bucket=self.bucket, Key=self.key)
            except Exception as exc:
                raise self._failed("starting the upload", exc) from exc
            self.upload_id = str(reply["UploadId"])
        self._settle(self.in_flight - 1)
        self.pending[number] = self.store.submit(
            "upload_part", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
            PartNumber=number, Body=data)
        self.bytes_sent += data.getbuffer().nbytes
        self.requests += 1

    def _settle(self, room: int) -> None:
        """Wait until at most ``room`` parts are in flight; raise the first failure."""
        while len(self.pending) > room:
            done, _ = concurrent.futures.wait(self.pending.values(), timeout=self.store.deadline,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            if not done:
                number = min(self.pending)
                raise self._failed(f"uploading part {number}", TimeoutError(
                    f"no part answered in {self.store.deadline:g} s; is the store up and "
                    f"reachable?"))
            for number, future in list(self.pending.items()):
                if future in done:
                    del self.pending[number]
                    try:
                        self.etags[number] = str(future.result()["ETag"])
                    except Exception as exc:
                        raise self._failed(f"uploading part {number}", exc) from exc

    def commit(self, first: io.BytesIO) -> None:
        """Send part 1 and complete the upload: the object appears, whole (under its
        :class:`CommitGuard`, if one is set: checked just before, and the request conditional)."""
        first.seek(0)
        guard = _guard_of(self.path)
        conditions: dict[str, str] = {}
        try:
            if self.upload_id is not None:
                self.put(1, first)
                self._settle(0)
            if guard is not None:  # just before the object appears
                guard.check()
                conditions = _conditions(guard)
            if self.upload_id is None:
                self.store.call("put_object", Bucket=self.bucket, Key=self.key, Body=first,
                                **conditions)
            else:
                parts = [{"PartNumber": n, "ETag": self.etags[n]} for n in sorted(self.etags)]
                self.store.call("complete_multipart_upload", Bucket=self.bucket, Key=self.key,
                                UploadId=self.upload_id, MultipartUpload={"Parts": parts},
                                **conditions)
                self.requests += 1
        except Error:
            if guard is not None:  # a lost lease says best why (the new holder aborted the upload)
                guard.check()
            raise
        except Exception as exc:
            if guard is not None:
                guard.check()
            if conditions and _precondition_failed(exc):
                raise Error(
                    f"{self.url}: another writer wrote this object since this save began (a "
                    f"manager that took the prefix over after this one's lease ran out?); this "
                    f"save is dropped and that object kept; start a new manager") from exc
            raise self._failed("uploading" if self.upload_id is None else "completing the upload",
                               exc) from exc
        finally:
            self.store.fs.invalidate_cache(self.path)
        if self.upload_id is None:
            self.bytes_sent += first.getbuffer().nbytes
            self.requests += 1

    def abort(self) -> None:
        """Drop whatever was sent (best effort: a manager's start aborts what this leaves)."""
        for future in self.pending.values():
            future.cancel()
        with contextlib.suppress(Exception):
            concurrent.futures.wait(self.pending.values(), timeout=30)
        self.pending.clear()
        if self.upload_id is not None:
            with contextlib.suppress(Exception):
                self.store.call("abort_multipart_upload", Bucket=self.bucket, Key=self.key,
                                UploadId=self.upload_id)
            self.upload_id = None


def _conditions(guard: CommitGuard) -> dict[str, str]:
    """The request's conditions: the object as the save found it."""
    return {"IfNoneMatch": "*"} if guard.etag is None else {"IfMatch": guard.etag}


#: How long a lease lasts without renewal, by default (renewed every third of it).
LEASE_SECONDS = 60.0


class Lease:
    """An exclusive, expiring claim on a prefix of an object store, for one CheckpointManager.

    The lease object holds its holder (a random token, host and pid) and when it expires. It is
    created only where none exists, renewed by a background thread every third of its life, and
    taken over only once expired, each time conditionally on the ETag last seen (S3), so that of
    two managers racing for it exactly one wins. A holder that cannot renew in time (a network
    partition, a process stopped for longer than the lease) has lost it: :meth:`check` then
    raises, and the manager stops writing. The expiry is a wall-clock time: hosts sharing a
    prefix need clocks that agree to well within the lease.
    """

    def __init__(self, store: ObjectStore, path: str, url: str, seconds: float = LEASE_SECONDS) -> None:
        if not seconds > 0:
            raise ConfigError(f"lease_seconds must be positive, not {seconds!r}")
        self.store, self.path, self.url, self.seconds = store, path, url, seconds
        self.token = uuid.uuid4().hex
        self.tag: str | None = None
        self.lost: str | None = None
        #: When the lease written last runs out (counted from before the write was sent).
        self.valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _body(self) -> bytes:
        return json.dumps({"owner": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                           "expires": time.time() + self.seconds}).encode()

    def acquire(self) -> None:
        started = time.time()
        try:
            tag = self.store.create(self.path, self._body())
            if tag is None:
                current = self.store.get(self.path)
                if current is None:  # released in the meantime
                    tag = self.store.create(self.path, self._body())
                else:
                    holder = self._holder(current[0])
                    if holder is not None:
                        raise Error(
                            f"{self.url}: another CheckpointManager ({holder}) holds this prefix; "
                            f"close it first or give this run its own prefix (a holder that died "
                            f"releases it when its lease runs out)"
                        )
                    tag = self.store.replace(self.path, self._body(), current[1])
        except Error:
            raise
        except Exception as exc:
            raise Error(f"{self.url}: cannot take the prefix's lease ({_describe(exc)}); the "
                        f"manager needs read, write and delete access there") from exc
        if tag is None:
            raise Error(f"{self.url}: another CheckpointManager took this prefix's lease just now; "
                        f"give this run its own prefix")
        self.tag = tag
        self.valid_until = started + self.seconds
        self._thread = threading.Thread(target=self._renew, name="ckptzip-lease", daemon=True)
        self._thread.start()

    def _holder(self, body: bytes) -> str | None:
        """Who holds an unexpired lease with this content (None: expired or unreadable)."""
        try:
            record = json.loads(body)
            expires = float(record["expires"])
        except (ValueError, KeyError, TypeError):
            return None
        left = expires - time.time()
        if left <= 0:
            return None
        return f"host {record.get('host')}, process {record.get('pid')}, lease valid {left:.0f} s more"

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            with self._lock:
                if self._stop.is_set() or self.tag is None:
                    return
                started = time.time()
                try:
                    tag = self.store.replace(self.path, self._body(), self.tag)
                except Exception as exc:
                    if time.time() >= self.valid_until:
                        self.lost = f"its lease could not be renewed in time ({_describe(exc)})"
                        return
                    continue
                if tag is None:
                    self.lost = "another manager took its lease over after it expired"
                    self.tag = None
                    return
                self.tag = tag
                self.valid_until = started + self.seconds

    def check(self) -> None:
        """Raise if the lease was lost or has run out (this process was stopped, or the store
        unreachable, for longer than the lease): this manager must not write the prefix any
        more."""
        if self.lost is None and time.time() >= self.valid_until:
            self.lost = "its lease ran out before it was renewed"
        if self.lost is not None:
            raise Error(f"{self.url}: this CheckpointManager no longer holds the prefix: "
                        f"{self.lost}; nothing more is written; start a new manager")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.tag is not None:
                with contextlib.suppress(Exception):
                    self.store.delete(self.path, self.tag)
                self.tag = None
