"""8 managers race to take over one expired lease (If-Match on its ETag): exactly one may win."""
import json, threading, time, sys
from common import server
import ckptzip
from ckptzip.objstore import Lease, ObjectStore
bad = 0
with server("race") as s:
    b = s.bucket(); opts = s.storage_options(retries=1); fs = s.filesystem()
    for trial in range(10):
        path = f"{b}/run{trial}/.ckptzip.lock"
        fs.pipe(path, json.dumps({"owner": "dead", "host": "h", "pid": 1, "expires": time.time() - 5}).encode())
        won, refused = [], []
        barrier = threading.Barrier(8)
        def go():
            store, _ = ObjectStore.open(f"s3://{path}", opts)
            lease = Lease(store, path, f"s3://{path}", 30)
            barrier.wait()
            try:
                lease.acquire(); won.append(lease)
            except ckptzip.Error as e:
                refused.append(str(e))
        ts = [threading.Thread(target=go) for _ in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print(f"trial {trial}: {len(won)} won, {len(refused)} refused")
        if len(won) != 1: bad += 1
        for l in won: l.release()
sys.exit(1 if bad else 0)
