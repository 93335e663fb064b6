"""atheris harness: ``ckptzip.loads`` of mutated ``.ckz`` bytes (prelude, deflated or plain JSON
header, leaf table, tree, chunks, transforms), with the in-memory base the delta and lossy seeds
need. Checksums are fixed up before loading (atheris_common.fix_checksums).

Allowed outcomes: a value, or an exception that is a ckptzip.Error. Anything else (another
exception, a crash, a hang past -timeout, memory past -rss_limit_mb) is a finding.

    .venv/bin/python fuzz/atheris_container.py -runs=1000000 -rss_limit_mb=2048 -timeout=10 \
        fuzz/build/corpus-atheris-container fuzz/corpus/container
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atheris_boot import fuzz, instrumented

with instrumented():
    import ckptzip

from atheris_common import BASE, fix_checksums


def test_one_input(data: bytes) -> None:
    with contextlib.suppress(ckptzip.Error):
        ckptzip.loads(fix_checksums(data), base=BASE, threads=1)


if __name__ == "__main__":
    fuzz(test_one_input)
