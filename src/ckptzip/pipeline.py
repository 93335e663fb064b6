"""A pipeline composes codec stages: tensor->tensor*, residual?, then tensor->bytes? and
bytes->bytes*, or one conditioned coder (serializer and compressor in one, against the base).

Tensor transforms run on whole tensors. The residual against a base is elementwise, so it runs per
chunk with the base's co-located chunk; the serializer and compressors run per chunk too, so chunks
encode and decode independently and in parallel. The stored config of a pipeline is the list of its
codecs' configs, in order.

The pipeline names no concrete codec: it dispatches on the stage kinds of
:mod:`ckptzip.codecs.base` and on what stages declare (``needs_base``, ``native_*``), so a new codec
needs no change here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from . import _native
from .codecs import (
    BytesToBytes,
    ChunkResidual,
    Codec,
    ConditionedCoder,
    TensorToBytes,
    TensorToTensor,
    codec_from_config,
)
from .codecs.base import Buffer
from .errors import CorruptError, FormatError

#: Chunks coded ahead of being written: the stored bytes one after another and, per chunk, its
#: stored length, the CRC-32C of its stored bytes and of its raw bytes, and its raw length.
Coded = tuple[bytes, list[tuple[int, int, int, int]]]


def code_chunks(batch: list[tuple[Any, ...]]) -> Coded:
    """``_native.encode_chunks`` of ``batch`` (each item: raw chunk, base chunk or None, and a
    pipeline's :meth:`Pipeline.native_spec`), one GIL release for all, as :data:`Coded`."""
    stored, results = _native.encode_chunks(batch)
    return stored, [(length, crc, raw_crc, len(item[0]))
                    for item, (length, crc, raw_crc) in zip(batch, results)]


#: Most bytes an entropy stream adds to what it codes (stream.c's ckz_encode_bound: the header of
#: at most 16 segments is under 256 bytes).
STREAM_OVERHEAD = 256


@dataclass(frozen=True)
class Pipeline:
    transforms: tuple[TensorToTensor, ...] = ()
    residual: ChunkResidual | None = None
    #: The serializer, or a conditioned coder (then there are no compressors).
    serializer: TensorToBytes | ConditionedCoder | None = None
    compressors: tuple[BytesToBytes, ...] = field(default_factory=tuple)

    def get_config(self) -> list[dict[str, Any]]:
        stages: list[Codec] = [*self.transforms]
        if self.residual is not None:
            stages.append(self.residual)
        if self.serializer is not None:
            stages.append(self.serializer)
        stages.extend(self.compressors)
        return [stage.get_config() for stage in stages]

    @classmethod
    def from_config(cls, configs: Any, source: str = "<memory>") -> Pipeline:
        if not isinstance(configs, list):
            raise FormatError(f"{source}: a pipeline must be a list of codec configs")
        transforms: list[TensorToTensor] = []
        residual: ChunkResidual | None = None
        serializer: TensorToBytes | ConditionedCoder | None = None
        compressors: list[BytesToBytes] = []
        for config in configs:
            codec = codec_from_config(config, source)
            later_stages = residual is not None or serializer is not None or bool(compressors)
            if isinstance(codec, TensorToTensor) and not later_stages:
                transforms.append(codec)
            elif isinstance(codec, ChunkResidual) and not later_stages:
                residual = codec
            elif (isinstance(codec, (TensorToBytes, ConditionedCoder)) and serializer is None
                  and not compressors):
                serializer = codec
            elif isinstance(codec, BytesToBytes):
                compressors.append(codec)
            else:
                raise FormatError(f"{source}: codec {codec.codec_id!r} is out of order in {configs}")
        if isinstance(serializer, ConditionedCoder) and (residual is None or compressors):
            raise FormatError(f"{source}: {serializer.codec_id} must follow a residual and end the "
                              f"pipeline")
        return cls(tuple(transforms), residual, serializer, tuple(compressors))

    # support and references are worked out once per pipeline: a header's leaves share a few
    # pipelines, and parsing and loading ask each leaf's
    @functools.cached_property
    def support(self) -> int | None:
        """The leaf index of the sibling whose non-zeros this pipeline stores values at
        (:attr:`TensorToTensor.support_leaf`), or None."""
        return next((leaf for t in self.transforms if (leaf := t.support_leaf) is not None), None)

    @functools.cached_property
    def references(self) -> tuple[int, ...]:
        """Leaf indices of the siblings this pipeline's transforms read (a support, low-rank
        factors), each once, in stage order."""
        return tuple(dict.fromkeys(j for t in self.transforms for j in t.references))

    @property
    def relative_cost(self) -> float:
        """The slowest stage's :attr:`Codec.relative_cost`."""
        stages = [*self.transforms, self.residual, self.serializer, *self.compressors]
        return max((stage.relative_cost for stage in stages if stage is not None), default=1.0)

    @functools.cached_property
    def needs_base(self) -> bool:
        """Whether coding a chunk reads the base's co-located chunk (a stage declares it)."""
        return any(stage.needs_base for stage in (self.residual, self.serializer)
                   if stage is not None)

    @functools.cached_property
    def _native_entropy(self) -> bool:
        """Whether the compressors are the native chunk kernel's entropy stage alone."""
        return len(self.compressors) == 1 and self.compressors[0].native_entropy

    @functools.cached_property
    def _fused_planes(self) -> tuple[int, int] | None:
        """``(width, rotate)`` of the serializer's byte planes when the native fused
        split+entropy kernel codes them (worked out once per pipeline: every chunk asks)."""
        ser = self.serializer
        if isinstance(ser, TensorToBytes) and self._native_entropy:
            return ser.native_planes()
        return None

    @functools.cached_property
    def _chunk_spec(self) -> tuple[int, int, int, int] | None:
        """``(width, rotate, kind, ctx_rotate)`` of ``_native.encode_chunk/decode_chunk`` when
        they code this pipeline's chunks in one call (residual, planes and entropy; the same
        stream as the stages one by one), else None: every stage must declare what the kernel
        does in its place."""
        res, ser = self.residual, self.serializer
        kind = -1 if res is None else res.native_kind
        if kind is None:
            return None
        if isinstance(ser, ConditionedCoder):
            context = ser.native_context()
            if context is None or res is None or res.width != context[0] or self.compressors:
                return None
            width, rotate, context_rotate = context
            return (width, rotate, kind, context_rotate)
        if not self._native_entropy:
            return None
        if ser is None:
            planes: tuple[int, int] | None = (1, 0)  # one segment: the stream of one plane
        else:
            planes = ser.native_planes()
        if planes is None:
            return None
        width, rotate = planes
        if res is not None and res.width != width:
            return None
        return (width, rotate, kind, -1)

    def chunk_size(self, requested: int) -> int:
        """The chunk size for ``requested`` bytes a chunk: a whole number of the serializer's
        elements."""
        width = self.serializer.width if self.serializer else 1
        return max(width, requested // width * width)

    def native_spec(self, has_base: bool) -> tuple[int, int, int, int] | None:
        """The spec under which ``_native.encode_chunks``/``decode_chunks`` code this pipeline's
        chunks (given a base chunk or not) in batches, the same streams as
        :meth:`encode_chunk`/:meth:`decode_chunk`; None: those methods must."""
        spec = self._chunk_spec
        if spec is None or (self.needs_base and not has_base):
            return None
        return spec

    def encoded_size(self, raw: Buffer, base: Buffer | None = None) -> int:
        """``len(self.encode_chunk(raw, base))``, without writing the stream where the native
        core can size it (a writer's trials of candidate pipelines)."""
        spec = self._chunk_spec
        if spec is None:
            return len(self.encode_chunk(raw, base))
        if self.needs_base and base is None:
            raise ValueError("a residual pipeline needs the base chunk")
        return int(_native.encode_chunk(raw, base if self.needs_base else None, *spec,
                                        size_only=True))

    def encode_whole(self, raw: Buffer, base: Buffer | None = None) -> Coded:
        """:meth:`encode_chunk` of ``raw`` as one chunk, with its CRCs, as :data:`Coded`."""
        stored = self.encode_chunk(raw, base)
        return stored, [(len(stored), _native.crc32c(stored), _native.crc32c(raw),
                         memoryview(raw).nbytes)]

    def encode_chunk(self, raw: Buffer, base: Buffer | None = None) -> bytes:
        """Serialize and compress one chunk of raw element bytes (``base``: the base's co-located
        chunk, for a pipeline with a residual stage)."""
        spec = self.native_spec(base is not None)
        if spec is not None:
            return bytes(_native.encode_chunk(raw, base if self.needs_base else None,
                                              *spec))
        if self.residual is not None:
            if base is None:
                raise ValueError("a residual pipeline needs the base chunk")
            raw = self.residual.encode(raw, base)
        if isinstance(self.serializer, ConditionedCoder):
            assert base is not None  # from_config admits one only after a residual
            return self.serializer.encode(raw, base)
        planes = self._fused_planes
        if planes is not None:
            return _native.encode_planes(raw, *planes)
        data: Buffer = raw
        segments = 1
        if self.serializer is not None:
            data = self.serializer.encode(raw)
            segments = self.serializer.segments()
        for compressor in self.compressors:
            data = compressor.encode(data, segments)
            segments = 1
        return bytes(data)

    def decode_chunk(self, data: Buffer, out: Buffer, base: Buffer | None = None) -> None:
        """Decode one stored chunk into ``out``, whose length is the chunk's raw size.

        Raises :class:`CorruptError` if the stream is malformed or does not decode to exactly
        ``len(out)`` bytes.
        """
        if self.needs_base and base is None:
            raise ValueError("a residual pipeline needs the base chunk")
        spec = self._chunk_spec
        if spec is not None and self.needs_base:
            try:
                _native.decode_chunk(data, base, out, *spec)
            except ValueError as exc:
                raise CorruptError(str(exc)) from None
            return
        serializer = self.serializer
        if isinstance(serializer, ConditionedCoder):
            assert base is not None
            try:
                serializer.decode(data, base, out)
            except ValueError as exc:
                raise CorruptError(str(exc)) from None
        else:
            self._decode_stream(serializer, data, out)
        if self.residual is not None:
            assert base is not None
            self.residual.decode_inplace(out, base)

    def _decode_stream(self, serializer: TensorToBytes | None, data: Buffer, out: Buffer) -> None:
        planes = self._fused_planes
        try:
            if planes is not None:
                _native.decode_planes(data, out, *planes)
                return
            # A stage's input is the next stage's stream: never longer than the chunk plus a few
            # header bytes per stage, so a stream cannot make this allocate what it declares.
            limit = len(memoryview(out)) + STREAM_OVERHEAD * len(self.compressors)
            for compressor in reversed(self.compressors):
                declared = compressor.decoded_size(data)
                if declared > limit:
                    raise CorruptError(f"a stage declares {declared} decoded bytes, at most {limit} fit")
                decoded = bytearray(declared)
                compressor.decode(data, decoded)
                data = decoded
            size = len(memoryview(out))
            if len(memoryview(data)) != size:
                raise CorruptError(f"chunk decodes to {len(memoryview(data))} bytes, expected {size}")
            if serializer is not None:
                serializer.decode(data, out)
            else:
                memoryview(out).cast("B")[:] = memoryview(data).cast("B")
        except ValueError as exc:
            raise CorruptError(str(exc)) from None
