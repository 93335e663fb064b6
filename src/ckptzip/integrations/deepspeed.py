"""DeepSpeed: a ``CheckpointEngine`` that writes ``engine.save_checkpoint``'s files as ckptzip
containers (the names, ``mp_rank_00_model_states.pt`` and so on, stay DeepSpeed's).

::

    from ckptzip.integrations.deepspeed import attach

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, ...)
    attach(engine)
    engine.save_checkpoint("ckpt")
    engine.load_checkpoint("ckpt")

ZeRO's optimizer states (stages 1 to 3) hold three kinds of DeepSpeed object beside their tensors:
the loss scaler (``LossScaler``, ``DynamicLossScaler``), each parameter's slice of the flat
partition (``fragment_address``) and the stage (``ZeroStageEnum``). The engine stores each as a
plain dict (an object's attributes, an enum's value) tagged with its class's name, and rebuilds it
on load from :data:`OBJECT_CLASSES` only: a file cannot make the load construct anything else (it
raises :class:`ckptzip.FormatError` naming the key), and no code of the file runs. Any other
object (a set, a class of the user's) raises :class:`ckptzip.UnsupportedError` naming its key
when saved.

DeepSpeed's own tools (``zero_to_fp32.py``, which it writes beside the checkpoints) read them with
``torch.load``. :func:`export_torch` (``python -m ckptzip.integrations.deepspeed CKPT_DIR OUT_DIR``)
writes a copy of the folder as DeepSpeed would have, for those tools.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import os
import shutil
import sys
from collections import OrderedDict
from typing import Any

import torch

from ..api import load, save
from ..container import MAGIC
from ..errors import DependencyError, Error, FormatError
from ..parallel import rank_threads
from ..storage import atomic_write
from . import standalone_mode

try:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
except ImportError:
    raise DependencyError(
        "ckptzip's DeepSpeed integration needs deepspeed: DS_BUILD_OPS=0 pip install deepspeed"
    ) from None


#: The key that marks a dict as a DeepSpeed object's attributes; its value names the class.
OBJECT_TAG = "__ckptzip_deepspeed_object__"


#: Where the DeepSpeed classes its states hold are defined, and their names.
OBJECT_SOURCES = (
    ("deepspeed.runtime.fp16.loss_scaler", ("LossScaler", "DynamicLossScaler")),
    ("deepspeed.utils.tensor_fragment", ("fragment_address",)),
    ("deepspeed.runtime.zero.config", ("ZeroStageEnum",)),
)


def _known_classes() -> dict[str, type]:
    classes: list[type] = []
    for module_name, names in OBJECT_SOURCES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # another DeepSpeed's layout: its states will name what they hold
            continue
        classes += [getattr(module, name) for name in names if hasattr(module, name)]
    return {f"{cls.__module__}.{cls.__qualname__}": cls for cls in classes}


#: The DeepSpeed classes a state may hold, by qualified name: the ones a load rebuilds.
OBJECT_CLASSES: dict[str, type] = _known_classes()


def to_plain(value: Any) -> Any:
    """``value`` with every DeepSpeed object of :data:`OBJECT_CLASSES` in it (at any depth of
    dicts, lists and tuples) replaced by a dict tagged with its class's name (its attributes, or
    an enum's value); the containers are new, the caller's state is not changed, tensors are not
    copied."""
    kind = type(value)
    if kind in (dict, OrderedDict):
        return kind((key, to_plain(item)) for key, item in value.items())
    if kind in (list, tuple):
        return kind(to_plain(item) for item in value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if OBJECT_CLASSES.get(name) is kind:
        if isinstance(value, enum.Enum):
            return {OBJECT_TAG: name, "value": value.value}
        return {OBJECT_TAG: name, "attributes": to_plain(dict(vars(value)))}
    return value


def from_plain(value: Any, path: str = "") -> Any:
    """The inverse of :func:`to_plain`: each tagged dict becomes its object again (an enum by its
    value; another object built without calling its ``__init__``, its attributes set as stored),
    for the classes of :data:`OBJECT_CLASSES` only."""
    kind = type(value)
    if kind in (dict, OrderedDict):
        if OBJECT_TAG in value:
            return _rebuild(value, path)
        return kind((key, from_plain(item, f"{path}.{key}" if path else str(key)))
                    for key, item in value.items())
    if kind in (list, tuple):
        return kind(from_plain(item, f"{path}[{index}]") for index, item in enumerate(value))
    return value


def _rebuild(tagged: dict[str, Any], path: str) -> Any:
    name = tagged[OBJECT_TAG]
    cls = OBJECT_CLASSES.get(name) if isinstance(name, str) else None
    field = "value" if cls is not None and issubclass(cls, enum.Enum) else "attributes"
    where = path or "the state"
    if cls is None:
        raise FormatError(
            f"{where}: a DeepSpeed object of class {name!r:.100}, which ckptzip does not rebuild "
            f"under this DeepSpeed (it rebuilds {', '.join(sorted(OBJECT_CLASSES))}); load the file "
            "where the DeepSpeed version that saved it is installed")
    attributes = tagged.get("attributes")
    if set(tagged) != {OBJECT_TAG, field} or (field == "attributes" and not (
            type(attributes) is dict and all(type(key) is str for key in attributes))):
        raise FormatError(f"{where}: a damaged DeepSpeed {name} (keys {sorted(map(str, tagged))!r:.100});"
                          " the file was not written by ckptzip's DeepSpeed engine")
    if field == "value":
        try:
            return cls(tagged["value"])
        except (ValueError, TypeError):
            raise FormatError(f"{where}: {tagged['value']!r:.50} is not a value of DeepSpeed's "
                              f"{name}; load the file with the DeepSpeed version that saved it") from None
    rebuilt: Any = object.__new__(cls)
    rebuilt.__dict__.update(from_plain(attributes, path))
    return rebuilt


def is_ckptzip_file(path: str) -> bool:
    """Whether the local file ``path`` starts as a ckptzip container does."""
    with open(path, "rb") as handle:
        return handle.read(len(MAGIC)) == MAGIC


class CkptzipCheckpointEngine(CheckpointEngine):
    """DeepSpeed's checkpoint engine interface over :func:`ckptzip.save`/:func:`ckptzip.load`.
    Each file is written atomically, so ``commit`` has nothing left to do. ``threads``: per rank;
    None shares the cores of the node among its ranks (torchrun's ``LOCAL_WORLD_SIZE``), as every
    rank saves its partition at once."""

    def __init__(
        self, config_params: Any = None, *, mode: str = "lossless", threads: int | None = None,
        **mode_options: Any,
    ) -> None:
        super().__init__(config_params)
        self.name = "CkptzipCheckpointEngine"
        self.mode = standalone_mode(mode, "DeepSpeed's checkpoint engine")
        # every rank saves its partition at once: by default they share the node's cores
        self.threads = rank_threads() if threads is None else threads
        self.mode_options = mode_options

    def create(self, info: Any) -> None:
        """Nothing to prepare: files appear complete or not at all."""

    def save(self, state_dict: Any, path: str) -> None:
        save(to_plain(state_dict), path, mode=self.mode, threads=self.threads, **self.mode_options)

    def load(self, path: str, map_location: Any = None) -> Any:
        """Read a file; a callable ``map_location`` (DeepSpeed passes ``lambda s, loc: s``) means
        "where it was saved", which for a .ckz is the CPU. A file that is not a ckptzip container
        (written before the run took ckptzip on) is read by DeepSpeed's own torch engine, as it
        would have been without ckptzip."""
        if not is_ckptzip_file(path):
            return TorchCheckpointEngine().load(path, map_location=map_location)
        location = "cpu" if map_location is None or callable(map_location) else map_location
        return from_plain(load(path, map_location=location, threads=self.threads))

    def commit(self, info: Any) -> bool:
        return True


def attach(engine: Any, **options: Any) -> CkptzipCheckpointEngine:
    """Make a ``DeepSpeedEngine`` save and load its checkpoints with ckptzip."""
    checkpoint_engine = CkptzipCheckpointEngine(**options)
    engine.checkpoint_engine = checkpoint_engine
    return checkpoint_engine


def export_torch(checkpoint_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                 threads: int | None = None) -> list[str]:
    """Write ``checkpoint_dir`` (what ``engine.save_checkpoint`` wrote through ckptzip) to
    ``out_dir`` as DeepSpeed writes it: each ckptzip container decoded, its DeepSpeed objects
    rebuilt and saved with ``torch.save`` under its own name, every other file (``latest``,
    ``zero_to_fp32.py``) copied, so that DeepSpeed's tools read ``out_dir``. Each file is written
    atomically; returns the paths of the files it decoded, relative to ``out_dir``."""
    source, target = os.fspath(checkpoint_dir), os.fspath(out_dir)
    if not os.path.isdir(source):
        raise Error(f"{source}: not a directory; give the folder engine.save_checkpoint wrote")
    if os.path.realpath(source) == os.path.realpath(target):
        raise Error(f"{target}: the export would overwrite the checkpoints; choose another folder")
    decoded = []
    for root, _, names in sorted(os.walk(source)):
        relative = os.path.relpath(root, source)
        os.makedirs(os.path.join(target, relative), exist_ok=True)
        for name in sorted(names):
            path, copy = os.path.join(root, name), os.path.join(target, relative, name)
            if not is_ckptzip_file(path):
                shutil.copy2(path, copy)
                continue
            state = from_plain(load(path, threads=threads))
            with atomic_write(copy) as out:
                torch.save(state, out)
            decoded.append(os.path.normpath(os.path.join(relative, name)))
    return decoded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ckptzip.integrations.deepspeed",
        description="Write a DeepSpeed checkpoint folder saved through ckptzip as DeepSpeed writes "
                    "it (torch.save files), for DeepSpeed's own tools such as zero_to_fp32.py.",
        epilog="example: python -m ckptzip.integrations.deepspeed ckpt ckpt-torch && "
               "python ckpt-torch/zero_to_fp32.py ckpt-torch model.bin")
    parser.add_argument("checkpoint_dir", help="the folder engine.save_checkpoint wrote")
    parser.add_argument("out_dir", help="where the copy goes (created; files in it are replaced)")
    parser.add_argument("-T", "--threads", type=int, default=None, help="decoding threads")
    args = parser.parse_args(argv)
    try:
        decoded = export_torch(args.checkpoint_dir, args.out_dir, threads=args.threads)
    except Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(decoded)} ckptzip files written as torch.save files to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
