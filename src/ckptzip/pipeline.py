"""A pipeline composes codec stages: tensor->tensor*, residual?, tensor->bytes?, bytes->bytes*.

Tensor transforms run on whole tensors. The residual against a base is elementwise, so it runs per
chunk with the base's co-located chunk; the serializer and compressors run per chunk too, so chunks
encode and decode independently and in parallel. The stored config of a pipeline is the list of its
codecs' configs, in order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from . import _native
from .codecs import (
    BytePlanes,
    BytesToBytes,
    Codec,
    ContextPlanes,
    Entropy,
    LowRank,
    Residual,
    Support,
    TensorToBytes,
    TensorToTensor,
    codec_from_config,
)
from .codecs.base import Buffer
from .codecs.context import CONTEXT_ROTATE
from .codecs.residual import KINDS as RESIDUAL_KINDS
from .errors import CorruptError, FormatError

#: Most bytes an entropy stream adds to what it codes (stream.c's ckz_encode_bound: the header of
#: at most 16 segments is under 256 bytes).
STREAM_OVERHEAD = 256


@dataclass(frozen=True)
class Pipeline:
    transforms: tuple[TensorToTensor, ...] = ()
    residual: Residual | None = None
    serializer: TensorToBytes | None = None
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
        residual: Residual | None = None
        serializer: TensorToBytes | None = None
        compressors: list[BytesToBytes] = []
        for config in configs:
            codec = codec_from_config(config, source)
            later_stages = residual is not None or serializer is not None or bool(compressors)
            if isinstance(codec, TensorToTensor) and not later_stages:
                transforms.append(codec)
            elif isinstance(codec, Residual) and not later_stages:
                residual = codec
            elif isinstance(codec, TensorToBytes) and serializer is None and not compressors:
                serializer = codec
            elif isinstance(codec, BytesToBytes):
                compressors.append(codec)
            else:
                raise FormatError(f"{source}: codec {codec.codec_id!r} is out of order in {configs}")
        if isinstance(serializer, ContextPlanes) and (residual is None or compressors):
            raise FormatError(f"{source}: ctxplanes must follow a residual and end the pipeline")
        return cls(tuple(transforms), residual, serializer, tuple(compressors))

    # support, lowrank and references are worked out once per pipeline: a header's leaves share
    # a few pipelines, and parsing and loading ask each leaf's
    @functools.cached_property
    def support(self) -> int | None:
        """The leaf index of the sibling whose non-zeros this pipeline stores values at
        (:class:`~ckptzip.codecs.Support`), or None."""
        return next((t.leaf for t in self.transforms if isinstance(t, Support)), None)

    @functools.cached_property
    def lowrank(self) -> LowRank | None:
        """The :class:`~ckptzip.codecs.LowRank` stage, whose factor leaves it reads, or None."""
        return next((t for t in self.transforms if isinstance(t, LowRank)), None)

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
    def _fused_planes(self) -> BytePlanes | None:
        """The byte-plane serializer when the native fused split+entropy kernel applies (worked
        out once per pipeline: every chunk asks)."""
        if isinstance(self.serializer, BytePlanes) and self.compressors == (Entropy(),):
            return self.serializer
        return None

    @functools.cached_property
    def _chunk_spec(self) -> tuple[int, int, int, int] | None:
        """``(width, rotate, kind, ctx_rotate)`` of ``_native.encode_chunk/decode_chunk`` when
        they code this pipeline's chunks in one call (residual, planes and entropy; the same
        stream as the stages one by one), else None."""
        res, ser = self.residual, self.serializer
        kind = -1 if res is None else RESIDUAL_KINDS[res.kind]
        if isinstance(ser, ContextPlanes):
            if res is None or res.width != ser.width or self.compressors:
                return None
            return (ser.width, ser.rotate, kind, CONTEXT_ROTATE)
        if self.compressors != (Entropy(),):
            return None
        if type(ser) is BytePlanes:
            width, rotate = ser.width, ser.rotate
        elif ser is None:
            width, rotate = 1, 0  # one segment: the stream of one plane
        else:
            return None
        if res is not None and res.width != width:
            return None
        return (width, rotate, kind, -1)

    def native_spec(self, has_base: bool) -> tuple[int, int, int, int] | None:
        """The spec under which ``_native.encode_chunks``/``decode_chunks`` code this pipeline's
        chunks (given a base chunk or not) in batches, the same streams as
        :meth:`encode_chunk`/:meth:`decode_chunk`; None: those methods must."""
        spec = self._chunk_spec
        if spec is None or (self.residual is not None and not has_base):
            return None
        return spec

    def encoded_size(self, raw: Buffer, base: Buffer | None = None) -> int:
        """``len(self.encode_chunk(raw, base))``, without writing the stream where the native
        core can size it (a writer's trials of candidate pipelines)."""
        spec = self._chunk_spec
        if spec is None:
            return len(self.encode_chunk(raw, base))
        if self.residual is not None and base is None:
            raise ValueError("a residual pipeline needs the base chunk")
        return int(_native.encode_chunk(raw, base if self.residual is not None else None, *spec,
                                        size_only=True))

    def encode_chunk(self, raw: Buffer, base: Buffer | None = None) -> bytes:
        """Serialize and compress one chunk of raw element bytes (``base``: the base's co-located
        chunk, for a pipeline with a residual stage)."""
        spec = self.native_spec(base is not None)
        if spec is not None:
            return bytes(_native.encode_chunk(raw, base if self.residual is not None else None,
                                              *spec))
        if self.residual is not None:
            if base is None:
                raise ValueError("a residual pipeline needs the base chunk")
            raw = self.residual.encode(raw, base)
        if isinstance(self.serializer, ContextPlanes):
            assert base is not None  # from_config admits ctxplanes only after a residual
            return self.serializer.encode_with_base(raw, base)
        planes = self._fused_planes
        if planes is not None:
            return _native.encode_planes(raw, planes.width, planes.rotate)
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
        if self.residual is not None and base is None:
            raise ValueError("a residual pipeline needs the base chunk")
        spec = self._chunk_spec
        if spec is not None and self.residual is not None:
            try:
                _native.decode_chunk(data, base, out, *spec)
            except ValueError as exc:
                raise CorruptError(str(exc)) from None
            return
        if isinstance(self.serializer, ContextPlanes):
            assert base is not None
            try:
                self.serializer.decode_with_base(data, base, out)
            except ValueError as exc:
                raise CorruptError(str(exc)) from None
        else:
            self._decode_stream(data, out)
        if self.residual is not None:
            assert base is not None
            self.residual.decode_inplace(out, base)

    def _decode_stream(self, data: Buffer, out: Buffer) -> None:
        planes = self._fused_planes
        try:
            if planes is not None:
                _native.decode_planes(data, out, planes.width, planes.rotate)
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
            if self.serializer is not None:
                self.serializer.decode(data, out)
            else:
                memoryview(out).cast("B")[:] = memoryview(data).cast("B")
        except ValueError as exc:
            raise CorruptError(str(exc)) from None
