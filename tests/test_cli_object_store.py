"""The command line writing to object storage when the store will not answer: an endpoint with
nothing listening, one that refuses the credentials (403), and a role that may write but not
read. Each is a ``ckptzip: error:`` line naming the URL, never a traceback; ``-f`` asks the
store nothing before the write, so a write-only role can use the command line."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

import ckptzip
from ckptzip.cli import main as cli_main

from .s3server import SeaweedS3

ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                 b"<Message>Access Denied</Message></Error>")


def _deny(handler: BaseHTTPRequestHandler) -> None:
    """Answer 403 AccessDenied at once, as S3 does for a request it refuses."""
    length = int(handler.headers.get("Content-Length") or 0)
    if length and "100-continue" not in (handler.headers.get("Expect") or "").lower():
        handler.rfile.read(length)
    body = b"" if handler.command == "HEAD" else ACCESS_DENIED
    handler.close_connection = True
    handler.send_response(403)
    handler.send_header("Content-Type", "application/xml")
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


class _Refusing(BaseHTTPRequestHandler):
    """An endpoint that answers every request 403, as S3 does for unknown credentials."""

    protocol_version = "HTTP/1.1"

    def handle_expect_100(self) -> bool:
        return True  # the final status at once, without the 100 Continue

    def refuse(self) -> None:
        _deny(self)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = refuse

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def refusing_endpoint() -> Iterator[str]:
    server, endpoint = _serve(_Refusing)
    yield endpoint
    server.shutdown()
    server.server_close()


def _closed_endpoint() -> str:
    """A loopback port with nothing listening: every connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class WriteOnlyProxy:
    """An endpoint in front of the S3 server for a role that may write but not read (an IAM
    policy with s3:PutObject alone): HEAD and GET are refused with 403, the other requests
    are relayed. ``reads`` counts the requests refused."""

    def __init__(self, target_port: int) -> None:
        proxy = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def relay(self) -> None:
                if self.command in ("GET", "HEAD"):
                    proxy.reads += 1
                    _deny(self)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {key: value for key, value in self.headers.items()
                           if key.lower() not in ("expect", "connection")}  # Host stays: signed
                connection = http.client.HTTPConnection("127.0.0.1", target_port, timeout=60)
                try:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    reply = connection.getresponse()
                    data = reply.read()
                finally:
                    connection.close()
                self.send_response(reply.status)
                for key, value in reply.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = relay

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.reads = 0
        self.server, self.endpoint = _serve(Relay)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def write_only(s3_server: SeaweedS3) -> Iterator[WriteOnlyProxy]:
    proxy = WriteOnlyProxy(s3_server.ports["s3"])
    yield proxy
    proxy.close()


def _options(endpoint: str) -> list[str]:
    return [f"--storage-option=client_kwargs.endpoint_url={endpoint}",
            "--storage-option=key=ckptzip", "--storage-option=secret=ckptzip-secret",
            "--storage-option=config_kwargs.retries.max_attempts=1", "-q"]


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A torch.save file to compress and a .ckz to decompress."""
    torch.manual_seed(3)
    source = tmp_path / "state.pt"
    torch.save({"w": torch.randn(1000), "step": 7}, source)
    packed = tmp_path / "packed.ckz"
    ckptzip.save({"w": torch.randn(500)}, str(packed))
    return source, packed


def _commands(source: Path, packed: Path, bucket: str) -> list[tuple[list[str], str]]:
    """Each command that writes to a URL, with its output's URL."""
    return [(["compress", str(source), "-o", f"s3://{bucket}/state.ckz"], f"s3://{bucket}/state.ckz"),
            (["decompress", str(packed), "-o", f"s3://{bucket}/packed.pt"], f"s3://{bucket}/packed.pt")]


def _refused_cleanly(capsys: pytest.CaptureFixture[str], argv: list[str], url: str) -> str:
    """Run ``argv`` (an exception escaping main fails the test: a traceback); the error line."""
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith(f"ckptzip: error: {url}: ")]
    assert lines, err
    return lines[0]


@pytest.mark.parametrize("store", ["nothing listening", "403 for every request"])
def test_an_output_the_store_cannot_say_exists_is_a_clean_error(
    store: str, refusing_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = _closed_endpoint() if store == "nothing listening" else refusing_endpoint
    source, packed = _inputs(tmp_path)
    for argv, url in _commands(source, packed, "bucket"):
        line = _refused_cleanly(capsys, [*argv, *_options(endpoint)], url)
        assert "cannot check whether it exists" in line
        assert "endpoint" in line and "credentials" in line and "pass -f" in line


@pytest.mark.parametrize("store", ["nothing listening", "403 for every request"])
def test_with_f_an_unreachable_store_fails_the_write_itself_cleanly(
    store: str, refusing_endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = _closed_endpoint() if store == "nothing listening" else refusing_endpoint
    source, packed = _inputs(tmp_path)
    for argv, url in _commands(source, packed, "bucket"):
        line = _refused_cleanly(capsys, [*argv, "-f", *_options(endpoint)], url)
        assert "cannot check whether it exists" not in line  # no check asked: the write failed
        assert "previous" in line and "intact" in line
        assert "credentials" in line and "free space" not in line  # the store's, not a disk's


def test_a_write_only_role_writes_with_f_and_is_told_so_without_it(
    s3_server: SeaweedS3, write_only: WriteOnlyProxy, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3_server.bucket()
    source, packed = _inputs(tmp_path)
    torch.manual_seed(4)
    large = tmp_path / "large.pt"  # about 11 MB stored: a multipart upload
    torch.save({"w": torch.randn(3_000_000)}, large)
    commands = [*_commands(source, packed, bucket),
                (["compress", str(large), "-o", f"s3://{bucket}/large.ckz"], f"s3://{bucket}/large.ckz")]
    options = _options(write_only.endpoint)
    for argv, url in commands:
        line = _refused_cleanly(capsys, [*argv, *options], url)
        assert "cannot check whether it exists (PermissionError" in line and "pass -f" in line
    refused = write_only.reads
    for argv, _ in commands:
        assert cli_main([*argv, "-f", *options]) == 0, capsys.readouterr().err
    assert write_only.reads == refused  # -f read nothing from the store
    readable = s3_server.storage_options()
    assert torch.equal(ckptzip.load(f"s3://{bucket}/state.ckz", storage_options=readable)["w"],
                       torch.load(source)["w"])
    assert torch.equal(ckptzip.load(f"s3://{bucket}/large.ckz", storage_options=readable)["w"],
                       torch.load(large)["w"])
    fs = s3_server.filesystem()
    with fs.open(f"{bucket}/packed.pt", "rb") as handle:
        assert torch.equal(torch.load(handle)["w"], ckptzip.load(str(packed))["w"])


def test_compress_verbose_reads_its_output_back_with_the_storage_options(
    s3_server: SeaweedS3, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3_server.bucket()
    source, _ = _inputs(tmp_path)
    url = f"s3://{bucket}/state.ckz"
    options = [option for option in _options(s3_server.endpoint) if option != "-q"]
    assert cli_main(["compress", str(source), "-o", url, "-v", *options]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert f"-> {url}" in err and "  w: float32 1000," in err  # the per-tensor lines, read back
