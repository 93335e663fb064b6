"""docs/DCP.md: a DCP delta's base 'must stay where it is relative to this one: loading finds it
through the relative path in each rank file's header'. On S3 the rank file names its base by
absolute URL (relative_location only relativises within one folder), so a run prefix moved or
copied whole (to another prefix or bucket) does not load once the original is gone, and loading
through the s3a:// spelling is refused."""
import sys, warnings, torch
warnings.filterwarnings("ignore")
from common import server
import ckptzip
import torch.distributed.checkpoint as dcp
from ckptzip.dcp import CompressedWriter, CompressedReader

def st(i):
    torch.manual_seed(0); return {"w": torch.randn(200_000) + i * 1e-3}
bad = []
with server("dcpabs") as s:
    b = s.bucket(); opts = s.storage_options(retries=1); fs = s.filesystem()
    p1, p2 = f"s3://{b}/run/step-1", f"s3://{b}/run/step-2"
    dcp.save(st(1), storage_writer=CompressedWriter(p1, storage_options=opts))
    dcp.save(st(2), storage_writer=CompressedWriter(p2, base=p1, storage_options=opts))
    with ckptzip.open(f"{p2}/__0_0.ckz", storage_options=opts) as c:
        print("rank file's base as named in its header:", c.header.base.path)
        if "://" in (c.header.base.path or ""): bad.append("absolute base")
    # move the run to another prefix, as one would move a local run directory
    fs.copy(f"{b}/run", f"{b}/moved", recursive=True)
    fs.rm(f"{b}/run", recursive=True)
    print("moved:", sorted(p.split(b + "/")[1] for p in fs.find(f"{b}/moved", refresh=True)))
    t = {"w": torch.zeros(200_000)}
    try:
        dcp.load(t, storage_reader=CompressedReader(f"s3://{b}/moved/step-2", storage_options=opts))
        print("moved run loads:", torch.equal(t["w"], st(2)["w"]))
    except BaseException as e:  # DCP wraps a rank's error in CheckpointException (a BaseException)
        print("moved run does not load:", type(e).__name__, str(e).strip().splitlines()[-1][:300])
        bad.append("moved")
    # the same moved on a local disk
    import tempfile, shutil, os
    d = tempfile.mkdtemp(dir="/tmp/hunt41/s3")
    dcp.save(st(1), storage_writer=CompressedWriter(f"{d}/run/step-1"))
    dcp.save(st(2), storage_writer=CompressedWriter(f"{d}/run/step-2", base=f"{d}/run/step-1"))
    shutil.move(f"{d}/run", f"{d}/moved")
    t = {"w": torch.zeros(200_000)}
    dcp.load(t, storage_reader=CompressedReader(f"{d}/moved/step-2"))
    print("the same moved on local disk loads:", torch.equal(t["w"], st(2)["w"]))
    shutil.rmtree(d)
print("PROBLEMS:", bad); sys.exit(1 if bad else 0)
