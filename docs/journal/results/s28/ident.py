import sys, os, hashlib, torch, ckptzip
torch.set_num_threads(1)
build = sys.argv[1]
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
for mode in ("adaptive", "excp", "bitsnap"):
    for threads in (1, 2):
        p = os.path.join(d, f"id-{build}.ckz")
        ckptzip.save(second, p, mode=mode, base=key, threads=threads, resumed=True)
        print(mode, threads, hashlib.sha256(open(p, "rb").read()).hexdigest()[:16])
