"""Whether training went on from a lossy base's reconstruction or from the true state.

A lossy delta codes ``r = W - W^base`` (closed loop). When training resumed from the decoded base,
``r`` is the update ``dW`` training made since. When it went on from the true state (the usual
case: a checkpoint is written and training continues), ``r = dW - e``, where ``e`` is the base's
own error. An error budget relative to ``|r|`` then re-codes ``e`` every time, and a chain's error
follows ``e' = b sqrt(|dW|^2 + e^2)``: bounded only for ``b < 1``. Relative to ``|dW|`` it is
bounded for any budget, so the adaptive mode estimates ``|dW|^2`` as ``|r|^2 - |e|^2`` when the
update carries the base's error and ``|r|^2`` when it does not, and this module tells which.

**The test.** The adaptive mode's rounded weights carry a *mark* (:class:`~ckptzip.codecs.Mark`):
``a * w * step`` in their reconstruction, with ``w`` a seeded uniform draw independent of the data
and of the rounding, so it is part of the base's error. An update that carries that error has a
least-squares slope of ``-a`` on ``w * step``; an update made by training that resumed from the
reconstruction has a slope of 0 (training's response to noise this small is not measurable: on
the fidelity model's step-100 delta the slope of such an update on the dither itself was 0.001).
The fraction carried is ``-slope / a``, clamped to [0, 1], measured over every marked weight of
the checkpoint together: whether training resumed is one fact about the whole state.

Where it cannot be measured (no marked weight in the base, too few elements) the updates are taken
to carry all of the base's error: that can only make the grid finer than needed, never let a
chain's error grow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from ..chain import Base
from ..codecs import Mark

#: The amount of the mark on the adaptive mode's rounded weights: the error's energy grows by its
#: square (1.6%), and the slope that tells the two cases apart is 1/8, against a noise of about
#: ``1.3 / sqrt(elements)`` (0.002 on the fidelity model).
MARK = 0.125
#: Fewest marked elements the slope is measured on before it is trusted (its noise is then below
#: 0.02, a sixth of the mark).
MIN_ELEMENTS = 4096


def base_mark(base: Base, name: str) -> Mark | None:
    """The mark the base file's ``name`` carries, if it does."""
    stored = base.stored(name)
    if stored is None:
        return None
    return next((t for t in stored.pipeline.transforms if isinstance(t, Mark)), None)


def base_error_energy(base: Base, name: str) -> float:
    """``|e|^2`` of the base's ``name``: the squared error its header records (``mse`` times the
    element count), 0 where it records none (an exact tensor)."""
    stored = base.stored(name)
    if stored is None:
        return 0.0
    record = stored.extra.get("error")
    mse = record.get("mse") if isinstance(record, dict) else None
    if not isinstance(mse, (int, float)) or not (math.isfinite(mse) and mse > 0):
        return 0.0
    return float(mse) * math.prod(stored.shape)


def carried_fraction(updates: Iterable[tuple[torch.Tensor, Mark]]) -> float:
    """How much of their bases' errors the updates ``r`` carry: ``-slope / mark`` of ``r`` on the
    bases' marks, over all of them together, in [0, 1]; 1 when too few elements to tell."""
    covariance = scaled = 0.0
    count = 0
    for update, mark in updates:
        pattern = mark.pattern(update.shape, update.device)
        covariance += float((update.double() * pattern).sum())
        scaled += mark.amount * float(pattern.pow(2).sum())
        count += update.numel()
    if count < MIN_ELEMENTS or not scaled > 0:
        return 1.0
    return min(max(-covariance / scaled, 0.0), 1.0)
