"""A CheckpointManager dropped without close() (a notebook cell run again, a loop that raised):
on a local directory its lock is released when it is collected (LocalDirectory.__del__, with a
ResourceWarning); on a bucket prefix the lease's renewal thread keeps renewing it for the life of
the process, so every new manager on the prefix is refused, naming this very process, and the
old manager cannot be reached to close it."""
import gc, os, sys, time, warnings, torch
from common import server
import ckptzip
bad = False
with server("dropped") as s:
    b = s.bucket(); opts = s.storage_options(retries=1)
    d = f"/tmp/hunt41/s3/localrun-{b}"
    for where in (d, f"s3://{b}/run"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = ckptzip.CheckpointManager(where, async_save=False, lease_seconds=2, storage_options=opts)
            m.save(1, {"w": torch.zeros(10)})
            del m          # the cell is run again: the old object is gone, never closed
            gc.collect()
        time.sleep(5)      # over twice the lease
        try:
            ckptzip.CheckpointManager(where, lease_seconds=2, storage_options=opts).close()
            print(f"{where}: a new manager opens")
        except ckptzip.Error as e:
            print(f"{where}: new manager REFUSED: {e}")
            bad = True
    import shutil; shutil.rmtree(d, ignore_errors=True)
sys.exit(1 if bad else 0)
