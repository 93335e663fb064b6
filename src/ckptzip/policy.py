"""Policies: a mode is a policy that picks a pipeline (and a chunk size) per tensor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .chain import Base
from .codecs import BytePlanes, ContextPlanes, Entropy, Residual
from .errors import ConfigError
from .pipeline import Pipeline
from .tree import Leaf

#: Raw bytes per chunk: the unit of parallel work, of checksums, and of one frequency table per
#: byte plane (local statistics). Measured in docs/journal/benchmarks.md.
DEFAULT_CHUNK_BYTES = 256 << 10
#: Largest raw chunk a file may declare (a reader refuses more). With the smallest possible
#: stored chunk this bounds how much memory a header can make a reader allocate per stored byte.
MAX_CHUNK_BYTES = 64 << 20
#: Smallest chunk a writer makes: each chunk costs about 1.2 KB of memory and a header entry, so
#: smaller ones cost more than their data (a 4 MiB tensor in 1-byte chunks took 4.9 GB).
MIN_CHUNK_BYTES = 4 << 10


#: What :attr:`Encoded.coded` holds: the chunk size, then :data:`ckptzip.pipeline.Coded`.
Precoded = tuple[int, bytes, list[tuple[int, int, int, int]]]


@dataclass
class Encoded:
    """A tensor already transformed by a policy that plans the whole state at once (lossy
    modes): the array to chunk, the pipeline (its transforms hold what they learned), and what
    the header records beside it."""

    pipeline: Pipeline
    array: torch.Tensor
    #: Header fields of the leaf, e.g. ``{"error": {...}}``.
    extra: dict[str, Any] = field(default_factory=dict)
    #: Whether decoding needs the base's tensor of the same name.
    uses_base: bool = False
    #: A leaf the policy adds to the file (low-rank factors), which the state tree does not
    #: reference: set for plans whose index is past the state's own leaves.
    added: Leaf | None = None
    #: The CRC-32C of the base tensor it was coded against (``uses_base``), which the header
    #: records: taken when the tensor is planned, so that the base's bytes can be freed then.
    base_crc: int | None = None
    #: The array's chunks already coded (:func:`ckptzip.modes.common.precode`), for the writer
    #: to write as they are: (chunk size, the stored chunks one after another, and per chunk
    #: its stored length, the CRC-32C of its stored bytes and of its raw bytes, its raw length).
    coded: Precoded | None = None


@dataclass(frozen=True)
class Exact:
    """A tensor a lossy policy leaves bit-exact: the writer codes it losslessly (against the
    base where that is smaller). ``unchanged``: it equals the base's decoded tensor (frozen
    weights, buffers, a step at learning rate 0), which the header then says."""

    unchanged: bool = False


#: ``progress(planned, total)``: ``planned`` more raw bytes of ``total`` are planned.
Planned = Callable[[int, int], None]


class Policy(Protocol):
    mode: str

    def plan_state(self, leaves: list[Leaf], base: Base | None,
                   progress: Planned | None = None, *,
                   resumed: bool = False, threads: int = 1) -> dict[int, Encoded | Exact]:
        """Transform whichever tensors the mode treats jointly (weights with their moments),
        by leaf index, or mark them :class:`Exact`; every other leaf is coded on its own with
        :meth:`pipeline_for`. Plans at indices ``len(leaves)``, ``len(leaves) + 1``, ... add
        leaves (their ``added``). ``progress`` hears of the raw bytes planned as the work goes
        (a progress bar). ``resumed``: training went on from ``base`` as decoded (it resumed
        from a load of it), not from the true state the base was saved from. ``threads``: how
        many threads may plan (the plans do not depend on it)."""

    def check_state(self, leaves: list[Leaf]) -> None:
        """Raise :class:`ConfigError` now where the mode's options cannot work with this state
        (an explicit pairing that names no weight), before anything is planned or written."""

    def pipeline_for(self, leaf: Leaf) -> Pipeline:
        """The pipeline of a tensor coded on its own."""

    def delta_candidates(self, leaf: Leaf) -> list[Pipeline]:
        """Pipelines that code a tensor against its base; the writer keeps the smallest."""

    def chunk_bytes(self, leaf: Leaf) -> int: ...


class LosslessPolicy:
    """Bit-exact: byte planes (exponent apart) and the entropy coder, for every dtype."""

    mode = "lossless"

    def __init__(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        # 0 was clamped to one element silently; more than a reader accepts saved a file that
        # never loaded
        if type(chunk_bytes) is not int or not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
            raise ConfigError(f"{self.mode}: chunk_bytes must be an int from {MIN_CHUNK_BYTES} "
                              f"(4 KiB) to {MAX_CHUNK_BYTES} (64 MiB; bytes per chunk, "
                              f"{DEFAULT_CHUNK_BYTES} by default), not {chunk_bytes!r}")
        self._chunk_bytes = chunk_bytes
        # one pipeline object per layout, shared by every tensor of it (the writer indexes the
        # header's pipeline table by object before it serializes a config)
        self._dense: dict[tuple[int, int], Pipeline] = {}
        self._deltas: dict[tuple[int, int, bool], list[Pipeline]] = {}

    def plan_state(self, leaves: list[Leaf], base: Base | None,
                   progress: Planned | None = None, *,
                   resumed: bool = False, threads: int = 1) -> dict[int, Encoded | Exact]:
        return {}

    def check_state(self, leaves: list[Leaf]) -> None:
        pass

    def pipeline_for(self, leaf: Leaf) -> Pipeline:
        layout = leaf.dtype.plane_layout
        if layout not in self._dense:
            width, rotate = layout
            self._dense[layout] = (
                Pipeline(compressors=(Entropy(),)) if width == 1
                else Pipeline(serializer=BytePlanes(width, rotate), compressors=(Entropy(),))
            )
        return self._dense[layout]

    def delta_candidates(self, leaf: Leaf) -> list[Pipeline]:
        """How a tensor may be coded against its base; the writer keeps the smallest (or dense).

        Floats of 2, 4 or 8 bytes: the zigzagged difference of monotone-mapped patterns, its
        byte planes coded in buckets of the base's exponent. On every training state measured
        (weights in fp32 and bf16, Adam's moments, 10-200 steps apart) neither XOR nor the same
        difference coded without buckets came out smaller, and their trials cost a delta save
        up to 8 % of its time each (docs/journal/benchmarks.md), so they are not tried. Other floats:
        the difference in plain byte planes. Integers: the difference, or XOR (zipnn's delta).

        Zigzag moves the sign to bit 0, so differences are split without rotation; after XOR
        the sign change still sits in the top bit, so XOR keeps the dtype's rotation."""
        width, rotate = leaf.dtype.plane_layout
        if width not in (1, 2, 4, 8):
            return []
        key = (width, rotate, leaf.dtype.is_float)
        if key not in self._deltas:
            self._deltas[key] = self._delta_pipelines(leaf)
        return self._deltas[key]

    @staticmethod
    def _delta_pipelines(leaf: Leaf) -> list[Pipeline]:
        width, rotate = leaf.dtype.plane_layout
        if not leaf.dtype.is_float:
            return [
                Pipeline(residual=Residual("int-diff", width), serializer=BytePlanes(width, 0),
                         compressors=(Entropy(),)),
                Pipeline(residual=Residual("xor", width), serializer=BytePlanes(width, rotate),
                         compressors=(Entropy(),)),
            ]
        if width == 1:
            return [Pipeline(residual=Residual("float-diff", width),
                             serializer=BytePlanes(width, 0), compressors=(Entropy(),))]
        return [Pipeline(residual=Residual("float-diff", width), serializer=ContextPlanes(width))]

    def chunk_bytes(self, leaf: Leaf) -> int:
        width = leaf.dtype.plane_layout[0]
        return max(width, self._chunk_bytes // width * width)
