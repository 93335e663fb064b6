"""Element types: the names stored in a ``.ckz`` file and how each is laid out in byte planes.

A ``.ckz`` stores every tensor as raw little-endian element bytes plus a dtype *name*. The name is
torch's (``"bfloat16"``, ``"float8_e4m3fn"``) or numpy's for numpy-only types. The byte-plane
layout tells the lossless path how to split elements: IEEE-style floats of two or more bytes are
rotated left by one bit first, so that the sign moves to the lowest bit and the whole 8-bit exponent
of bf16/fp32 lands in one byte (FIELD.md, after zipnn).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import UnsupportedError


@dataclass(frozen=True)
class DType:
    """One element type as ckptzip stores it."""

    name: str
    itemsize: int
    #: ``float``, ``complex``, ``int``, ``uint``, ``bool`` or ``bits`` (opaque bytes).
    kind: str
    torch_dtype: torch.dtype | None
    numpy_dtype: np.dtype | None

    @property
    def is_float(self) -> bool:
        return self.kind in ("float", "complex")

    @property
    def plane_layout(self) -> tuple[int, int]:
        """``(plane_width, rotate_bits)`` for the byte-plane split.

        Complex numbers are pairs of floats, so they split like their component type.
        """
        if self.kind == "complex":
            return self.itemsize // 2, 1
        if self.kind == "float" and self.itemsize >= 2:
            return self.itemsize, 1
        return self.itemsize, 0


_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def _kind_of(dt: torch.dtype) -> str:
    if dt.is_complex:
        return "complex"
    if dt.is_floating_point:
        return "float"
    if dt == torch.bool:
        return "bool"
    name = str(dt).removeprefix("torch.")
    if name.startswith("uint"):
        return "uint"
    if name.startswith("int"):
        return "int"
    return "bits"


def _build_tables() -> tuple[dict[str, DType], dict[torch.dtype, DType]]:
    by_name: dict[str, DType] = {}
    by_torch: dict[torch.dtype, DType] = {}
    for value in vars(torch).values():
        if not isinstance(value, torch.dtype) or value in _QUANTIZED or value in by_torch:
            continue
        name = str(value).removeprefix("torch.")
        try:
            np_dtype: np.dtype | None = np.dtype(name)
        except TypeError:
            np_dtype = None
        if np_dtype is not None and np_dtype.itemsize != value.itemsize:
            np_dtype = None
        entry = DType(name, value.itemsize, _kind_of(value), value, np_dtype)
        by_name[name] = entry
        by_torch[value] = entry
    return by_name, by_torch


_BY_NAME, _BY_TORCH = _build_tables()
#: The torch dtypes a leaf may have.
TORCH_DTYPES = frozenset(_BY_TORCH)


def from_name(name: str) -> DType:
    """The dtype stored under ``name`` in a file; :class:`UnsupportedError` if unknown here."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedError(
            f"unknown element type {name!r}: this file was written by a torch/numpy with types "
            f"this installation lacks; upgrade torch and ckptzip"
        ) from None


def from_torch(dtype: torch.dtype, where: str) -> DType:
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise UnsupportedError(
            f"{where}: tensors of dtype {dtype} cannot be stored (quantized tensors carry scales "
            f"outside their data); store t.int_repr() with its q_scale()/q_zero_point(), "
            f"or t.dequantize()"
        ) from None


def from_numpy(dtype: np.dtype, where: str) -> DType:
    if dtype.kind in "biufc" and not dtype.fields:
        name = dtype.newbyteorder("=").name
        entry = _BY_NAME.get(name)
        if entry is not None and entry.itemsize == dtype.itemsize:
            return entry
    raise UnsupportedError(
        f"{where}: numpy arrays of dtype {dtype} cannot be stored without pickle; "
        f"convert to a numeric dtype (bool, int, uint, float, complex) first"
    )
