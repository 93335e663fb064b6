"""A manager process SIGSTOPped between saves for longer than its lease; B takes over; A is
resumed: A must refuse to save, and its close must leave B's lease in place."""
import json, os, signal, subprocess, sys, textwrap, time, torch
from common import server
import ckptzip
CHILD = textwrap.dedent("""
    import os, sys, json, signal, time, torch
    import ckptzip
    prefix, options, marker = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    m = ckptzip.CheckpointManager(prefix, async_save=True, keep_last=1, lease_seconds=3, storage_options=options)
    m.save(1, {"w": torch.zeros(1000)}); m.wait()
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.5)   # let the renew thread run too
    try:
        m.save(5, {"w": torch.ones(1000)}); m.wait()
        print("A: saved step 5 AFTER LOSING THE LEASE", flush=True)
    except ckptzip.Error as e:
        print("A: refused:", str(e)[:160], flush=True)
    try:
        m.close(); print("A: closed", flush=True)
    except ckptzip.Error as e:
        print("A: close raised:", str(e)[:160], flush=True)
""")
bad = []
with server("stopidle") as s:
    b = s.bucket(); prefix = f"s3://{b}/run"; opts = s.storage_options(retries=1)
    fs = s.filesystem()
    marker = f"/tmp/hunt41/s3/marker-{b}"
    a = subprocess.Popen([sys.executable, "-c", CHILD, prefix, json.dumps(opts), marker], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"})
    while not os.path.exists(marker):
        assert a.poll() is None, a.stdout.read()
        time.sleep(0.1)
    t0 = time.time()
    while True:
        try:
            B = ckptzip.CheckpointManager(prefix, async_save=False, keep_last=1, storage_options=opts); break
        except ckptzip.Error as e:
            assert time.time() - t0 < 30, e; time.sleep(0.3)
    print(f"B took over after {time.time()-t0:.1f} s")
    B.save(2, {"w": torch.full((1000,), 2.0)})
    lock_before = fs.cat(f"{b}/run/.ckptzip.lock")
    os.kill(a.pid, signal.SIGCONT)
    out, _ = a.communicate(timeout=120)
    print(out.strip())
    try:
        lock_after = fs.cat(f"{b}/run/.ckptzip.lock")
    except FileNotFoundError:
        lock_after = None
    print("B's lease intact:", lock_after == lock_before)
    if lock_after != lock_before: bad.append("lease")
    if "AFTER LOSING" in out: bad.append("A saved")
    B.save(3, {"w": torch.full((1000,), 3.0)})
    print("B steps:", B.steps(), "objects:", [p.rsplit('/',1)[-1] for p in fs.ls(f"{b}/run", refresh=True)])
    try:
        ckptzip.CheckpointManager(prefix, storage_options=opts).close(); bad.append("third manager admitted")
    except ckptzip.Error as e:
        print("third manager refused: ok")
    B.close()
    os.unlink(marker)
print("PROBLEMS:", bad); sys.exit(1 if bad else 0)
