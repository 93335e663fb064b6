"""How far two Python threads of torch ops scale on this machine, against two processes.

Each worker runs `ops` times: one torch element-wise op (torch.add, out= a buffer of its own, N
float32 elements, torch on one thread) and a few bytecodes of Python, as a plan does between its
calls. Threads: two threads of one process share the GIL (torch lets go of it in every op).
Processes: two processes each run the same loop at once. Speed-up = the work of two loops over
the wall time of both, against one loop alone.
usage: gil_ceiling.py [sizes...]   (default 1024 16384 131072 1048576)"""
import multiprocessing as mp
import resource
import sys
import threading
import time

import torch

PYTHON_STEPS = 20


def loop(size: int, ops: int) -> None:
    torch.set_num_threads(1)
    a, b, out = torch.ones(size), torch.ones(size), torch.empty(size)
    for _ in range(ops):
        torch.add(a, b, out=out)
        for _ in range(PYTHON_STEPS):
            pass


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def two_threads(size: int, ops: int) -> float:
    workers = [threading.Thread(target=loop, args=(size, ops)) for _ in range(2)]
    return timed(lambda: ([w.start() for w in workers], [w.join() for w in workers]))


def two_processes(size: int, ops: int) -> float:
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=loop, args=(size, ops)) for _ in range(2)]
    return timed(lambda: ([w.start() for w in workers], [w.join() for w in workers]))


def main() -> None:
    sizes = [int(s) for s in sys.argv[1:]] or [1024, 16384, 131072, 1048576]
    for size in sizes:
        per_op = timed(lambda: loop(size, 500)) / 500
        ops = max(500, int(1.0 / per_op))  # about a second of work a loop
        rows = []
        for _ in range(3):
            one = timed(lambda: loop(size, ops))
            before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            threads = two_threads(size, ops)
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before
            processes = two_processes(size, ops)
            rows.append((2 * one / threads, 2 * one / processes, switches / (2 * ops),
                         one / ops * 1e6))
        t = sorted(r[0] for r in rows)
        p = sorted(r[1] for r in rows)
        print(f"{size:>8} elements, {rows[0][3]:7.1f} us an op alone: two threads "
              f"{t[0]:.2f}-{t[-1]:.2f}x, two processes {p[0]:.2f}-{p[-1]:.2f}x; "
              f"the threads' voluntary switches {min(r[2] for r in rows):.2f}-"
              f"{max(r[2] for r in rows):.2f} an op", flush=True)


if __name__ == "__main__":
    main()
