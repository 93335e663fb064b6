import os, sys, uuid, shutil, contextlib
sys.path.insert(0, "/work/main")
os.environ.setdefault("CKPTZIP_MALLOC", "system")
from tests.s3server import SeaweedS3

@contextlib.contextmanager
def server(name):
    """A fresh SeaweedFS S3 server on 127.0.0.1 (tests/s3server.py), its data removed at the end."""
    d = f"/tmp/hunt41/s3/data-{name}-{uuid.uuid4().hex[:6]}"
    try:
        with SeaweedS3(d) as s:
            yield s
    finally:
        shutil.rmtree(d, ignore_errors=True)
