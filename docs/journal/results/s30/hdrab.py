import sys, time, os, statistics
import ckptzip, torch
from ckptzip import container
torch.set_num_threads(1)
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
modes = sys.argv[1].split(","); n = int(sys.argv[2]); threads = int(sys.argv[3])
for mode in modes:
    res = {9: [], 6: []}
    for i in range(n):
        for lvl in ((9, 6) if i % 2 == 0 else (6, 9)):
            container.HEADER_DEFLATE_LEVEL = lvl
            t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, "hab.ckz"), mode=mode, base=key, threads=threads, resumed=True)
            res[lvl].append(time.perf_counter() - t)
    diff = [a - b for a, b in zip(res[6], res[9])]
    print(f"{mode} t{threads}: L9 med {statistics.median(res[9]):.3f} L6 med {statistics.median(res[6]):.3f} paired L6-L9 med {statistics.median(diff):+.4f} [{min(diff):+.3f}, {max(diff):+.3f}] faster {sum(x < 0 for x in diff)}/{n}", flush=True)
