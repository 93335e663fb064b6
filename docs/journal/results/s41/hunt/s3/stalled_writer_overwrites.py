"""A manager stalled (SIGSTOP) inside a save (a checkpoint under 8 MiB: one PutObject at the end) for longer than its lease; a second
manager takes over, restores step 1 and saves steps 2 and 3. The first one, resumed, completes
its upload of step 2 over the new holder's step 2: the new holder's step 3 (a delta on its own
step 2) no longer restores. Docs promise only 'an extra step-N.ckz, complete and valid, among its
own'."""
import json, os, signal, subprocess, sys, textwrap, time, torch
from common import server
import ckptzip

CHILD = textwrap.dedent("""
    import os, sys, json, signal, concurrent.futures, torch
    os.environ["CKPTZIP_MALLOC"] = "system"
    import ckptzip
    from ckptzip.objstore import MultipartUpload
    prefix, options, marker = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    m = ckptzip.CheckpointManager(prefix, async_save=False, lease_seconds=3, storage_options=options)
    m.save(1, {"w": torch.zeros(1000)})
    commit = MultipartUpload.commit
    def stalling_commit(self, first):
        # the state is coded; the one PUT of a checkpoint under 8 MiB is about to go
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)   # a stall: GC pause, swap, a debugger, a VM freeze
        commit(self, first)
    MultipartUpload.commit = stalling_commit
    torch.manual_seed(1)
    m.save(2, {"w": torch.randn(500_000)})
    print("A: save of step 2 returned normally after the stall", flush=True)
    try:
        m.save(3, {"w": torch.ones(1000)})
        print("A: step 3 saved too", flush=True)
    except ckptzip.Error as e:
        print("A: step 3 refused:", e, flush=True)
    m.close()
""")

with server("stall") as s:
    b = s.bucket()
    prefix = f"s3://{b}/run"
    opts = s.storage_options(retries=1)
    marker = f"/tmp/hunt41/s3/marker-{b}"
    a = subprocess.Popen([sys.executable, "-c", CHILD, prefix, json.dumps(opts), marker],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not os.path.exists(marker):
        assert a.poll() is None, a.stdout.read()
        time.sleep(0.1)
    time.sleep(0.5)
    print("A stopped inside its save of step 2; waiting past its 3 s lease")
    deadline = time.time() + 30
    while True:
        try:
            B = ckptzip.CheckpointManager(prefix, async_save=False, storage_options=opts)
            break
        except ckptzip.Error as e:
            assert time.time() < deadline, e
            time.sleep(0.5)
    print("B took the prefix over; steps", B.steps())
    B.restore(1)
    torch.manual_seed(7)
    b2 = {"w": torch.randn(200_000)}
    b3 = {"w": b2["w"].clone()}
    b3["w"][:10] += 1.0   # a small update: step 3 is a delta on step 2
    B.save(2, b2)
    B.save(3, b3)
    print("B saved steps 2 and 3; steps", B.steps())
    with ckptzip.open(f"{prefix}/step-00000003.ckz", storage_options=opts) as c:
        print("step 3's base:", c.header.base)
    os.kill(a.pid, signal.SIGCONT)
    out, _ = a.communicate(timeout=300)
    print("A output:", out.strip())
    steps = B.steps()
    print("B.steps() after A resumed:", steps)
    lost = False
    try:
        got = B.restore(3)
        print("restore(3) ok, equal:", torch.equal(got["w"], b3["w"]))
        lost = not torch.equal(got["w"], b3["w"])
    except ckptzip.Error as e:
        print("restore(3) FAILED:", e)
        lost = True
    got2 = ckptzip.load(f"{prefix}/step-00000002.ckz", storage_options=opts)
    print("step-2 object now holds", tuple(got2["w"].shape), "(B wrote (200000,))")
    B.close()
    os.unlink(marker)
    if lost:
        print("PROBLEM: B's step 3 is lost: A's stalled save replaced B's step 2 after losing its lease")
        sys.exit(1)
