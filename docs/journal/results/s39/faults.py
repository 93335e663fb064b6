"""Minor faults, kernel and user CPU time of lossy saves of the synthetic state on 1 and 2
threads, rounds alternating (glibc's allocator as the environment leaves it).
usage: GB=x faults.py mode rounds"""
import os, sys, time, tempfile, shutil, resource, statistics
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "benchmarks"))
import lossy_speed, ckptzip, torch
mode, rounds = sys.argv[1], int(sys.argv[2])
first, second, _ = lossy_speed.synthetic_states(float(os.environ.get("GB", "1")))
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); out = os.path.join(d, "x.ckz")
ckptzip.save(first, key, threads=2)
for t in (1, 2):
    torch.set_num_threads(t); ckptzip.save(second, out, mode=mode, base=key, threads=t, resumed=True)
rows = {1: [], 2: []}
for r in range(rounds):
    for t in ((1, 2) if r % 2 == 0 else (2, 1)):
        torch.set_num_threads(t)
        a = resource.getrusage(resource.RUSAGE_SELF); s = time.perf_counter()
        ckptzip.save(second, out, mode=mode, base=key, threads=t, resumed=True)
        e = time.perf_counter(); b = resource.getrusage(resource.RUSAGE_SELF)
        rows[t].append((e - s, b.ru_minflt - a.ru_minflt, b.ru_stime - a.ru_stime, b.ru_utime - a.ru_utime))
        print(f"round {r} threads {t}: {e - s:.3f} s, {b.ru_minflt - a.ru_minflt} minor faults, "
              f"sys {b.ru_stime - a.ru_stime:.2f} s, user {b.ru_utime - a.ru_utime:.2f} s", flush=True)
ratios = [a[0] / b[0] for a, b in zip(rows[1], rows[2])]
print(f"{mode} MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}: 2 threads / 1 "
      f"median {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]; faults a save "
      f"1t {statistics.median(x[1] for x in rows[1]):.0f}, 2t {statistics.median(x[1] for x in rows[2]):.0f}; "
      f"sys 1t {statistics.median(x[2] for x in rows[1]):.2f} s, 2t {statistics.median(x[2] for x in rows[2]):.2f} s")
shutil.rmtree(d)
