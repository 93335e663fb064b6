"""A DCP save (ckptzip.dcp.CompressedWriter) to S3 killed mid-upload (SIGKILL, as a preempted
job): its unfinished multipart upload stays (parts stored and billed), and nothing in ckptzip
ever aborts it: not the next DCP save into the same directory, not a CheckpointManager on the
run's prefix (it aborts only uploads directly under its own prefix)."""
import json, os, signal, subprocess, sys, textwrap, time, warnings, torch
warnings.filterwarnings("ignore")
from common import server
import ckptzip
import torch.distributed.checkpoint as dcp
from ckptzip.dcp import CompressedWriter
CHILD = textwrap.dedent("""
    import os, sys, json, signal, concurrent.futures, warnings, torch
    warnings.filterwarnings("ignore")
    import torch.distributed.checkpoint as dcp
    from ckptzip.dcp import CompressedWriter
    from ckptzip.objstore import MultipartUpload
    path, options = sys.argv[1], json.loads(sys.argv[2])
    put = MultipartUpload.put
    def dying_put(self, number, data):
        put(self, number, data)
        if number == 3:
            concurrent.futures.wait(self.pending.values())
            os.kill(os.getpid(), signal.SIGKILL)
    MultipartUpload.put = dying_put
    torch.manual_seed(0)
    dcp.save({"w": torch.randn(6_000_000)}, storage_writer=CompressedWriter(path, storage_options=options))
""")
with server("dcpkill") as s:
    b = s.bucket(); opts = s.storage_options(retries=1); fs = s.filesystem()
    path = f"s3://{b}/run/step-100"
    p = subprocess.run([sys.executable, "-c", CHILD, path, json.dumps(opts)], capture_output=True, text=True,
                       env={**os.environ, "CKPTZIP_MALLOC": "system"}, timeout=300)
    ups = lambda: [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=b).get("Uploads") or []]
    print("child rc", p.returncode, "; unfinished uploads:", ups())
    dcp.save({"w": torch.arange(10.0)}, storage_writer=CompressedWriter(path, storage_options=opts))
    print("after a new DCP save into the same directory:", ups())
    with ckptzip.CheckpointManager(f"s3://{b}/run", storage_options=opts):
        pass
    left = ups()
    print("after a CheckpointManager opened on the run's prefix:", left)
    sys.exit(1 if left else 0)
