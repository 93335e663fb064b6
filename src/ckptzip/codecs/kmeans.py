"""Tensor to tensor: non-uniform (1-D k-means) quantization to one uint8 code per element.

Code 0 means exactly zero (a pruned element); codes 1..k index a sorted codebook fitted to the
non-zero values, in the linear domain or, for positive values with a wide range (Adam's second
moments), in the log domain. The codebook is stored in the header as half-precision numbers (as
ExCP does; their bit patterns, as ints) times one power of two, ``2**scale_exp``, so that fp16's
narrow range cannot flush small values to zero; in the log domain it holds the logarithms, which
fp16 covers for any range; ``precision="fp32"`` stores fp32 numbers.

The fit is Lloyd's algorithm on sorted data: with prefix sums, one iteration costs k binary
searches instead of a pass over the data, and a fixed initialisation makes it deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from .. import _native, dtypes, hostpath
from ..errors import ConfigError
from ..hostpath import flat_array, native
from .base import TensorToTensor, TransformContext, register

#: Most centroids a uint8 code can address (code 0 is zero).
MAX_CENTROIDS = 255
#: Values a fit looks at; larger tensors are fitted on a sample spread over the tensor. A
#: codebook of at most 255 centroids fitted to 64K values is within a fraction of a percent of the
#: whole's error, and sorting a whole tensor for its fit was a third of an ExCP save.
FIT_SAMPLES = 1 << 16
#: A prime above any tensor's element count: ``i * SPREAD mod n`` visits the tensor evenly
#: without following its rows (an every-k-th sample of a matrix takes the same columns).
SPREAD = 2_305_843_009_213_693_951  # 2**61 - 1
#: fp16's largest power of two below its maximum (65504): scaled centroids stay under it.
_HALF_TOP = 14
#: Lloyd steps of a fit at most (it stops earlier where the centroids settle).
LLOYD_ITERATIONS = 40
DOMAINS = ("linear", "log")
PRECISIONS = ("fp16", "fp32")


@dataclass(frozen=True)
class Fit:
    """Centroids fitted to sorted values, with each cluster's population and squared error."""

    centroids: np.ndarray  # float64, ascending
    counts: np.ndarray  # int64
    sse: float


def lloyd_sorted(values: np.ndarray, k: int, iterations: int = LLOYD_ITERATIONS) -> Fit:
    """1-D k-means of ascending float64 ``values`` into at most ``k`` clusters.

    Clusters of sorted data are contiguous, split at the midpoints between centroids, so one
    Lloyd step is k-1 binary searches of the midpoints plus sums read off prefix sums. The
    initialisation is fixed, which makes the fit deterministic: the middles of ``k - k // 2``
    equal-population slices (the bulk), and ``k // 2`` evenly spaced points over the range (the
    tails, which carry most of the squared error). It runs in the native core on the host
    (``core/search.c``, numpy's arithmetic op for op): the values are a sample, and its steps are
    too small for a device, or for numpy's per-call overhead.
    """
    centroids, counts = np.empty(k), np.empty(k, dtype=np.int64)
    found, sse = _native.lloyd_sorted(np.ascontiguousarray(values, dtype=np.float64), k,
                                      iterations, centroids, counts)
    return Fit(centroids[:found].copy(), counts[:found].copy(), sse)


def half_scale_exponent(max_abs: float) -> int:
    """The power of two that brings ``max_abs`` to fp16's top octave (0 for zero)."""
    if not max_abs > 0 or not math.isfinite(max_abs):
        return 0
    return math.frexp(max_abs)[1] - 1 - _HALF_TOP


