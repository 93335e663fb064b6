import sys, time, tempfile, os, ctypes
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
gc = ctypes.CDLL("/tmp/s34/gilcount/gc.so")
threads = int(sys.argv[1]); mode = sys.argv[2]; reps = int(sys.argv[3])
torch.set_num_threads(threads)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=2)
ckptzip.save(second, os.path.join(d, "d.ckz"), mode=mode, base=key, threads=threads, resumed=True)
gc.gilcount_reset()
t0 = time.perf_counter(); c0 = time.process_time()
for r in range(reps):
    ckptzip.save(second, os.path.join(d, "d.ckz"), mode=mode, base=key, threads=threads, resumed=True)
t = time.perf_counter() - t0; c = time.process_time() - c0
print(f"{mode} x{threads}: {t/reps:.3f} s/save wall, {c/reps:.3f} s/save cpu", flush=True)
gc.gilcount_report(f"{mode} x{threads} per {reps} saves".encode())
gc.gilcount_top(30)
