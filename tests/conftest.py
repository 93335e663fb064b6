"""Fixtures shared by the test files: a real S3 server (SeaweedFS) for the object-storage tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .s3server import SeaweedS3, unavailable_reason


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS S3 server for the session, on 127.0.0.1 and free ports, stopped at the end.
    Tests take a bucket of their own with ``s3_server.bucket()``."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no S3 server for this test: {reason}")
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
