"""Where the lossy stages' element-wise passes run: in the native core for tensors on the host,
as torch's ops on any other device (a GPU). Both write the same bytes.

:func:`torch_ops_only` sends host tensors down torch's path too. The tests use it to check the
device path's arithmetic, and its memory, on a machine without a GPU. :func:`empty` gives the
native passes their outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from . import _native
from .tree import flat_array

_torch_ops_only = False
#: Host outputs at least this large take their memory from a ``_native.PageBuffer``.
PAGE_BUFFER_BYTES = 2 << 20
#: Elements per piece of torch's element-wise passes (a device's): their float64 and int64
#: temporaries are 16 MiB each, not the tensor's size times eight.
TORCH_PIECE = 1 << 21


def native(*tensors: torch.Tensor) -> bool:
    """Whether the native core's passes take these tensors: all on the host."""
    # ``is_cpu``, not ``device.type``: no device object made per tensor (thousands a save)
    return not _torch_ops_only and all(tensor.is_cpu for tensor in tensors)


def cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor.detach().to(dtype)``, with no torch call where the tensor already is of that
    dtype and detached (``to`` and ``detach`` each let go of the GIL twice even then)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def native_float32(*tensors: torch.Tensor) -> bool:
    """:func:`native` for element-wise passes over float32 arrays of one element count (the
    moments' passes: base ratios, Adam's steps)."""
    return (native(*tensors) and all(t.dtype == torch.float32 for t in tensors)
            and len({t.numel() for t in tensors}) == 1)


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


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized host tensor for a native pass to write. From ``PAGE_BUFFER_BYTES`` on,
    its memory is a ``_native.PageBuffer``: the mappings of freed ones (up to 256 MiB) serve the
    next of the same size, already faulted in, and a fresh one faults once per 2 MiB huge page.
    A lossy save makes and drops several tensor-sized outputs per tensor; under glibc's
    defaults each was a fresh mapping, faulted in 4 KiB at a time (on the 2-core VM of
    docs/BENCHMARKS.md §7, about half of an adaptive save of 64 MB weights was the kernel's).
    The tensor behaves like any other, except that its storage cannot grow."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < PAGE_BUFFER_BYTES:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(_native.PageBuffer(nbytes), dtype=torch.uint8).view(dtype).reshape(shape)


#: Element sizes the native core counts non-zeros of, by dtype.
_COUNTED = {torch.float32: 4, torch.float64: 8, torch.bool: 1, torch.uint8: 1, torch.int8: 1}


def count_nonzero(tensor: torch.Tensor) -> int:
    """``torch.count_nonzero(tensor)`` as an int: on the host one native pass with the GIL
    released (six times torch's speed on a float32 weight), the same count."""
    size = _COUNTED.get(tensor.dtype)
    if size is None or not native(tensor):
        return int(torch.count_nonzero(tensor))
    return _native.count_nonzero(flat_array(tensor), size)


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``bool((a == b).all())`` for tensors of one shape (-0.0 equals 0.0, a NaN nothing): for
    host float32 or float64 tensors of one dtype, one native pass without the boolean copy that
    stops at the first block of 256 that differs (an updated weight's unchanged check reads its
    first elements only); the same answer."""
    if (a.dtype == b.dtype and a.dtype in (torch.float32, torch.float64) and a.shape == b.shape
            and native(a, b)):
        return _native.floats_equal(flat_array(a), flat_array(b), a.element_size())
    return bool((a == b).all())


def has_negative(tensor: torch.Tensor) -> bool:
    """``bool((tensor < 0).any())`` (-0.0 and NaN are not below zero): for a host float32 or
    float64 tensor one native pass without the boolean copy, stopping at the first block of 256
    that holds a negative value (a weight's first); the same answer."""
    if tensor.dtype in (torch.float32, torch.float64) and native(tensor):
        return _native.has_negative(flat_array(tensor), tensor.element_size())
    return bool((tensor < 0).any())


def kth_magnitude(tensor: torch.Tensor, k: int) -> torch.Tensor:
    """``tensor.abs().kthvalue(k + 1).values`` of all its elements (the k-th smallest magnitude,
    from 0): a 0-dim tensor of its dtype. A host float32 tensor's is the native core's radix
    selection (no copy, about six times torch's speed), the same value; torch's elsewhere and
    where a NaN is."""
    found = _native_kth(tensor, k)
    if found is not None:
        return found
    magnitudes = tensor.detach().reshape(-1).abs()
    if _selectable(magnitudes) and 0 <= k < magnitudes.numel():
        return _selected(magnitudes, k)
    return magnitudes.kthvalue(k + 1).values


def median_magnitude(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor.abs().median()``: the lower median of its magnitudes (as :func:`kth_magnitude`;
    torch's where a NaN is, which its median gives and its kthvalue does not). Elsewhere (a
    device) torch's selection of that element, the same value: CUDA's median of a whole tensor
    sorts it, holding its values, their int64 indices and the sort's buffers, about six times
    its bytes, where the selection (:func:`_selected`) holds about two."""
    k = (tensor.numel() - 1) // 2
    found = _native_kth(tensor, k)
    if found is not None:
        return found
    magnitudes = tensor.detach().reshape(-1).abs()
    if _selectable(magnitudes) and magnitudes.numel():
        return _selected(magnitudes, k)
    return magnitudes.median()


def _selectable(magnitudes: torch.Tensor) -> bool:
    """Whether :func:`_selected` takes these magnitudes: float32, no NaN (whose place torch's
    median and kthvalue each define in their own way)."""
    return magnitudes.dtype == torch.float32 and not bool(magnitudes.isnan().any())


#: :func:`_selected`'s rounds: the bits of a non-negative float32 below its sign, from the top,
#: as (shift, width): 11, 11 and 9 bits.
_SELECT_ROUNDS = ((20, 11), (9, 11), (0, 9))


def _selected(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th smallest (from 0) of non-negative float32 ``magnitudes`` (1-D, no NaN) by
    torch's ops, on any device: a radix selection. Their bit patterns order as their values do
    (infinities and subnormals included), so each round counts the elements that share the
    prefix found so far by their next digit (one histogram), and takes the digit where the
    k-th falls. The same value as ``kthvalue``; no sort, and on a GPU every pass runs on all of
    it (CUDA's ``kthvalue`` of a whole tensor runs on one thread block). Holds one int32 and one
    boolean tensor of its size beside it."""
    bits = magnitudes.contiguous().view(torch.int32)
    prefix, rank = 0, k
    for number, (shift, width) in enumerate(_SELECT_ROUNDS):
        # the elements outside the prefix go to an extra bin past the digits
        outside = torch.bitwise_right_shift(bits, shift + width) != prefix if number else None
        digits = torch.bitwise_right_shift(bits, shift)
        if outside is not None:
            digits.bitwise_and_((1 << width) - 1).masked_fill_(outside, 1 << width)
            del outside
        counts = torch.bincount(digits, minlength=(1 << width) + 1)[: 1 << width]
        del digits
        below = counts.cumsum(0)
        digit = int(torch.searchsorted(below, torch.tensor(rank, device=below.device),
                                       right=True))
        rank -= int(below[digit - 1]) if digit else 0
        prefix = (prefix << width) | digit
    value = torch.tensor([prefix], dtype=torch.int32, device=magnitudes.device)
    return value.view(torch.float32)[0]


def _native_kth(tensor: torch.Tensor, k: int) -> torch.Tensor | None:
    """The native selection's k-th smallest magnitude as a 0-dim float32 tensor; None where it
    does not take the tensor (a device, another dtype, a NaN, k out of range)."""
    flat = tensor.detach().reshape(-1)
    if not (native(flat) and flat.dtype == torch.float32 and 0 <= k < flat.numel()):
        return None
    value = _native.kth_magnitude(flat.contiguous().numpy(), k)
    return None if value is None else torch.tensor(value, dtype=torch.float32)


def subtract(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a - b``, on the host into :func:`empty`'s memory (the same arithmetic: torch's own
    kernel, writing to a buffer given to it)."""
    if not (native(a, b) and a.shape == b.shape and a.dtype == b.dtype):
        return a - b
    return torch.sub(a, b, out=empty(a.shape, a.dtype))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of two matrices, on the host into :func:`empty`'s memory (torch's own kernel)."""
    if not (native(a, b) and a.dim() == b.dim() == 2 and a.dtype == b.dtype):
        return a @ b
    return torch.mm(a, b, out=empty((a.shape[0], b.shape[1]), a.dtype))


def in_pieces(fn: Callable[..., torch.Tensor], out: torch.Tensor,
              *inputs: torch.Tensor) -> torch.Tensor:
    """``out`` (contiguous) filled with the element-wise ``fn`` of ``inputs`` (as many elements
    each), :data:`TORCH_PIECE` elements at a time: the same values as one call on the whole,
    with temporaries of a piece's size."""
    flat = out.view(-1)
    pieces = [tensor.reshape(-1) for tensor in inputs]
    for start in range(0, flat.numel(), TORCH_PIECE):
        stop = min(start + TORCH_PIECE, flat.numel())
        flat[start:stop] = fn(*(piece[start:stop] for piece in pieces))
    return out


def sum_squares(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> float:
    """The sum, in float64, of the squares of the element-wise ``fn`` of ``inputs`` (as many
    elements each), by torch's ops :data:`TORCH_PIECE` elements at a time: a device holds no
    float64 copy of the whole."""
    pieces = [tensor.reshape(-1) for tensor in inputs]
    total = torch.zeros((), dtype=torch.float64, device=pieces[0].device)
    for start in range(0, pieces[0].numel(), TORCH_PIECE):
        part = fn(*(piece[start:start + TORCH_PIECE] for piece in pieces))
        total += torch.linalg.vector_norm(part, dtype=torch.float64).square()
    return float(total)
