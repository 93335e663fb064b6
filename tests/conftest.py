"""Fixtures shared by the test files: a real S3 server (SeaweedFS) for the object-storage tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .s3server import SeaweedS3, unavailable_reason

# the command line tunes glibc's malloc for its own process (ckptzip.allocator); tests call it
# in pytest's process, whose allocator (and the memory tests' RSS) must stay the system's
os.environ.setdefault("CKPTZIP_MALLOC", "system")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS S3 server for the session, on 127.0.0.1 and free ports, stopped at the end.
    Tests take a bucket of their own with ``s3_server.bucket()``."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no S3 server for this test: {reason}")
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
