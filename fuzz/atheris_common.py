"""What the atheris harnesses share: checksum fix-up and the in-memory base. Import it after the
harness has imported ckptzip under atheris_boot.instrumented()."""

from __future__ import annotations

import contextlib
import json
import struct
import zlib

import fuzz_states

from ckptzip import Error, _native
from ckptzip.chain import MemoryBase
from ckptzip.container import FLAG_DEFLATE, PRELUDE_SIZE, load_header

#: The base every delta and lossy seed was coded against; a Base object is reused across runs
#: (close() only drops its cache).
BASE = MemoryBase(fuzz_states.base_state())


def _seal(prelude: bytes, header: bytes, data: bytes) -> bytes:
    """A file with this prelude's fields, ``header`` and valid header and prelude checksums."""
    head = bytearray(prelude[:28])
    struct.pack_into("<QI", head, 16, len(header), _native.crc32c(header))
    return bytes(head) + struct.pack("<I", _native.crc32c(bytes(head))) + header + data


def fix_checksums(blob: bytes, keep_some: bool = True) -> bytes:
    """Make a mutated file's checksums valid again, so that mutations reach the header parser and
    the decoders instead of dying at a CRC: the prelude's, the header's and each stored chunk's
    (where the header still parses). A header under the deflate flag that does not inflate is
    taken for JSON and deflated here: the seeds store their headers as plain JSON so that
    mutations edit the JSON, not the deflate stream. One input in 8 (by its own CRC) is left as
    it is (unless not ``keep_some``), which keeps the checksum and inflate failures fuzzed too."""
    if len(blob) < PRELUDE_SIZE or (keep_some and _native.crc32c(blob) % 8 == 0):
        return blob
    (flags, length) = struct.unpack_from("<IQ", blob, 12)
    if length > len(blob) - PRELUDE_SIZE:
        head = blob[:28]  # a header length past the end: only the prelude's own CRC
        return head + struct.pack("<I", _native.crc32c(head)) + blob[PRELUDE_SIZE:]
    text, data = blob[PRELUDE_SIZE : PRELUDE_SIZE + length], blob[PRELUDE_SIZE + length :]
    if flags & FLAG_DEFLATE:
        with contextlib.suppress(Error):
            text = load_header(text, flags, "<fuzz>")
    try:
        header = json.loads(text)
        for leaf in header["leaves"]:
            offset = leaf["offset"]
            for chunk in leaf["chunks"]:
                chunk[1] = _native.crc32c(data[offset : offset + chunk[0]])
                offset += chunk[0]
        text = json.dumps(header).encode()
    except Exception:  # not a header we can fix up: keep what the mutation made
        pass
    stored = zlib.compress(text) if flags & FLAG_DEFLATE else text
    return _seal(blob, stored, data)
