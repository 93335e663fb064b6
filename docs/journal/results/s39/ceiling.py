"""How far two cores of this machine can scale a lossy save at all: two processes, each saving
the demo delta on one thread at the same time (no GIL between them, the same cores, caches and
memory), against one process alone, and against one process saving on two threads (the
library's `threads=2`). Rounds rotate the order.

usage: [GB=x] [TUNE=1] ceiling.py MODE ROUNDS SAVES_PER_RUN (GB: the synthetic state of that size,
not the demo; TUNE: each worker calls ckptzip.tune_malloc() first, as the command does)
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = str(__import__("pathlib").Path(__file__).resolve().parents[4])

WORKER = r"""
import os, sys, tempfile, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import lossy_speed, ckptzip, torch
if os.environ.get("TUNE"):  # the allocator as the ckptzip command sets it for itself
    assert ckptzip.tune_malloc()
mode = sys.argv[2]
first, second, _ = lossy_speed.synthetic_states(float(os.environ["GB"])) if os.environ.get("GB") else lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); out = os.path.join(d, "d.ckz")
ckptzip.save(first, key, threads=2)
for threads in (1, 2):
    torch.set_num_threads(threads)
    ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
print("ready", flush=True)
for line in sys.stdin:
    threads, saves = map(int, line.split())
    torch.set_num_threads(threads)
    t = time.perf_counter()
    for _ in range(saves):
        ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
    print(f"{time.perf_counter() - t:.4f}", flush=True)
"""


def main() -> None:
    mode, rounds, saves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    env = dict(os.environ, CKPTZIP_MALLOC=os.environ.get("CKPTZIP_MALLOC", "system"),
               PYTHONWARNINGS="ignore")
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, ROOT, mode], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for w in workers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"

    def run(targets: list[subprocess.Popen], threads: int) -> float:
        start = time.perf_counter()
        for w in targets:
            assert w.stdin is not None
            w.stdin.write(f"{threads} {saves}\n")
            w.stdin.flush()
        for w in targets:
            assert w.stdout is not None
            w.stdout.readline()
        return time.perf_counter() - start

    solo, duo, threaded = [], [], []
    kinds = ["solo", "duo", "threads"]
    for r in range(rounds):
        for kind in kinds[r % 3:] + kinds[: r % 3]:
            if kind == "solo":
                solo.append(run(workers[r % 2: r % 2 + 1], 1))
            elif kind == "duo":
                duo.append(run(workers, 1))
            else:
                threaded.append(run(workers[r % 2: r % 2 + 1], 2))
        print(f"round {r + 1}: one process, one thread {solo[-1] / saves:.3f} s/save; two processes"
              f" at once {duo[-1] / saves:.3f} s per save each -> {2 * solo[-1] / duo[-1]:.2f}x;"
              f" one process, threads=2 {threaded[-1] / saves:.3f} s/save ->"
              f" {solo[-1] / threaded[-1]:.2f}x", flush=True)
    for w in workers:
        assert w.stdin is not None
        w.stdin.close()
        w.wait()
    procs = [2 * a / b for a, b in zip(solo, duo)]
    threads = [a / b for a, b in zip(solo, threaded)]
    print(f"{mode}: two processes {min(procs):.2f}-{max(procs):.2f}x (median {statistics.median(procs):.2f}),"
          f" threads=2 {min(threads):.2f}-{max(threads):.2f}x (median {statistics.median(threads):.2f})"
          f" over {rounds} rounds of {saves} saves")


if __name__ == "__main__":
    main()
