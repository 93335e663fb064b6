"""Helpers: split a .ckz into (header dict, data) and rebuild it with valid CRCs and a recomputed id."""
import hashlib, json, os, struct, sys, zlib, resource, subprocess
sys.path.insert(0, "/work/main/src")
os.environ.setdefault("CKPTZIP_MALLOC", "system")
import ckptzip
from ckptzip.container import PRELUDE_SIZE, load_header, pack_prelude, FLAG_DEFLATE, header_json

def split(blob):
    flags, hl = struct.unpack_from("<IQ", blob, 12)
    stored = blob[PRELUDE_SIZE:PRELUDE_SIZE + hl]
    return json.loads(load_header(stored, flags, "<t>")), blob[PRELUDE_SIZE + hl:]

def rebuild(header, data, deflate=True, fix_id=True):
    h = dict(header)
    h.pop("id", None)
    body = header_json(h) if True else None
    if fix_id:
        fid = hashlib.sha256(body).hexdigest()[:32]
        body = body[:-1] + b',"id":"' + fid.encode() + b'"}'
    elif "id" in header:
        h["id"] = header["id"]; body = header_json(h)
    stored = zlib.compress(body) if deflate else body
    return pack_prelude(stored, FLAG_DEFLATE if deflate else 0) + stored + data

def file_id(blob):
    return split(blob)[0]["id"]

def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
