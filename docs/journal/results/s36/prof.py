"""Where an adaptive save and load of the synthetic state spend their time, one thread.
usage: GB=1 prof.py mode [save|load] ; prints cProfile's top entries of the second call."""
import sys, os, time, tempfile, shutil, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
mode, what = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
tmp = tempfile.mkdtemp()
try:
    first, second, _ = lossy_speed.synthetic_states(float(os.environ.get("GB", "1")))
    key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
    out = os.path.join(tmp, "d.ckz")
    raw = sum(t.numel() * 4 for t in second["model"].values()) * 3 if "model" in second else None
    for i in range(3):
        t = time.perf_counter()
        if what == "save":
            ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
        else:
            if i == 0:
                ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
            s = ckptzip.load(out, threads=1); del s
        print(what, i, f"{time.perf_counter() - t:.3f} s", flush=True)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    if what == "save":
        ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
    else:
        s = ckptzip.load(out, threads=1); del s
    prof.disable()
    print("profiled", f"{time.perf_counter() - t:.3f} s")
    st = pstats.Stats(prof); st.sort_stats("tottime").print_stats(30)
finally:
    shutil.rmtree(tmp)
