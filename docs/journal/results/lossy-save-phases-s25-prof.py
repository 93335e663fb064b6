import sys, time, tempfile, os
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3] / 'benchmarks'))
import torch, ckptzip
import lossy_speed as L
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
mode = sys.argv[2] if len(sys.argv) > 2 else 'adaptive'
n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
torch.set_num_threads(threads)
first, second, params = L.demo_states(20, 5)
d = tempfile.mkdtemp()
key = os.path.join(d, 'key.ckz'); ckptzip.save(first, key, mode='lossless')
for i in range(n):
    t = time.perf_counter(); c = time.process_time()
    ckptzip.save(second, os.path.join(d, 'delta.ckz'), mode=mode, base=key, resumed=True, threads=threads)
    w = time.perf_counter() - t
    print(f"{mode} threads={threads} save {w:.3f}s {params*12/w/1e6:.0f} MB/s cpu {time.process_time()-c:.2f}s", flush=True)
