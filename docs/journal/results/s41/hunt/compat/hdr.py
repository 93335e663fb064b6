"""Rewrite a .ckz's header (JSON) with fn, keeping the data section; the CRCs and the id redone:
what a writer that made that header would have written."""
import hashlib, json, struct
from ckptzip.container import PRELUDE_SIZE, load_header, pack_prelude
def rewrite_header(path, fn):
    blob = open(path, "rb").read()
    flags, length = struct.unpack_from("<IQ", blob, 12)
    header = json.loads(load_header(blob[PRELUDE_SIZE:PRELUDE_SIZE + length], flags, path))
    data = blob[PRELUDE_SIZE + length:]
    fn(header); header.pop("id", None)
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text = body[:-1] + b',"id":"' + hashlib.sha256(body).hexdigest()[:32].encode() + b'"}'
    open(path, "wb").write(pack_prelude(text, 0) + text + data)
def future_codec(header, old="ctxplanes", new="ctxplanes-v5"):
    """a newer ckptzip's codec: one pipeline stage renamed"""
    for p in header["pipelines"]:
        for stage in p:
            if stage["id"] == old: stage["id"] = new
