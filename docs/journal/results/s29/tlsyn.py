import sys, time, os, threading, collections
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
gb = float(sys.argv[1]); mode = sys.argv[2]; threads = int(sys.argv[3])
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
IDLE = {"wait", "get", "_worker", "acquire", "result", "_wait_for_tstate_lock", "join"}
def sampler(stop, samples, t0):
    while not stop.is_set():
        now = time.perf_counter() - t0
        for tid, frame in sys._current_frames().items():
            if tid == threading.get_ident(): continue
            f = frame; name = f.f_code.co_name; inner = None
            while f is not None:
                if "ckptzip" in f.f_code.co_filename and inner is None: inner = f.f_code.co_name + ":" + os.path.basename(f.f_code.co_filename)
                f = f.f_back
            samples.append((tid, now, name in IDLE, inner, name))
        time.sleep(0.004)
for rep in range(3):
    stop = threading.Event(); samples = []; t0 = time.perf_counter()
    th = threading.Thread(target=sampler, args=(stop, samples, t0)); th.start()
    ckptzip.save(second, os.path.join(d, "tl.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    total = time.perf_counter() - t0; stop.set(); th.join()
    main = threading.get_ident()
    tids = sorted({s[0] for s in samples})
    print(f"== {mode} t{threads} total {total:.2f}s")
    # timeline in 5% buckets: for each thread, busy fraction
    nb = 40
    for tid in tids:
        ss = [s for s in samples if s[0] == tid]
        row = []
        for b in range(nb):
            lo, hi = total * b / nb, total * (b + 1) / nb
            bs = [s for s in ss if lo <= s[1] < hi]
            row.append("." if not bs else str(min(9, int(10 * sum(not s[2] for s in bs) / len(bs)))))
        busy = collections.Counter(s[3] for s in ss if not s[2])
        print(("main " if tid == main else "pool ") + "".join(row), " top:", ", ".join(f"{k} {v}" for k, v in busy.most_common(4)))
    # when both pool threads idle / only one busy
