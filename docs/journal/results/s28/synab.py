import sys, os, time, statistics, torch, ckptzip
torch.set_num_threads(1)
build = sys.argv[1]; d = "/tmp/s28/synab"
key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
raw = sum(t.numel() * 4 for t in [*second["model"].values()]) * 3
out = []
for mode in ("bitsnap", "adaptive", "excp"):
    ts = []
    for i in range(2):
        t = time.perf_counter(); ckptzip.save(second, os.path.join(d, f"x-{build}.ckz"), mode=mode, base=key, threads=2, resumed=True); ts.append(time.perf_counter() - t)
    out.append(f"{mode} {min(ts):.2f}-{max(ts):.2f}s")
print(build, " | ".join(out), flush=True)