def spread_sample(flat: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` elements of the 1-D ``flat``, at indices ``i * SPREAD mod n`` (distinct: the
    prime is coprime to ``n``), in int64 arithmetic that cannot overflow; all of them when
    ``count`` is not below ``n``."""
    n = flat.numel()
    if count >= n:
        return flat
    if native(flat) and flat.is_contiguous() and flat.element_size() <= 16:
        out = torch.empty(count, dtype=flat.dtype)
        _native.spread_gather(flat.view(torch.uint8).numpy(), out.view(torch.uint8).numpy(),
                              flat.element_size(), SPREAD % n)
        return out
    index = torch.arange(count, dtype=torch.int64, device=flat.device)
    # (i * SPREAD) mod n without overflow: SPREAD mod n is below n, i below 2**20, n below 2**43
    return flat[(index * (SPREAD % n)) % n]


def sample_sorted(values: torch.Tensor, limit: int = FIT_SAMPLES) -> np.ndarray:
    """``values`` (1-D), or a spread sample of ``limit`` of them, ascending, float64, on the
    host: sorted in float32 where they fit it (twice as fast as float64; widening after the sort
    gives the same values)."""
    sample = spread_sample(values, limit)
    if sample.dtype != torch.float64:
        sample = sample.float()
    return sorted_floats(sample.cpu().numpy()).astype(np.float64)


def sorted_floats(values: np.ndarray) -> np.ndarray:
    """A sorted copy of the float32 or float64 ``values`` (1-D): numpy's order, by the native
    core's radix sort (5x numpy's sort of a 128K sample here); numpy's sort where a value is
    NaN."""
    ordered = np.array(values, dtype=values.dtype, order="C")
    if ordered.dtype in (np.float32, np.float64) and _native.sort_floats(ordered, ordered.itemsize):
        return ordered
    return np.sort(values)


def nonzero_values(flat: torch.Tensor) -> torch.Tensor:
    """The non-zero elements of the 1-D ``flat``, in order (``flat[flat != 0]``; one native pass
    on the host)."""
    if not native(flat) or flat.dtype not in (torch.float32, torch.float64):
        # in pieces: a boolean index of the whole becomes int64 positions, 8 bytes an element
        out = torch.empty(int(torch.count_nonzero(flat)), dtype=flat.dtype, device=flat.device)
        kept = 0
        for start in range(0, flat.numel(), hostpath.TORCH_PIECE):
            piece = flat[start:start + hostpath.TORCH_PIECE]
            found = piece[piece != 0]
            out[kept:kept + found.numel()] = found
            kept += found.numel()
        return out
    values = flat.contiguous()
    out = hostpath.empty(values.shape, values.dtype)
    kept = _native.compact_nonzero(values.numpy(), out.numpy(), values.element_size())
    return out[:kept]


def _native_codes(flat: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """uint8 codes of the 1-D ``flat``: 0 where it is zero, else 1 + the number of the ascending
    ``thresholds`` below the value (the native core's pass on the host, torch's elsewhere)."""
    if not native(flat) or flat.dtype not in (torch.float32, torch.float64):
        mids = thresholds.to(flat.device)

        def assign(values: torch.Tensor) -> torch.Tensor:
            codes = torch.searchsorted(mids, values.double()) + 1
            return torch.where(values == 0, 0, codes).to(torch.uint8)

        # in pieces: the float64 and int64 copies stay small
        return hostpath.in_pieces(assign, torch.empty(flat.shape, dtype=torch.uint8,
                                                      device=flat.device), flat)
    values = flat.contiguous()
    codes = hostpath.empty(values.shape, torch.uint8)
    if thresholds.dtype != torch.float64 or not thresholds.is_cpu:
        thresholds = thresholds.double().cpu()
    _native.nearest_codes(values.numpy(), flat_array(thresholds), codes.numpy(),
                          values.element_size())
    return codes


@register
class KMeans(TensorToTensor):
    codec_id: ClassVar[str] = "kmeans"

    def __init__(
        self,
        k: int,
        dtype: str,
        domain: str = "linear",
        precision: str = "fp16",
        centroids: list[int] | list[float] | None = None,
        scale_exp: int = 0,
    ) -> None:
        if type(k) is not int or not 1 <= k <= MAX_CENTROIDS:
            raise ConfigError(f"kmeans: k must be an int in 1..{MAX_CENTROIDS}, not {k!r}")
        if domain not in DOMAINS or precision not in PRECISIONS:
            raise ConfigError(f"kmeans: domain {domain!r} / precision {precision!r} unsupported")
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"kmeans: output dtype {dtype!r} is not a real float type")
        self.k, self.dtype, self.domain, self.precision = k, out, domain, precision
        self.centroids = centroids  # learned by encode
        self.scale_exp = scale_exp

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "id": self.codec_id, "k": self.k, "dtype": self.dtype.name, "domain": self.domain,
            "precision": self.precision,
        }
        if self.centroids is not None:
            config.update(centroids=self.centroids, scale_exp=self.scale_exp)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> KMeans:
        centroids = config.get("centroids")
        scale_exp = config.get("scale_exp", 0)
        codec = cls(config["k"], config["dtype"], config["domain"], config["precision"])
        if not isinstance(centroids, list) or len(centroids) > codec.k:
            raise ValueError(f"kmeans: the codebook must hold at most k entries, not {centroids!r:.80}")
        if codec.precision == "fp16":
            # fp16 bit patterns, finite ones only (exponent field not all ones)
            valid = all(type(c) is int and 0 <= c < 1 << 16 and c & 0x7C00 != 0x7C00 for c in centroids)
        else:
            valid = all(type(c) in (int, float) and math.isfinite(c) for c in centroids)
        if not valid or type(scale_exp) is not int or abs(scale_exp) > 1000:
            raise ValueError(f"kmeans: bad codebook {centroids!r:.80} or scale exponent {scale_exp!r}")
        codec.centroids, codec.scale_exp = centroids, scale_exp
        return codec

    def fit(self, values: torch.Tensor) -> Fit:
        """Fit the codebook to the non-zero ``values`` (1-D) and store it; returns the fit in the
        fitting domain (before rounding)."""
        if self.domain == "log":
            if bool((values <= 0).any()):
                raise ConfigError("kmeans: the log domain needs positive values")
            # the sample's logarithms: those of the values the fit looks at, not of every one;
            # with the extremes, which a sample misses and a relative error is most sensitive
            # to (one second moment 10^7 below the sample's least, under a codebook that did not
            # reach it, was decoded 3,000 times too large in sqrt(v): the RMS relative error of
            # its million values was 3, and the tensor was stored bit-exact)
            if values.numel() > FIT_SAMPLES:
                values = torch.cat([spread_sample(values, FIT_SAMPLES - 2),
                                    values.min().reshape(1), values.max().reshape(1)])
            values = values.double().log()
        fit = lloyd_sorted(sample_sorted(values), self.k)
        self.set_table(fit.centroids)  # in the log domain the codebook holds logarithms
        return fit

    def set_table(self, table: np.ndarray) -> None:
        """Store ascending centroids (float64; logarithms in the log domain; at most ``k``) in
        the codebook's precision, whatever chose them."""
        if table.size > self.k or bool((table[1:] < table[:-1]).any()):
            raise ConfigError(f"kmeans: {table.size} centroids for k={self.k}, or not ascending")
        if self.precision == "fp16":
            self.scale_exp = 0 if self.domain == "log" else half_scale_exponent(
                float(np.abs(table).max()) if table.size else 0.0)
            halves = (table * 2.0**-self.scale_exp).astype(np.float16)
            self.centroids = halves.view(np.uint16).tolist()  # ints
        else:
            self.centroids = table.astype(np.float32).tolist()  # floats, each a float32's value

    def scale_table(self, factor: float) -> None:
        """Multiply every centroid of a linear-domain codebook by ``factor`` > 0."""
        if self.domain != "linear" or not factor > 0 or not math.isfinite(factor):
            raise ConfigError(f"kmeans: cannot scale a {self.domain} codebook by {factor!r}")
        self.set_table(self.table()[1:].numpy() * factor)

    def table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Value of each code, code 0 (zero) first, in float64. Built once per codebook and
        device (a search encodes and decodes with one codebook several times); callers only read
        it."""
        if self.centroids is None:
            raise ConfigError("kmeans: no codebook yet; encode first")
        key = (self.scale_exp, self.domain, self.precision, str(device))
        cached = getattr(self, "_table", None)  # (the centroids' list, key, table)
        if cached is not None and cached[0] is self.centroids and cached[1] == key:
            return cached[2]
        table = self._build_table(device)
        self._table = (self.centroids, key, table)
        return table

    def _build_table(self, device: torch.device | str) -> torch.Tensor:
        # in numpy on the host (the same float64 products): a search builds hundreds of tables,
        # and each torch call lets go of the GIL
        centroids = self.centroids
        assert centroids is not None  # table() checked
        table = np.zeros(len(centroids) + 1)
        if self.precision == "fp16":
            halves = np.array(centroids, dtype=np.uint16).view(np.float16)
            table[1:] = halves.astype(np.float64) * 2.0**self.scale_exp
        else:
            table[1:] = centroids
        built = torch.from_numpy(table)
        if self.domain == "log":
            built[1:] = built[1:].exp()  # torch's exp, as a reader's
        return built if torch.device(device).type == "cpu" else built.to(device)

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        """Codes of ``tensor`` (zeros stay code 0); fits the codebook first unless it has one."""
        flat = tensor.reshape(-1)
        if self.centroids is None:
            self.fit(nonzero_values(flat))
        full = self.table(tensor.device)
        if full.numel() == 1:
            return torch.zeros(tensor.shape, dtype=torch.uint8, device=tensor.device)
        # nearest codebook entry in the fitting domain: below the midpoint between two entries,
        # the lower one. The log domain's midpoints are compared as their exponentials, which
        # orders the same without a logarithm per element.
        if self.domain == "log":
            keys = full[1:].log()
            mids = ((keys[1:] + keys[:-1]) / 2).exp()
        elif full.is_cpu:
            table = full.numpy()  # numpy's sums and halves: the same float64 arithmetic
            mids = torch.from_numpy((table[2:] + table[1:-1]) / 2)
        else:
            mids = (full[2:] + full[1:-1]) / 2
        return _native_codes(flat, mids).reshape(tensor.shape)

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        if tensor.dtype != torch.uint8:
            raise ValueError(f"kmeans: codes must be uint8, not {tensor.dtype}")
        table = self.table(tensor.device)
        assert self.dtype.torch_dtype is not None
        compute = torch.float64 if self.dtype.itemsize == 8 else torch.float32
        if native(tensor):
            codes = tensor.contiguous()
            out = hostpath.empty(codes.shape, compute)
            done = _native.table_lookup(flat_array(codes), flat_array(table),
                                        flat_array(out), out.element_size())
            if done != codes.numel():
                raise ValueError(f"kmeans: code {int(codes.reshape(-1)[done])} beyond a codebook "
                                 f"of {table.numel() - 1}")
            return hostpath.cast(out, self.dtype.torch_dtype)
        if tensor.numel() and int(tensor.max()) >= table.numel():
            raise ValueError(f"kmeans: code {int(tensor.max())} beyond a codebook of {table.numel() - 1}")
        lookup, dtype = table.to(compute), self.dtype.torch_dtype
        out = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
        return hostpath.in_pieces(lambda codes: lookup[codes.long()].to(dtype), out, tensor)
