"""Adapters that put ckptzip under the checkpointing of training frameworks, one file each:

* :mod:`ckptzip.integrations.hf`: Hugging Face ``Trainer`` (``CkptzipTrainer``, ``CkptzipTrainerMixin``);
* :mod:`ckptzip.integrations.accelerate`: ``Accelerator.save_state``/``load_state`` hooks;
* :mod:`ckptzip.integrations.lightning`: a Lightning ``CheckpointIO`` plugin, and a callback
  that saves deltas (lossy too) into a :class:`ckptzip.CheckpointManager`;
* :mod:`ckptzip.integrations.deepspeed`: a DeepSpeed ``CheckpointEngine``.

Each imports its framework only when it is imported itself, so ``import ckptzip`` never needs one.
None holds compression logic: they call :func:`ckptzip.save`, :func:`ckptzip.load` or the
manager.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from ..errors import ConfigError, DependencyError


def require(module: str, package: str) -> ModuleType:
    """Import ``module`` or say which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DependencyError(
            f"ckptzip's {package} integration needs {package}: pip install {package} "
            f"(or pip install 'ckptzip[examples]')"
        ) from None


def check_mode(mode: str, options: dict[str, Any]) -> None:
    """Refuse an unknown mode or mode option now, as the manager's and DCP's constructors do,
    not at the first checkpoint after training ran to it. ``options`` are what the integration
    passes on to :func:`ckptzip.save` (its own keywords, such as ``storage_options``, pass)."""
    import inspect

    from ..api import save
    from ..modes import policy_for

    own = set(inspect.signature(save).parameters)
    policy_for(mode, **{k: v for k, v in options.items() if k not in own})


def standalone_mode(mode: str, integration: str) -> str:
    """``mode``, where it does what it says for files written standalone (no base: the framework
    names, rotates and deletes them on its own): lossless only. A lossy mode codes deltas against
    a base, and without one every file would be a lossless keyframe, none of its gain: that is
    refused here, at the start, rather than found in the ratios later."""
    from ..modes import MODES

    if mode not in MODES:  # a misspelt mode is unknown, not lossy
        raise ConfigError(f"{integration}: unknown mode {mode!r}; {integration} takes "
                          f"mode='lossless' (the modes: {', '.join(sorted(MODES))})")
    if mode != "lossless":
        raise ConfigError(
            f"{integration} writes each checkpoint file standalone (the framework may delete any "
            f"of them), and mode={mode!r} codes deltas against a base checkpoint: every file would "
            "be a lossless keyframe, none of the mode's gain. Use mode='lossless' here; for lossy "
            "deltas save the training state with ckptzip.CheckpointManager (under Lightning: its "
            "callback ckptzip.integrations.lightning.CkptzipCheckpoint), or with "
            "torch.distributed.checkpoint and ckptzip.dcp.CompressedWriter(base=...) "
            "(docs/INTEGRATIONS.md)")
    return mode
