"""The modes: ``lossless`` (:class:`~ckptzip.policy.LosslessPolicy`) and the lossy ``excp`` (ExCP
as published), ``bitsnap`` (BitSnap) and ``adaptive`` (ckptzip's own policy under an error
budget), by name. A mode is a policy that picks a pipeline per tensor; :func:`policy_for` makes
one from its name and options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..policy import LosslessPolicy, Policy
from .adaptive import AdaptivePolicy
from .bitsnap import BitsnapPolicy
from .common import KeepExactWarning, NonFiniteWarning, SharedViewsWarning, UnhandledStateWarning
from .excp import ExcpPolicy
from .pairing import PairingWarning

PolicyFactory = Callable[..., Policy]

#: Modes by name; each factory takes the mode's options as keyword arguments.
MODES: dict[str, PolicyFactory] = {
    "lossless": LosslessPolicy,
    "excp": ExcpPolicy,
    "bitsnap": BitsnapPolicy,
    "adaptive": AdaptivePolicy,
}


def register_mode(name: str, factory: PolicyFactory) -> None:
    """Make ``factory`` (a policy class, or any callable taking the mode's options) the mode
    ``name``."""
    MODES[name] = factory


def policy_for(mode: str, **options: Any) -> Policy:
    factory = MODES.get(mode)
    if factory is None:
        raise ConfigError(f"unknown mode {mode!r}; choose one of: {', '.join(MODES)}")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"mode {mode!r}: bad options {sorted(options)}: {exc}") from None


__all__ = [
    "MODES",
    "AdaptivePolicy",
    "BitsnapPolicy",
    "ExcpPolicy",
    "KeepExactWarning",
    "NonFiniteWarning",
    "PairingWarning",
    "SharedViewsWarning",
    "UnhandledStateWarning",
    "policy_for",
    "register_mode",
]
