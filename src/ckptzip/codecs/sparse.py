"""Tensor to tensor: sparsification, a mask of the kept elements plus their values (BitSnap).

A float tensor whose dropped elements are zero becomes one uint8 array: where the non-zeros are,
then their values as half-precision numbers times ``2**scale_exp`` (see :mod:`.kmeans`), split
into byte planes so that the entropy coder sees the exponent bytes apart. Where the non-zeros are
is either a bitmask (one bit per element) or an index list (the gaps between kept positions, as
uint32 byte planes); the bitmask is the smaller one above about 3% density (FIELD.md), and the
entropy coder brings either towards ``N·H(k/N)`` bits.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .. import _native, dtypes, hostpath
from ..errors import ConfigError
from ..hostpath import native_device
from .base import TensorToTensor, TransformContext, register
from .kmeans import half_scale_exponent

LAYOUTS = ("bitmask", "indices")
#: The largest |scale_exp| a file may name (as the kmeans codebook's).
MAX_SCALE_EXP = 1000
#: Above this density a raw bitmask (1 bit per element) beats 32-bit indices.
BITMASK_DENSITY = 1 / 32
_BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def layout_for(density: float) -> str:
    return "bitmask" if density >= BITMASK_DENSITY else "indices"


def _planes(values: torch.Tensor, width: int) -> torch.Tensor:
    """Little-endian bytes of ``values``, byte plane after byte plane."""
    return values.contiguous().view(torch.uint8).reshape(-1, width).t().reshape(-1)


def _unplanes(data: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    planes = data.reshape(width, -1).t()
    out = torch.empty(planes.shape, dtype=torch.uint8, device=data.device)  # aligned for .view
    return out.copy_(planes).view(dtype).reshape(-1)


@register
class Sparse(TensorToTensor):
    codec_id: ClassVar[str] = "sparse"

    def __init__(self, layout: str, dtype: str, shape: list[int], count: int = 0,
                 scale_exp: int = 0) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"sparse: layout must be one of {LAYOUTS}, not {layout!r}")
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"sparse: dtype {dtype!r} is not a real float type")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise ConfigError(f"sparse: bad shape {shape!r}")
        numel = math.prod(shape)
        if (type(count) is not int or not 0 <= count <= numel or type(scale_exp) is not int
                or abs(scale_exp) > MAX_SCALE_EXP):
            raise ConfigError(f"sparse: bad count {count!r} or scale exponent {scale_exp!r}")
        self.layout, self.dtype, self.shape, self.numel = layout, out, shape, numel
        self.count, self.scale_exp = count, scale_exp

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "layout": self.layout, "dtype": self.dtype.name,
                "shape": self.shape, "count": self.count, "scale_exp": self.scale_exp}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Sparse:
        return cls(config["layout"], config["dtype"], config["shape"], config["count"],
                   config["scale_exp"])

    def _on_native(self, device: torch.device) -> bool:
        """Whether the native passes code this stage: a float32 bitmask on the host. They do
        torch's arithmetic, so either way writes and reads the same bytes."""
        return (self.layout == "bitmask" and native_device(device)
                and self.dtype.torch_dtype == torch.float32)

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        flat = tensor.reshape(-1)
        if self._on_native(flat.device) and flat.dtype == torch.float32:
            array = flat.contiguous().numpy()
            self.count, top = _native.sparse_survey(array)
            self.scale_exp = half_scale_exponent(top if self.count else 0.0)
            out = hostpath.empty((-(-flat.numel() // 8) + 2 * self.count,), torch.uint8)
            _native.sparse_pack(array, self.scale_exp, out.numpy())
            return out
        kept = flat != 0
        self.count = int(torch.count_nonzero(kept))
        self.scale_exp = half_scale_exponent(float(flat.abs().max()) if self.count else 0.0)
        # the kept values as halves, a piece at a time (in float64 they were twice the tensor's
        # bytes at once, where a BitSnap group peaks on a device): the same values
        scale = 2.0**-self.scale_exp
        halves = torch.cat([(piece[marked].double() * scale).half() for piece, marked
                            in zip(flat.split(hostpath.TORCH_PIECE), kept.split(hostpath.TORCH_PIECE))]
                           or [flat.new_empty(0, dtype=torch.float16)])
        if self.layout == "bitmask":
            padded = torch.zeros(-(-flat.numel() // 8) * 8, dtype=torch.uint8, device=flat.device)
            padded[: flat.numel()] = kept.to(torch.uint8)
            weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=flat.device)
            where = (padded.reshape(-1, 8) * weights).sum(1, dtype=torch.uint8)
        else:
            positions = kept.nonzero().reshape(-1)
            gaps = torch.diff(positions, prepend=positions.new_tensor([-1])) - 1
            where = _planes(gaps.to(torch.int32), 4)
        return torch.cat([where, _planes(halves, 2)])

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        mask_bytes = -(-self.numel // 8) if self.layout == "bitmask" else 4 * self.count
        if tensor.dtype != torch.uint8 or tensor.numel() != mask_bytes + 2 * self.count:
            raise ValueError(f"sparse: {tensor.numel()} bytes do not hold {self.count} values of "
                             f"{self.numel} in a {self.layout}")
        if self._on_native(tensor.device):
            out = hostpath.empty((self.numel,), torch.float32)
            if not _native.sparse_unpack(tensor.contiguous().numpy(), self.count, self.scale_exp,
                                         out.numpy()):
                raise ValueError(f"sparse: the bitmask does not mark exactly {self.count} elements")
            return out.reshape(self.shape)
        where, data = tensor[:mask_bytes], tensor[mask_bytes:]
        if self.layout == "bitmask":
            weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=tensor.device)
            kept = ((where.reshape(-1, 1) & weights) != 0).reshape(-1)
            if bool(kept[self.numel:].any()) or int(torch.count_nonzero(kept)) != self.count:
                raise ValueError(f"sparse: the bitmask does not mark exactly {self.count} elements")
            positions = None  # found a piece at a time, below
        else:
            gaps = _unplanes(where, 4, torch.int32).long()
            if bool((gaps < 0).any()):
                raise ValueError("sparse: negative gap in the index list")
            positions = (gaps + 1).cumsum(0) - 1
            if self.count and int(positions[-1]) >= self.numel:
                raise ValueError(f"sparse: an index lies beyond {self.numel} elements")
        assert self.dtype.torch_dtype is not None
        compute = torch.float64 if self.dtype.itemsize == 8 else torch.float32
        values = _unplanes(data, 2, torch.float16).to(compute) * 2.0**self.scale_exp
        out = torch.zeros(self.numel, dtype=compute, device=tensor.device)
        if positions is not None:
            out[positions] = values
        else:
            # the marked positions a piece at a time: as int64 they are eight times the mask's
            # bytes, and on a device the weight's decoding is where a BitSnap group peaks
            taken = 0
            for start in range(0, self.numel, hostpath.TORCH_PIECE):
                marked = kept[start:start + hostpath.TORCH_PIECE].nonzero().reshape(-1)
                out[start:start + hostpath.TORCH_PIECE][marked] = values[taken:taken + marked.numel()]
                taken += marked.numel()
        return out.reshape(self.shape).to(self.dtype.torch_dtype)
