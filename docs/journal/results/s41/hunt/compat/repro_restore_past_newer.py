"""CheckpointManager.restore() falls back past a step file written by a NEWER ckptzip (intact,
just unreadable by this version) as if it were damaged, and the resumed run's next save then
replaces it.  manager.py's own rule (_refuse_unreadable_after: "falling back past an intact
checkpoint would let the resumed run's next saves replace it") is applied only to I/O errors:
both a newer major version (VersionError) and a newer codec (FormatError "needs a newer
ckptzip") are fallen back past, with only a log line.  Scenario: a run saved steps 0-20, step 20
by a newer ckptzip; the job restarts on a node with this ckptzip.
Exit 1 when restore() returns an older step without raising."""
import logging, os, shutil, sys, torch, ckptzip
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hdr import rewrite_header, future_codec
logging.basicConfig(level=logging.WARNING, format="  log: %(message).160s")
here = os.path.dirname(os.path.abspath(__file__))
g = torch.Generator().manual_seed(0); w = torch.randn(128, 128, generator=g)
states = [{"w": w + i * 1e-3 * torch.randn(128, 128, generator=g), "step": 10 * i} for i in range(3)]
def newer_major(p):
    from ckptzip import _native
    b = bytearray(open(p, "rb").read()); b[8:10] = (2).to_bytes(2, "little")
    b[28:32] = _native.crc32c(bytes(b[:28])).to_bytes(4, "little"); open(p, "wb").write(bytes(b))
bad = 0
for tag, make_newer in (("newer major (VersionError)", newer_major),
                        ("newer codec (FormatError)", lambda p: rewrite_header(p, future_codec))):
    d = os.path.join(here, "work", "repro-restore-newer"); shutil.rmtree(d, ignore_errors=True)
    with ckptzip.CheckpointManager(d, keyframe_every=8, async_save=False) as m:
        for s in states: m.save(s["step"], s)
    make_newer(f"{d}/step-00000020.ckz")
    before = open(f"{d}/step-00000020.ckz", "rb").read()
    print(tag)
    try:
        with ckptzip.CheckpointManager(d, keyframe_every=8, async_save=False) as m:
            st = m.restore()
            print(f"  restore() returned step {st['step']} (the newest file on disk is step 20)")
            m.save(20, states[2])                      # training goes on and saves step 20
        print("  step-00000020.ckz replaced by this run:", open(f"{d}/step-00000020.ckz", "rb").read() != before)
        bad += st["step"] != 20
    except ckptzip.Error as e:
        print(f"  refused: {type(e).__name__}: {str(e)[:200]}")
sys.exit(1 if bad else 0)
