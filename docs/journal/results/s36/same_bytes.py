"""Each mode's delta of the demo state and of a 0.25 GB synthetic state, written by the old
package (a copy imported as ckptzip_a) and by this tree, 1 and 2 threads: sha256 of each file.
usage: same_bytes.py OLD_SRC_PKG_DIR"""
import sys, os, tempfile, shutil, hashlib
old_pkg = sys.argv[1]
tmp = tempfile.mkdtemp()
shutil.copytree(old_pkg, os.path.join(tmp, "ckptzip_a"))
sys.path.insert(0, tmp); sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip_a
try:
    for name, (first, second, _) in (("demo", lossy_speed.demo_states(20, 5)),
                                      ("synthetic-0.25", lossy_speed.synthetic_states(0.25))):
        key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
        for mode in ("excp", "bitsnap", "adaptive"):
            for threads in (1, 2):
                digests = []
                for lib in (ckptzip_a, ckptzip):
                    out = os.path.join(tmp, "d.ckz")
                    lib.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
                    digests.append(hashlib.sha256(open(out, "rb").read()).hexdigest()[:16])
                print(name, mode, threads, "old", digests[0], "new", digests[1],
                      "same" if digests[0] == digests[1] else "DIFFERENT", flush=True)
finally:
    shutil.rmtree(tmp)
