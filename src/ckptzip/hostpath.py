"""Where the lossy stages' element-wise passes run: in the native core for tensors on the host,
as torch's ops on any other device (a GPU). Both write the same bytes.

:func:`torch_ops_only` sends host tensors down torch's path too. The tests use it to check the
device path's arithmetic, and its memory, on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_torch_ops_only = False


def native(*tensors: torch.Tensor) -> bool:
    """Whether the native core's passes take these tensors: all on the host."""
    return not _torch_ops_only and all(t.device.type == "cpu" for t in tensors)


def native_device(device: torch.device) -> bool:
    """:func:`native` for tensors to be made on ``device``."""
    return not _torch_ops_only and device.type == "cpu"


@contextmanager
def torch_ops_only() -> Iterator[None]:
    """Within it, host tensors take the path of a device's tensors: torch's ops in place of the
    native passes (process-wide, for tests and probes; the searches' host samples stay native,
    as they do for a device)."""
    global _torch_ops_only
    previous, _torch_ops_only = _torch_ops_only, True
    try:
        yield
    finally:
        _torch_ops_only = previous
