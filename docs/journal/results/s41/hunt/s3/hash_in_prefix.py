"""A '#' in an S3 key prefix ("run #1/"): ckptzip's URL comparison (chain._url_key, urlsplit)
drops everything after '#' as a URL fragment, so every object under the prefix compares as the
same object. Effects: (1) a CheckpointManager on the prefix cannot save its second step (refused
as 'saving over its own base'); (2) a valid chain copied there does not load ('the chain loops: the
header is damaged or was crafted'); (3) `ckptzip decompress --rm` removes a base that a delta beside
it is coded against (the dependents check finds none), and the delta no longer loads."""
import os, subprocess, sys, torch
from common import server
import ckptzip
from ckptzip.chain import same_file

problems = []
print("same_file('s3://b/run #1/step-1.ckz', 's3://b/run #1/step-2.ckz') =",
      same_file("s3://b/run #1/step-1.ckz", "s3://b/run #1/step-2.ckz"))
with server("hash") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    torch.manual_seed(0)
    w = torch.randn(100_000)
    # (1) the manager
    try:
        with ckptzip.CheckpointManager(f"s3://{b}/run #1", async_save=False, storage_options=opts) as m:
            m.save(1, {"w": w})
            m.save(2, {"w": w + 1e-3})
        print("manager: saved steps 1 and 2")
    except ckptzip.Error as e:
        print("manager: step 2 refused:", e)
        problems.append("manager")
    # (2) a chain made elsewhere and copied into the prefix (docs: a prefix can be copied whole)
    ckptzip.save({"w": w}, "/tmp/hunt41/s3/work/a.ckz")
    ckptzip.save({"w": w + 1e-3}, "/tmp/hunt41/s3/work/d.ckz", base="/tmp/hunt41/s3/work/a.ckz")
    for name in ("a.ckz", "d.ckz"):
        fs.put(f"/tmp/hunt41/s3/work/{name}", f"{b}/exp #2/{name}")
    D, A = f"s3://{b}/exp #2/d.ckz", f"s3://{b}/exp #2/a.ckz"
    try:
        print("delta loads from the bucket:", torch.equal(ckptzip.load(D, storage_options=opts)["w"], w + 1e-3))
    except ckptzip.Error as e:
        print("a valid chain copied into the '#' prefix does not load:", type(e).__name__, e)
        problems.append("load")
    ep = opts["client_kwargs"]["endpoint_url"]
    so = ["--storage-option", f"client_kwargs.endpoint_url={ep}", "--storage-option", "key=k", "--storage-option", "secret=s"]
    # the same command in a prefix without '#' refuses to remove the base:
    for name in ("a.ckz", "d.ckz"):
        fs.put(f"/tmp/hunt41/s3/work/{name}", f"{b}/exp 2/{name}")
    p = subprocess.run(["/work/main/.venv/bin/ckptzip", "decompress", f"s3://{b}/exp 2/a.ckz", "-o", "/tmp/hunt41/s3/work/a_out.pt", "-f", "--rm", *so],
                       capture_output=True, text=True, env={**os.environ, "CKPTZIP_MALLOC": "system"})
    print("without '#': rc", p.returncode, p.stderr.strip()[-250:], "| base still there:", fs.exists(f"{b}/exp 2/a.ckz"))
    p = subprocess.run(["/work/main/.venv/bin/ckptzip", "decompress", A, "-o", "/tmp/hunt41/s3/work/a_out.pt", "-f", "--rm", *so],
                       capture_output=True, text=True, env={**os.environ, "CKPTZIP_MALLOC": "system"})
    print("with '#':    rc", p.returncode, p.stderr.strip()[-250:], "| base still there:", fs.exists(f"{b}/exp #2/a.ckz"))
    try:
        ckptzip.load(D, storage_options=opts)
        print("delta still loads")
    except ckptzip.Error as e:
        print("delta does not load:", type(e).__name__, str(e)[:200])
    if not fs.exists(f"{b}/exp #2/a.ckz"):
        problems.append("decompress --rm removed a base its delta needs")
print("PROBLEMS:", problems)
sys.exit(1 if problems else 0)
