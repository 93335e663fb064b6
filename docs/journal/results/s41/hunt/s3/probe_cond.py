from common import server
import ckptzip
from ckptzip.objstore import ObjectStore
with server("cond") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    store, p = ObjectStore.open(f"s3://{b}/x", opts)
    t1 = store.create(p, b"one"); print("create", t1)
    print("create again (should be None)", store.create(p, b"two"))
    print("replace with wrong tag (should be None)", store.replace(p, b"three", '"deadbeef"'))
    print("content", store.get(p))
    store.delete(p, '"deadbeef"')
    print("after delete with wrong tag (should still exist)", store.get(p))
