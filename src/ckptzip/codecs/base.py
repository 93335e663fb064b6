"""The codec contract: typed stages with JSON configs and a registry (numcodecs/zarr style).

Five kinds of stage, by what they take and give, in pipeline order:

* :class:`TensorToTensor` -- whole-tensor transforms run before chunking (lossy residuals against
  a reconstructed base, pruning, quantization);
* :class:`ChunkResidual` -- the exact residual of a chunk against the base's co-located chunk
  (:mod:`.residual`): elementwise, so it runs per chunk;
* :class:`TensorToBytes` -- the serializer: one chunk of raw element bytes to one buffer made of
  ``segments`` equal parts (byte planes);
* :class:`BytesToBytes` -- compressors: a buffer (coding each of its segments on its own) to a
  self-describing stream;
* :class:`ConditionedCoder` -- a serializer and compressor in one whose statistics come from the
  base's co-located chunk (:mod:`.context`): in place of the two, after a residual.

A codec's :meth:`Codec.get_config` is plain JSON stored in the file beside the data, and
:func:`codec_from_config` maps it back to the class through the registry, so a file says how it
was encoded. Stages also declare what the pipeline may do with them (capabilities, as zarr's
codecs do): whether they read the base (:attr:`Codec.needs_base`) and, where the native chunk
kernel runs them in one call, with which parameters (``native_*``); a new codec declares them and
:class:`~ckptzip.pipeline.Pipeline` needs no change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from .. import hostpath
from ..errors import ConfigError, FormatError, VersionError

#: Anything with the buffer protocol (bytes, bytearray, memoryview, numpy arrays). Typed as Any
#: because numpy's stubs only declare ``__buffer__`` for Python >= 3.12.
Buffer = Any

_REGISTRY: dict[str, type[Codec]] = {}

C = TypeVar("C", bound="type[Codec]")


def register(cls: C) -> C:
    """Class decorator: make a codec findable by its ``codec_id``."""
    _REGISTRY[cls.codec_id] = cls
    return cls


class Codec(ABC):
    codec_id: ClassVar[str]
    #: Time to code a byte, relative to the default lossless stages (which are 1.0); choosing
    #: between representations trades a little size for speed with it.
    relative_cost: ClassVar[float] = 1.0
    #: Whether the stage reads the base's co-located chunk to code a chunk (and to decode it).
    needs_base: ClassVar[bool] = False

    def get_config(self) -> dict[str, Any]:
        """The JSON config stored in the header: ``{"id": codec_id, **parameters}``."""
        return {"id": self.codec_id}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Codec:
        return cls()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"


@dataclass
class TransformContext:
    """What a whole-tensor transform may use besides the tensor itself."""

    #: The tensor's key path name in the checkpoint (for messages).
    name: str
    #: The base checkpoint's reconstruction of this tensor (same dtype and shape), when the
    #: tensor is coded against a base; None otherwise.
    base: torch.Tensor | None = None
    #: Where a sibling tensor of the same checkpoint is non-zero (a bool tensor of its shape), for
    #: a tensor stored only there (:mod:`.support`); None otherwise.
    support: torch.Tensor | None = None
    #: Decoded sibling leaves by leaf index, for a transform that reads them (:mod:`.lowrank`'s
    #: factors); None otherwise.
    siblings: Mapping[int, torch.Tensor] | None = None

    def base_of(self, stage: str, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """The base tensor a ``stage`` coded against the base needs, of the tensor's shape (a
        ValueError naming the stage and the tensor where there is none, or of another shape)."""
        if self.base is None:
            raise ValueError(f"{stage}: {self.name} needs its base tensor")
        if tuple(self.base.shape) != tuple(shape):
            raise ValueError(f"{stage}: base shape {list(self.base.shape)} is not {list(shape)}")
        return self.base


class TensorToTensor(Codec):
    """A whole-tensor transform, applied before chunking and undone after decoding.

    Parameters a transform learns while encoding (a codebook, a threshold, the error it made) go
    into its :meth:`get_config`, which is stored after encoding, so decoding has them.
    """

    @property
    def references(self) -> tuple[int, ...]:
        """Indices of the sibling leaves this transform needs decoded first (none by default)."""
        return ()

    def added_leaves(self, name: str) -> dict[int, str]:
        """The sibling leaves that are parts of this tensor ``name`` (a writer added them; the
        state does not hold them), with the names a reader gives them; none by default."""
        return {}

    def renumbered(self, numbers: Mapping[int, int]) -> TensorToTensor:
        """This stage with each sibling leaf index found in ``numbers`` replaced by its value (a
        plan made with provisional indices gets its final ones); itself by default."""
        return self

    def sibling_problem(self, shape: tuple[int, ...],
                        siblings: dict[int, tuple[str, tuple[int, ...]]]) -> str | None:
        """Why the sibling leaves a header declares (``(dtype name, shape)`` by index, for each
        of :attr:`references`) cannot serve a tensor of ``shape``, or None when they can: the
        header parser asks before any data is read."""
        return None

    @property
    def support_leaf(self) -> int | None:
        """The sibling leaf whose non-zeros this transform stores values at, or None."""
        return None

    @abstractmethod
    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor: ...

    @abstractmethod
    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor: ...


class InPlaceDecoding(TensorToTensor):
    """A stage whose decoder is an element-wise pass that reads each element before it writes
    it, so that it may write its result into its input's memory: it defines :meth:`decoded`,
    which :meth:`decode` calls with ``in_place=False`` and :func:`undo` with ``True`` where the
    input is given up (nothing else refers to its memory)."""

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        return self.decoded(tensor, context, in_place=False)

    @abstractmethod
    def decoded(self, tensor: torch.Tensor, context: TransformContext, *,
                in_place: bool) -> torch.Tensor:
        """The decoded tensor; ``in_place``: into ``tensor``'s memory where the pass can (the
        input given up: :func:`undo`), else new memory. The same values either way."""

    @staticmethod
    def output(tensor: torch.Tensor, source: torch.Tensor, dtype: torch.dtype,
               in_place: bool) -> torch.Tensor:
        """Where a native pass over ``source`` (``tensor`` as the pass reads it: contiguous, of
        its dtype) writes a host result of ``dtype``: ``tensor`` itself where it is given up
        (``in_place``), the pass reads it as it is (``source`` is ``tensor``: no copy made) and
        it is of ``dtype`` and contiguous; else new memory (:func:`hostpath.empty`)."""
        if in_place and source is tensor and tensor.dtype == dtype and tensor.is_contiguous():
            return tensor
        return hostpath.empty(tensor.shape, dtype)


def undo(stages: Sequence[TensorToTensor], tensor: torch.Tensor,
         context: TransformContext) -> torch.Tensor:
    """``tensor`` (the stored array) through the ``stages``' decoders, last first. A stage's
    input that an earlier stage here made, sharing no memory with the stored array, the base,
    the support or a sibling, is given up to it (:meth:`InPlaceDecoding.decoded`): a
    chain of element-wise stages then writes one tensor's memory, where each wrote new memory
    (faulted in page by page, the most of a lossy load's time on a host that hands out fresh
    memory slowly)."""
    stored = tensor
    kept: list[tuple[str, int, int]] | None = None  # looked at once a stage could consume
    made = False
    for stage in reversed(stages):
        if made and isinstance(stage, InPlaceDecoding):
            if kept is None:
                kept = [_memory(t) for t in (*(context.siblings or {}).values(), context.base,
                                             context.support, stored) if t is not None]
            owned = not any(_overlap(_memory(tensor), other) for other in kept)
            tensor = stage.decoded(tensor, context, in_place=owned)
        else:
            tensor = stage.decode(tensor, context)
        made = True
    return tensor


def _memory(tensor: torch.Tensor) -> tuple[str, int, int]:
    """The memory a tensor's storage spans: its device, first and end byte addresses."""
    storage = tensor.untyped_storage()
    return (tensor.device.type, storage.data_ptr(), storage.data_ptr() + storage.nbytes())


