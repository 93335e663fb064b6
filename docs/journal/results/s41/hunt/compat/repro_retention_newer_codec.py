"""CheckpointManager retention deletes the base of a file that a NEWER ckptzip wrote.

INTEGRATIONS.md (Retention): a .ckz in the directory that cannot be read "by this ckptzip (a
newer format) keeps every step at that save, with a logged warning".  The manager recognises a
newer format only as a VersionError (a newer major version in the prelude).  But per FORMAT.md
(Compatibility) a newer ckptzip adds codecs within format 1.0, and a file using one raises
FormatError("unknown codec ...; the file needs a newer ckptzip"), which the manager takes for a
DAMAGED file that "loads from nothing": retention then deletes the steps it loads from.
Here best.ckz is a delta against step 0, as a newer ckptzip (one whose context coder has a new
codec id) writes it; after two more saves with keep_last=1, step 0 is gone and best.ckz can never
load again, even with the newer ckptzip.  The same file with a newer *major* version instead
keeps step 0 (control).  Exit 1 when step 0 was deleted."""
import logging, os, shutil, sys, torch, ckptzip
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hdr import rewrite_header, future_codec
logging.basicConfig(level=logging.WARNING, format="  log: %(message).200s")
here = os.path.dirname(os.path.abspath(__file__))
g = torch.Generator().manual_seed(0)
w = torch.randn(128, 128, generator=g)
states = [{"w": w + i * 1e-3 * torch.randn(128, 128, generator=g), "step": i} for i in range(3)]
def run(tag, make_newer):
    d = os.path.join(here, "work", f"repro-retention-{tag}"); shutil.rmtree(d, ignore_errors=True)
    with ckptzip.CheckpointManager(d, keep_last=1, keyframe_every=1, async_save=False) as m:
        m.save(0, states[0])
        ckptzip.save(states[1], f"{d}/best.ckz", base=m.path(0))     # a delta against step 0
        with ckptzip.open(f"{d}/best.ckz") as c: assert c.base_ref, "best.ckz should be a delta"
        make_newer(f"{d}/best.ckz")
        try: ckptzip.load(f"{d}/best.ckz")
        except ckptzip.Error as e: print(f"  this ckptzip on best.ckz: {type(e).__name__}: {str(e)[-90:]}")
        m.save(10, states[1]); m.save(20, states[2])
    left = sorted(f for f in os.listdir(d) if f.endswith(".ckz"))
    print(f"{tag}: files left {left}")
    return "step-00000000.ckz" in left
def newer_major(p):
    b = bytearray(open(p, "rb").read()); b[8:10] = (2).to_bytes(2, "little")
    from ckptzip import _native; b[28:32] = _native.crc32c(bytes(b[:28])).to_bytes(4, "little")
    open(p, "wb").write(bytes(b))
kept_major = run("newer-major", newer_major)
kept_codec = run("newer-codec", lambda p: rewrite_header(p, future_codec))
print("step 0 kept: newer major ->", kept_major, "; newer codec ->", kept_codec)
sys.exit(1 if kept_major and not kept_codec else 0)
