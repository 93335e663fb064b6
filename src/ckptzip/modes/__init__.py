"""The lossy modes: ``excp`` (ExCP as published), ``bitsnap`` (BitSnap) and ``adaptive``
(ckptzip's own policy under an error budget). Importing this package registers them."""

from ..policy import register_mode
from .adaptive import AdaptivePolicy
from .bitsnap import BitsnapPolicy
from .common import NonFiniteWarning
from .excp import ExcpPolicy
from .pairing import PairingWarning

register_mode("excp", ExcpPolicy)
register_mode("bitsnap", BitsnapPolicy)
register_mode("adaptive", AdaptivePolicy)

__all__ = ["AdaptivePolicy", "BitsnapPolicy", "ExcpPolicy", "NonFiniteWarning", "PairingWarning"]
