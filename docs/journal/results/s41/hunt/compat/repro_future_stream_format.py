"""The CURRENT reader, given a file whose chunk is intact (its stored CRC-32C matches) but whose
entropy stream declares a format byte this reader does not know (what a newer ckptzip writes, as
the current writer's format-4 streams were to 0.1.0 readers of session 5), says the file is
DAMAGED and to restore it from another copy, instead of asking for a newer ckptzip (FORMAT.md,
Compatibility). A user downgrading, or reading on a machine with an older install, is told to
throw away a good checkpoint.  Exit 1 when the message blames damage."""
import hashlib, json, os, struct, sys, tempfile, torch, ckptzip
from ckptzip import _native
from ckptzip.container import PRELUDE_SIZE, load_header, pack_prelude
d = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(__file__)))
g = torch.Generator().manual_seed(0)
w0 = torch.randn(256, 256, generator=g)
ckptzip.save({"w": w0}, f"{d}/k0.ckz")
ckptzip.save({"w": w0 + 1e-4 * torch.randn(256, 256, generator=g)}, f"{d}/d1.ckz", base=f"{d}/k0.ckz")
blob = bytearray(open(f"{d}/d1.ckz", "rb").read())
flags, length = struct.unpack_from("<IQ", blob, 12)
header = json.loads(load_header(bytes(blob[PRELUDE_SIZE:PRELUDE_SIZE + length]), flags, "x"))
data = bytearray(blob[PRELUDE_SIZE + length:])
leaf = header["leaves"][0]; off = leaf["offset"]; stored_len = leaf["chunks"][0][0]
print("chunk 0 starts with stream format byte", hex(data[off]))
data[off] = 0x05                                   # a stream format from a future writer
leaf["chunks"][0][1] = _native.crc32c(bytes(data[off:off + stored_len]))  # stored bytes intact
header.pop("id")
body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
fid = hashlib.sha256(body).hexdigest()[:32]
text = body[:-1] + b',"id":"' + fid.encode() + b'"}'
open(f"{d}/d1.ckz", "wb").write(pack_prelude(text, 0) + text + bytes(data))
try:
    ckptzip.load(f"{d}/d1.ckz"); print("loaded?!"); sys.exit(2)
except ckptzip.Error as e:
    print(f"{type(e).__name__}: {e}")
    sys.exit(1 if "damaged" in str(e) else 0)
