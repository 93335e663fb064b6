"""A fidelity guard for lossy checkpoints: evaluate what was written against what was meant.

No published lossy method checks its own output against the training it serves. With a guard,
:class:`ckptzip.CheckpointManager` evaluates, after each lossy delta it writes, the state as a
reader decodes it and the true state with a function the user chooses (a loss on a held-out
batch, say), and when the decoded state is worse by more than ``max_gap`` (relative), it rewrites
that checkpoint losslessly (still a delta against the same base, so the chain goes on), logs it,
and counts it. The evaluation runs where the write runs: in the background for async saves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, Error

log = logging.getLogger("ckptzip")

#: ``guard(state) -> float``: a figure of merit of a state where lower is better (a loss).
GuardFunction = Callable[[Any], float]


@dataclass(frozen=True)
class GuardEvent:
    """One checkpoint the guard judged: the step, the true and decoded figures, the relative gap,
    and whether it was rewritten losslessly."""

    step: int
    true_value: float
    decoded_value: float
    gap: float
    rewritten: bool


@dataclass
class FidelityGuard:
    """``function`` evaluates a state (lower is better); a lossy checkpoint whose decoded state
    scores worse than the true one by more than ``max_gap`` of the true one's magnitude is
    rewritten losslessly."""

    function: GuardFunction
    max_gap: float
    events: list[GuardEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise ConfigError(f"guard must be a function state -> float, not {self.function!r}")
        if type(self.max_gap) not in (int, float) or not 0 <= self.max_gap < math.inf:
            raise ConfigError(f"max_gap must be a finite number >= 0 (a relative gap such as "
                              f"0.005), not {self.max_gap!r}")

    @property
    def rewrites(self) -> int:
        """How many checkpoints the guard had rewritten losslessly."""
        return sum(event.rewritten for event in self.events)

    def _evaluate(self, state: Any, what: str, step: int) -> float:
        """The guard's figure for ``state`` as a float (an infinity or a NaN included); an Error
        where it returns no number at all."""
        value = self.function(state)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise Error(f"step {step}: the fidelity guard returned {value!r:.80} for the {what} "
                        f"state; it must return a number (a loss on a fixed batch)") from None

    def check(self, step: int, true_state: Any, decoded_state: Any,
              rewrite: Callable[[], object]) -> GuardEvent:
        """Judge one checkpoint; ``rewrite()`` writes it again losslessly when it fails. A
        decoded state that scores an infinity or a NaN where the true one scores a finite number
        fails; where the true one scores none, or the guard raises or returns no number, the
        checkpoint cannot be judged and is rewritten too (then the guard's error is raised):
        no lossy checkpoint stays unjudged."""
        try:
            truth = self._evaluate(true_state, "true", step)
            decoded = self._evaluate(decoded_state, "decoded", step)
        except BaseException:
            rewrite()
            self.events.append(GuardEvent(step, math.nan, math.nan, math.nan, True))
            log.warning("ckptzip guard: step %d: the guard failed, so the checkpoint could not be "
                        "judged; rewritten losslessly", step)
            raise
        if not math.isfinite(truth):
            gap, failed = math.nan, True
            why = f"the guard scored the true state {truth!r}, so the decoded one cannot be judged"
        else:
            # an infinite or NaN decoded score is the largest gap there is
            gap = ((decoded - truth) / max(abs(truth), 1e-30) if math.isfinite(decoded)
                   else math.inf)
            failed = gap > self.max_gap
            why = (f"decoded {decoded:.6g} against {truth:.6g} (gap {100 * gap:+.3g}% > "
                   f"{100 * self.max_gap:.3g}%)")
        if failed:
            rewrite()  # logged once done: a rewrite that fails raises instead
            log.warning("ckptzip guard: step %d %s; rewritten losslessly", step, why)
        event = GuardEvent(step, truth, decoded, gap, failed)
        self.events.append(event)
        return event
