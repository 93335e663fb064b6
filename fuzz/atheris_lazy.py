"""atheris harness: the lazy reader on a mutated ``.ckz`` file on disk: ``ckptzip.open``, then
``metadata``, ``mode``, ``id``, ``chain_depth``, ``base_ref``, ``keys()``, ``in``,
``get_tensor`` of up to four keys and ``verify()``. Checksums are fixed up first
(atheris_common.fix_checksums); it starts from fuzz/corpus/container.

Allowed outcomes: values, or exceptions that are ckptzip.Error (KeyError for a key the file does
not have is not reachable: only listed keys are asked for). Anything else is a finding.

    .venv/bin/python fuzz/atheris_lazy.py -runs=1000000 -rss_limit_mb=2048 -timeout=10 \
        fuzz/build/corpus-atheris-lazy fuzz/corpus/container
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atheris_boot import fuzz, instrumented

with instrumented():
    import ckptzip

from atheris_common import BASE, fix_checksums

_DIR = tempfile.mkdtemp(prefix="ckz-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
PATH = os.path.join(_DIR, "input.ckz")


def test_one_input(data: bytes) -> None:
    with open(PATH, "wb") as handle:
        handle.write(fix_checksums(data))
    try:
        with ckptzip.open(PATH, threads=1, base=BASE) as ckpt:
            _ = (ckpt.metadata, ckpt.mode, ckpt.id, ckpt.chain_depth, ckpt.base_ref)
            keys = ckpt.keys()
            for key in keys[:4]:
                assert key in ckpt
                ckpt.get_tensor(key)
            ckpt.verify()
    except ckptzip.Error:
        pass


if __name__ == "__main__":
    fuzz(test_one_input)
