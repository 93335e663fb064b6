"""Counts from the reliability tests (trials, faults, outcomes), for docs/RELIABILITY.md.

Each test calls :func:`record`; the line is printed (``pytest -s`` shows it) and, when
``CKPTZIP_RELIABILITY_LOG`` names a file, appended to it as JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any


def record(test: str, **counts: Any) -> None:
    line = {"test": test, **counts}
    print(f"[reliability] {json.dumps(line)}")
    log = os.environ.get("CKPTZIP_RELIABILITY_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(json.dumps(line) + "\n")