def _overlap(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


class ChunkResidual(Codec):
    """The residual of a chunk of raw element bytes against the base's co-located chunk,
    elementwise and exact; it runs after the tensor transforms, before the serializer."""

    needs_base: ClassVar[bool] = True
    #: Bytes per element.
    width: int

    @property
    def native_kind(self) -> int | None:
        """The native chunk kernel's code for this residual, when it computes it; None: only
        :meth:`encode` and :meth:`decode_inplace` do."""
        return None

    @abstractmethod
    def encode(self, raw: Buffer, base: Buffer) -> Buffer: ...

    @abstractmethod
    def decode_inplace(self, data: Buffer, base: Buffer) -> None:
        """Turn the residual in ``data`` back into the array, in place."""


class TensorToBytes(Codec):
    """Serializes one chunk of raw element bytes into ``segments`` equal-length parts."""

    #: Bytes per element (a chunk holds whole elements).
    width: int = 1

    def native_planes(self) -> tuple[int, int] | None:
        """``(width, rotate)`` of the byte-plane split the native chunk kernel does in this
        stage's place, or None: only :meth:`encode` and :meth:`decode` do it."""
        return None

    @abstractmethod
    def segments(self) -> int: ...

    @abstractmethod
    def encode(self, raw: Buffer) -> Buffer: ...

    @abstractmethod
    def decode(self, data: Buffer, out: Buffer) -> None:
        """Write the raw element bytes of the chunk into ``out`` (exactly ``len(out)`` bytes)."""


class BytesToBytes(Codec):
    """A compressor: codes each of a buffer's equal ``segments`` independently."""

    #: Whether this stage's stream is the native chunk kernel's entropy stream (the kernel then
    #: codes the chunk in one call, serializer included, when the serializer is native too).
    native_entropy: ClassVar[bool] = False

    @abstractmethod
    def encode(self, data: Buffer, segments: int) -> bytes: ...

    @abstractmethod
    def decoded_size(self, data: Buffer) -> int: ...

    @abstractmethod
    def decode(self, data: Buffer, out: Buffer) -> None:
        """Decode into ``out``, whose length must be the stream's declared size."""


class ConditionedCoder(Codec):
    """Serializes and entropy-codes a chunk (a residual's) with statistics drawn from the base's
    co-located chunk, which both sides know: it follows a residual and ends a pipeline."""

    needs_base: ClassVar[bool] = True
    #: Bytes per element (a chunk holds whole elements).
    width: int

    def native_context(self) -> tuple[int, int, int] | None:
        """``(width, rotate, context rotate)`` under which the native chunk kernel codes this
        stage, or None: only :meth:`encode` and :meth:`decode` do."""
        return None

    @abstractmethod
    def encode(self, raw: Buffer, base: Buffer) -> bytes: ...

    @abstractmethod
    def decode(self, data: Buffer, base: Buffer, out: Buffer) -> None:
        """Decode into ``out`` (exactly ``len(out)`` bytes) with the base's chunk."""


def codec_from_config(config: Any, source: str = "<memory>") -> Codec:
    """The codec a stored config describes; :class:`VersionError` for an unknown one (a newer
    writer's), :class:`FormatError` for anything else bad."""
    if not isinstance(config, dict) or not isinstance(config.get("id"), str):
        raise FormatError(f"{source}: codec config {config!r:.80} is not an object with an id")
    cls = _REGISTRY.get(config["id"])
    if cls is None:
        raise VersionError(
            f"{source}: unknown codec {config['id']!r}; the file needs a newer ckptzip "
            f"(pip install -U ckptzip)"
        )
    try:
        return cls.from_config(config)
    except (KeyError, TypeError, ValueError, ConfigError) as exc:
        raise FormatError(f"{source}: bad config for codec {config['id']!r}: {exc}") from None


def registered_ids() -> list[str]:
    return sorted(_REGISTRY)
