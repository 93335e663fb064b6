"""The atheris side of the harnesses, importable before ckptzip (which must be imported under
:func:`instrumented` to be instrumented). Without atheris installed the harnesses still import,
so that tests/test_fuzz.py can replay the committed corpora through their entry points."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

try:
    import atheris
except ImportError:  # replay only
    atheris = None


def instrumented() -> AbstractContextManager[Any]:
    """``atheris.instrument_imports`` for ckptzip, or nothing where atheris is missing."""
    if atheris is None:
        return nullcontext()
    return atheris.instrument_imports(include=["ckptzip"])


def fuzz(test_one_input: Callable[[bytes], None]) -> None:
    """Run libFuzzer's loop over ``test_one_input`` with sys.argv's options."""
    assert atheris is not None, "pip install atheris"
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
