"""Adapters that put ckptzip under the checkpointing of training frameworks, one file each:

* :mod:`ckptzip.integrations.hf`: Hugging Face ``Trainer`` (``CkptzipTrainer``, ``CkptzipTrainerMixin``);
* :mod:`ckptzip.integrations.accelerate`: ``Accelerator.save_state``/``load_state`` hooks;
* :mod:`ckptzip.integrations.lightning`: a Lightning ``CheckpointIO`` plugin;
* :mod:`ckptzip.integrations.deepspeed`: a DeepSpeed ``CheckpointEngine``.

Each imports its framework only when it is imported itself, so ``import ckptzip`` never needs one.
None holds compression logic: they call :func:`ckptzip.save` and :func:`ckptzip.load`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import DependencyError


def require(module: str, package: str) -> ModuleType:
    """Import ``module`` or say which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DependencyError(
            f"ckptzip's {package} integration needs {package}: pip install {package} "
            f"(or pip install 'ckptzip[examples]')"
        ) from None
