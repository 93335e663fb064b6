import sys, time, os, threading
import ckptzip, torch
import ckptzip.writer as W, ckptzip.sinks as S
torch.set_num_threads(1)
d = "/tmp/s31/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
mode = sys.argv[1]; threads = int(sys.argv[2])
ev = []
def wrap(obj, name, tag):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); ev.append((tag, t, time.perf_counter())); return r
    setattr(obj, name, g)
wrap(W, "prepare", "prepare"); wrap(W, "_encode_task", "task"); wrap(W, "finish_header", "hdr")
for cls in {type(x) for x in vars(S).values() if isinstance(x, type)}:
    pass
wrap(S.FileSink, "write", "write"); wrap(S.FileSink, "finish", "finish")
for rep in range(4):
    ev.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "tail.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    t1 = time.perf_counter()
    out = []
    for tag in ("prepare", "task", "write", "hdr", "finish"):
        es = [e for e in ev if e[0] == tag]
        if es: out.append(f"{tag}x{len(es)} {min(e[1] for e in es)-t0:.3f}-{max(e[2] for e in es)-t0:.3f} busy {sum(e[2]-e[1] for e in es):.3f}")
    print(f"total {t1-t0:.3f} | " + " | ".join(out), flush=True)
