import time, torch, concurrent.futures as cf
from common import server
import ckptzip

with server("survey3") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    data = ckptzip.dumps({"w": torch.arange(10.0)})
    t = time.time()
    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda i: fs.pipe(f"{b}/run/step-{i:08d}.ckz", data), range(1, 1101)))
    print("made 1100 objects", time.time() - t)
    t = time.time()
    c = fs.call_s3
    for i in range(1100):
        c("create_multipart_upload", Bucket=b, Key=f"run/u{i:05d}.ckz")
    print("made 1100 uploads", time.time() - t)
    pg = c("list_multipart_uploads", Bucket=b, Prefix="run/")
    print("first page:", len(pg.get("Uploads") or []), "truncated", pg.get("IsTruncated"), pg.get("NextKeyMarker"), pg.get("NextUploadIdMarker"))
    t = time.time()
    m = ckptzip.CheckpointManager(f"s3://{b}/run", storage_options=opts)
    print("manager open", time.time() - t)
    left = []
    req = {"Bucket": b, "Prefix": "run/"}
    pg = c("list_multipart_uploads", **req)
    print("uploads left after manager start (first page):", len(pg.get("Uploads") or []), pg.get("IsTruncated"))
    t = time.time()
    steps = m.steps()
    print("steps:", len(steps), steps[:2], steps[-2:], time.time() - t)
    m.close()
    bad = len(steps) != 1100 or len(pg.get("Uploads") or []) != 0
    raise SystemExit(1 if bad else 0)
