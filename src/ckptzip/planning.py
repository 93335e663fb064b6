"""Planning a save: flatten the state, run a mode's whole-state transforms, and pick each
leaf's pipeline and chunk size (against a base, by sizing samples with each candidate). Nothing
here writes: :mod:`ckptzip.writer` codes the chunks the plans describe.

:func:`plan_leaf` plans one leaf on its own (it reads only the leaf, the policy and the base), so
leaves may be planned on several threads."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from . import _native, dtypes
from .chain import Base
from .container import base_entry, encoded_entry
from .errors import ConfigError
from .modes import policy_for
from .modes.common import JointPolicy
from .parallel import resolve_threads
from .pipeline import Coded, Pipeline
from .policy import Encoded, Exact, Policy
from .progress import Progress
from .tree import Leaf, flatten, host_copies


@dataclass
class LeafPlan:
    """How one leaf is stored: its pipeline and chunk size, and, once written, where its chunks
    lie (a :class:`~ckptzip.container.StoredLeaf`)."""

    leaf: Leaf
    pipeline: Pipeline
    chunk_bytes: int
    table: list[list[int]]
    offset: int = -1
    #: Raw bytes of the base tensor, for a pipeline with a residual stage.
    base_raw: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The array a whole-tensor transform made of the leaf (lossy modes); None: the leaf itself.
    array: torch.Tensor | None = None
    #: Its chunks, coded already (for the writer to write as they are): when choosing the
    #: pipeline coded the whole leaf as its one chunk, or a lossy mode coded its array while the
    #: state was planned (:func:`ckptzip.modes.common.precode`).
    coded: Coded | None = None

    @property
    def raw_bytes(self) -> int:
        """The raw bytes its chunks code: the array's where a transform made one, else the
        leaf's."""
        return self.leaf.nbytes if self.array is None else self.array.numel() * self.array.element_size()

    @property
    def n_chunks(self) -> int:
        return -(-self.raw_bytes // self.chunk_bytes)


def has_base_tensor(leaf: Leaf, base: Base) -> bool:
    """Whether ``base`` holds a tensor of the leaf's name, dtype and shape to code it against."""
    match = base.tensor(leaf.name)
    return match is not None and (match.dtype, match.shape) == (leaf.dtype, leaf.shape)


def _encoded_plan(leaf: Leaf, encoding: Encoded, policy: Policy, base: Base | None) -> LeafPlan:
    array = encoding.array
    chunk_bytes = encoding.pipeline.chunk_size(policy.chunk_bytes(leaf))
    coded = None
    if encoding.coded is not None and encoding.coded[0] == chunk_bytes:
        coded = encoding.coded[1:]
    extra = dict(encoding.extra)
    if encoding.pipeline.transforms:  # else the stored array is the leaf itself (a change mask)
        extra.update(encoded_entry(dtypes.from_torch(array.dtype, leaf.name), array.shape))
    if encoding.uses_base:
        if base is None:
            raise ConfigError(f"{leaf.name}: the {policy.mode} policy coded it against a missing base")
        crc = encoding.base_crc
        extra.update(base_entry(leaf.name, _native.crc32c(base.raw(leaf.name)) if crc is None
                                else crc))
    return LeafPlan(leaf, encoding.pipeline, chunk_bytes, [], extra=extra, array=array,
                    coded=coded)


#: How much smaller a representation that codes twice as slowly must be to be chosen (2%).
SPEED_WEIGHT = 0.02
#: Bytes of a tensor on which the candidate representations against a base are tried: first a
#: quick sample, and a full one only when the quick one's best two scores lie within
#: TRIAL_MARGIN of each other. Sizing the candidates took 15% of a delta save of the full
#: training state at 64 KiB; 16 KiB alone lost 0.05-0.08% of its ratio (exp_avg_sq tensors near
#: the line, and fewer buckets in a small sample), the two steps none (docs/BENCHMARKS.md).
QUICK_TRIAL_BYTES = 16 << 10
TRIAL_BYTES = 64 << 10
TRIAL_MARGIN = 0.05


#: Chunk size of a tensor a lossy delta keeps unchanged. Its difference from the base is zeros,
#: a few bytes a chunk whatever the chunk's size, and each chunk also costs a header record of two
#: CRCs: in a LoRA fine-tune's delta the frozen encoder's 293 chunks of 256 KiB were 22% of the
#: file, 101 chunks 9%. 16 MiB still leaves a 1 GB frozen tensor 64 chunks to decode in parallel.
UNCHANGED_CHUNK_BYTES = 16 << 20


def plan_leaf(leaf: Leaf, raw: np.ndarray, policy: Policy, base: Base | None,
               exact: Exact | None = None) -> LeafPlan:
    """Pick the leaf's pipeline. Against a base, size a sample from the middle of the tensor with
    each candidate representation (dense included) and keep the smallest. The trials only size
    the streams (:meth:`Pipeline.encoded_size`, exact); when the sample is the whole tensor, the
    winner's stream is coded once and kept as the tensor's only chunk. A tensor the policy found
    unchanged (``exact``) is coded against the base with its first delta pipeline, untried, in
    chunks of :data:`UNCHANGED_CHUNK_BYTES`, and its header entry says so."""
    chunk_bytes = policy.chunk_bytes(leaf)
    dense = policy.pipeline_for(leaf)
    if base is None or leaf.nbytes == 0 or not has_base_tensor(leaf, base):
        return LeafPlan(leaf, dense, chunk_bytes, [])
    base_raw = base.raw(leaf.name)
    deltas = policy.delta_candidates(leaf)
    width = leaf.dtype.plane_layout[0]
    if exact is not None and exact.unchanged and deltas:
        extra = base_entry(leaf.name, _native.crc32c(base_raw), unchanged=True)
        whole = max(chunk_bytes, min(leaf.nbytes, UNCHANGED_CHUNK_BYTES) // width * width)
        return LeafPlan(leaf, deltas[0], whole, [], base_raw=base_raw, extra=extra)
    candidates = [dense, *deltas]
    # A sample's byte planes get at least RANS_SMALL_LIMIT elements: shorter segments may take a
    # layout with fewer state bytes than the tensor's full chunks can, which would bias the trial.
    least = _native.RANS_SMALL_LIMIT * width
    for trial_bytes in (QUICK_TRIAL_BYTES, TRIAL_BYTES):
        size = min(len(raw), max(least, trial_bytes // width * width))
        start = (len(raw) - size) // 2 // width * width
        sample, base_sample = raw[start : start + size], base_raw[start : start + size]
        scores = sorted(
            (pipeline.encoded_size(sample, None if pipeline is dense else base_sample)
             * (1 + SPEED_WEIGHT * (pipeline.relative_cost - 1)), i)
            for i, pipeline in enumerate(candidates)
        )
        decided = len(scores) == 1 or scores[1][0] > scores[0][0] * (1 + TRIAL_MARGIN)
        if decided or size == len(raw):
            break
    best = candidates[scores[0][1]]
    whole = size == len(raw) <= chunk_bytes
    if best is dense:
        coded = dense.encode_whole(sample) if whole else None
        return LeafPlan(leaf, dense, chunk_bytes, [], coded=coded)
    coded = best.encode_whole(sample, base_sample) if whole else None
    extra = base_entry(leaf.name, _native.crc32c(base_raw))
    return LeafPlan(leaf, best, chunk_bytes, [], base_raw=base_raw, extra=extra, coded=coded)


#: The most checkpoints a chain holds (a keyframe and its deltas), whatever ``keyframe_every``
#: says (``None`` included): a load decodes every link, link after link, so time grows with the
#: depth, and a chain hundreds deep outgrew Python's recursion limit.
MAX_CHAIN = 64


def chain_base(base: Base | None, keyframe_every: int | None) -> Base | None:
    """The base a new checkpoint is coded against: none when the chain would reach
    ``keyframe_every`` checkpoints, or :data:`MAX_CHAIN` (this one becomes a standalone
    keyframe)."""
    if keyframe_every is not None and (type(keyframe_every) is not int or keyframe_every < 1):
        raise ConfigError(f"keyframe_every must be a positive int or None, not {keyframe_every!r}")
    longest = MAX_CHAIN if keyframe_every is None else min(keyframe_every, MAX_CHAIN)
    if base is not None and base.depth + 1 >= longest:
        return None
    return base


@dataclass
class Prepared:
    """A state flattened and planned ahead of writing.

    :class:`ckptzip.CheckpointManager` prepares a lossy checkpoint of tensors on an accelerator
    where they are (the transforms are torch ops), copies only the transformed arrays (codes) and
    the untransformed leaves to the host with :meth:`to_host`, and writes that in the background.
    """

    tree: Any
    leaves: list[Leaf]
    mode: str
    #: The base the plan was made against (None: a keyframe); closed by whoever writes it.
    base: Base | None
    #: Plans of the leaves the mode transformed, by leaf index (their arrays, not their leaves'
    #: tensors, are what gets stored).
    encoded: dict[int, LeafPlan]
    #: The mode's policy, which also picks the pipelines of the leaves it did not transform.
    policy: Policy
    #: Leaves the mode added after the state's own (low-rank factors): stored, but not part of
    #: the state, so not counted in its raw size.
    added: int = 0
    #: Leaves the mode left bit-exact (coded losslessly), by index.
    exact: dict[int, Exact] = field(default_factory=dict)

    def to_host(self) -> Prepared:
        """A copy whose arrays all live in fresh host memory (see :func:`host_copies`), so the
        caller may change its tensors as soon as this returns. A transformed leaf's own tensor
        is not copied: its plan's array is."""
        arrays = []
        for index, leaf in enumerate(self.leaves):
            plan = self.encoded.get(index)
            if plan is None:
                arrays.append(leaf.tensor)
            else:
                assert plan.array is not None  # every encoded plan carries its array
                arrays.append(plan.array)
        # the writer reads only a transformed leaf's name, dtype and shape: its tensor field
        # holds the stored array, so no reference to the caller's tensor outlives this call
        leaves = [replace(leaf, tensor=copy) for leaf, copy in zip(self.leaves, host_copies(arrays))]
        encoded = {index: replace(plan, leaf=leaves[index], array=leaves[index].tensor, table=[])
                   for index, plan in self.encoded.items()}
        return replace(self, leaves=leaves, encoded=encoded)


def prepare(
    state: Any,
    *,
    mode: str = "lossless",
    base: Base | None = None,
    keyframe_every: int | None = None,
    mode_options: dict[str, Any] | None = None,
    progress: bool = False,
    resumed: bool = False,
    threads: int | None = None,
) -> Prepared:
    """Flatten ``state`` and run the mode's whole-state transforms (lossy modes, against
    ``base``) where the tensors are, on ``threads`` threads (None: every core). Each
    transformed leaf's base reference is checksummed now, so the base's bytes need not stay
    cached until the write. ``progress``: a bar on a terminal while the transforms run
    (minutes for a large state on a CPU). ``resumed``: the training that made ``state`` went
    on from ``base`` as decoded (see :func:`ckptzip.save`)."""
    if not isinstance(resumed, bool):  # "no" from a config file would read as True
        raise ConfigError(f"resumed must be True or False, not {resumed!r:.80}")
    policy = policy_for(mode, **(mode_options or {}))
    if isinstance(policy, JointPolicy):
        policy.observe_state(state)
    base = chain_base(base, keyframe_every)
    tree, leaves = flatten(state)
    if base is None and isinstance(policy, JointPolicy):
        policy.check_state(leaves)  # a pairing that cannot work: at the keyframe, not a delta later
    encoded = {}
    n_state = len(leaves)
    bar = Progress(1, f"{mode} transforms", enabled=progress)

    def planned(size: int, total: int) -> None:
        bar.total = max(total, 1)
        bar.update(size)

    plans = policy.plan_state(leaves, base, planned, resumed=resumed,
                              threads=resolve_threads(threads))
    bar.close()
    exact = {index: plan for index, plan in plans.items() if isinstance(plan, Exact)}
    for index, encoding in sorted(plans.items(), key=lambda p: p[0]):
        if isinstance(encoding, Exact):
            continue
        if index >= n_state:  # a leaf the mode adds, which the tree does not reference
            if index != len(leaves) or encoding.added is None:
                raise ConfigError(f"the {mode} policy planned leaf {index} of {len(leaves)} "
                                  f"without adding it")
            leaves.append(encoding.added)
        encoded[index] = _encoded_plan(leaves[index], encoding, policy, base)
        if base is not None:
            base.release(leaves[index].name)
    return Prepared(tree, leaves, mode, base, encoded, policy, len(leaves) - n_state, exact)
