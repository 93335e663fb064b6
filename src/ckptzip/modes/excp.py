"""``mode="excp"``: ExCP (Li et al., ICML 2024) as published, with ckptzip's entropy coder.

Per weight, against the base checkpoint's reconstruction (closed loop):

1. residual ``dW = W - W_hat_base``;
2. weight pruning: keep ``|dW| > min(2.5, alpha / sqrt(mean(exp_avg_sq))) * median(|dW|)``;
3. momentum pruning: keep ``exp_avg`` and ``exp_avg_sq`` where ``|exp_avg| > beta * mean(|exp_avg|)``
   and the pruned ``dW`` is non-zero (one mask for both);
4. 1-D k-means of the non-zero values of each of the three, ``2**bits - 1`` centroids stored as
   fp16 (times a power of two, see :mod:`ckptzip.codecs.kmeans`), code 0 meaning pruned; a tensor
   with no more non-zeros than centroids is stored exactly (its values become fp32 centroids).

Codes are one uint8 per element, coded by ckptzip's entropy coder instead of ExCP's 7-Zip. A weight
without moments (frozen, or unpaired) is pruned with the cap, ``2.5 * median(|dW|)``; moments
without their weight are pruned on their own criterion alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .. import hostpath
from ..chain import Base
from ..codecs import KMeans
from ..errors import ConfigError
from ..policy import DEFAULT_CHUNK_BYTES, Encoded, Exact
from ..tree import Leaf
from .common import GroupValues, JointPolicy, finish, finished

#: ExCP's cap on the weight-pruning multiplier.
MAX_STRENGTH = 2.5


class ExcpPolicy(JointPolicy):
    mode = "excp"

    def __init__(self, alpha: float = 5e-5, beta: float = 2.0, bits: int = 4,
                 pairing: Mapping[str, int | str] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, scope: str = "floats",
                 keep_exact: Sequence[str] = ()) -> None:
        if (type(alpha) not in (int, float) or not 0 < alpha < float("inf")
                or type(beta) not in (int, float) or not 0 <= beta < float("inf")
                or type(bits) is not int or not 1 <= bits <= 8):
            raise ConfigError(f"excp: need alpha > 0, beta >= 0 (finite numbers) and bits in "
                              f"1..8, not {alpha!r}, {beta!r}, {bits!r}")
        super().__init__(pairing, chunk_bytes, scope, keep_exact)
        self.alpha, self.beta, self.centroids = alpha, beta, 2**bits - 1

    def plan_group(self, leaves: list[Leaf], values: GroupValues,
                   base: Base) -> dict[int, Encoded | Exact]:
        plans: dict[int, Encoded | Exact] = {}
        kept: torch.Tensor | None = None
        group = values.group
        if values.weight is not None and values.w is not None and values.w_base is not None:
            delta = hostpath.subtract(values.w, values.w_base)
            strength = MAX_STRENGTH
            if values.v is not None and values.v.numel():
                strength = min(MAX_STRENGTH, self.alpha / max(float(values.v.mean()), 1e-300) ** 0.5)
            kept = delta.abs() > strength * hostpath.median_magnitude(delta)
            assert group.weight is not None
            plans[group.weight] = self._store(values.weight, delta * kept, residual=True,
                                              base=values.w_base)
        if values.m is not None:
            mask = values.m.abs() > self.beta * values.m.abs().mean()
            if kept is not None:
                mask &= kept
            for index, moment in ((group.exp_avg, values.m), (group.exp_avg_sq, values.v)):
                if index is not None and moment is not None:
                    plans[index] = self._store(leaves[index], moment * mask)
        return plans

    def _store(self, leaf: Leaf, array: torch.Tensor, *, residual: bool = False,
               base: torch.Tensor | None = None) -> Encoded | Exact:
        """Quantize; with no more non-zeros than centroids, each value is its own fp32 centroid,
        which stores the tensor as is. The error is bounded by that of storing nothing (the
        update or the moment left out): pruning drops elements, and a centroid is its cluster's
        mean; a plan that misses the bound is stored bit-exact."""
        exact = hostpath.count_nonzero(array) <= self.centroids
        quantizer = KMeans(self.centroids, leaf.dtype.name, "linear", "fp32" if exact else "fp16")
        return finished(finish(leaf, array, quantizer, residual=residual, base=base))
