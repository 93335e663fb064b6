"""What the lossy modes share: the joint plan over weight groups, pipelines, error records."""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from .. import _native, hostpath
from ..chain import Base
from ..codecs import (
    BasePartition,
    BaseRatio,
    BytePlanes,
    Entropy,
    ExactZeros,
    KMeans,
    LossyResidual,
    LowRank,
    Support,
    TensorToTensor,
    TransformContext,
    undo,
)
from ..dtypes import from_torch
from ..errors import ConfigError
from ..hostpath import flat_array, native
from ..parallel import ByteGate, ordered_map
from ..pipeline import Pipeline, code_chunks
from ..policy import DEFAULT_CHUNK_BYTES, Encoded, Exact, LosslessPolicy, Planned
from ..tree import Leaf, render_path, tensor_bytes
from .pairing import (
    ADAM_ROLES,
    FLAT_STATE,
    Group,
    group_state,
    in_optimizer_state,
    lone_first_moments,
    lossy_candidate,
    optimizer_entries,
    optimizer_state_key,
    param_group_runs,
    second_moment_betas,
)

#: What a lossy mode codes lossy (``scope=``): every float tensor of at least 16 elements outside
#: the optimizer's state plus Adam's moments (weights, buffers, EMA copies), or only the weights
#: the optimizer's Adam moments pair with, and those moments.
SCOPES = ("floats", "optimized")
#: Each lossy tensor's header records a ``bound`` on its error that the encoder checked against
#: what a reader decodes. Where a mode promises nothing tighter, the bound is that coding never
#: does worse than storing nothing (the update not stored, or the moment zero), whatever the
#: tensor's dtype: storing nothing decodes to the base or to zeros, which every dtype holds
#: exactly, so the rounding of a 16-bit tensor is no excuse (an allowance of twice the norm for
#: it let a bf16 second moment decode 1.025x farther than zeros; tightening it cost 14-47 bytes
#: of 8-76 MB on a bf16 run: docs/journal/results/s41/bf16_allowance.txt). The factor's slack
#: is for the norms' own rounding.
NO_WORSE = 1 + 2**-9
#: A group planned on its own numbers the leaves it adds (a change mask, low-rank factors)
#: provisionally, from a range of this many below this index; :func:`_renumber` gives them
#: their final indices, after the state's own leaves, in group order.
PROVISIONAL_LEAVES = 1 << 30
LEAVES_PER_GROUP = 16
#: On a device, the share of the state's bytes whose groups are planned at once (at least the
#: largest group): a group's transforms there hold a few times its bytes in temporaries (the
#: base's copies, the update, the roundings' pieces), and issue 25 asks the whole save to stay
#: within 1.2x the state in extra GPU memory (measured by benchmarks/probes/device_memory.py).
DEVICE_PLAN_SHARE = 0.1


class NonFiniteWarning(UserWarning):
    """A weight or moment held NaN or infinite values, so a lossy mode stored it bit-exact."""


class UnhandledStateWarning(UserWarning):
    """Optimizer states a lossy mode does not know (not Adam's moments) stay lossless."""


class KeepExactWarning(UserWarning):
    """A ``keep_exact`` pattern names no tensor of the state."""


class SharedViewsWarning(UserWarning):
    """Tensors that are views of different shapes into one storage (a flat parameter buffer)
    stay lossless: a lossy plan bounds and records each tensor's error on its own."""


def round_up(value: float) -> float:
    """``value`` to 4 significant digits, rounded up (a bound stays a bound in the header)."""
    rounded = float(f"{value:.4g}")
    if rounded >= value or not math.isfinite(value):
        return rounded
    return float(f"{math.nextafter(rounded + 10 ** (math.floor(math.log10(value)) - 3), math.inf):.4g}")


@dataclass
class GroupValues:
    """One weight group's tensors in float32 on their device (None where absent), the base's on
    the host until :meth:`on_device`."""

    group: Group
    #: The weight's leaf, when the base has a tensor of its dtype and shape to code it against.
    weight: Leaf | None
    w: torch.Tensor | None
    #: The base's reconstruction of the weight.
    w_base: torch.Tensor | None
    m: torch.Tensor | None
    v: torch.Tensor | None
    #: The base's reconstruction of ``exp_avg_sq``, where the policy reads it
    #: (:meth:`JointPolicy.reads_v_base`) and the base has one of its dtype and shape.
    v_base: torch.Tensor | None = None

    def on_device(self) -> GroupValues:
        """These values with the base's tensors on the device of the state's, for the group's
        turn to be planned: on a GPU, the copies of every group's base at once had been most of
        the state again in device memory."""
        device = next((t.device for t in (self.w, self.m, self.v) if t is not None), None)
        if device is None:
            return self
        return dataclasses.replace(
            self, w_base=None if self.w_base is None else self.w_base.to(device),
            v_base=None if self.v_base is None else self.v_base.to(device))


def coded(stages: tuple[TensorToTensor, ...], array: torch.Tensor) -> Pipeline:
    """The pipeline that entropy-codes ``array`` after ``stages``: byte planes for floats, plain
    for uint8 codes."""
    width, rotate = from_torch(array.dtype, "").plane_layout
    serializer = BytePlanes(width, rotate) if width > 1 else None
    return Pipeline(transforms=stages, serializer=serializer, compressors=(Entropy(),))


def error_record(original: torch.Tensor, decoded: torch.Tensor, *, bound: float | None = None,
                 error: float | None = None, update: float | None = None,
                 norm: float | None = None, **more: float) -> dict[str, float]:
    """The achieved error, for the header: MSE and the relative L2 error ``|x^ - x| / |x|``;
    with ``bound``, the absolute L2 error the mode promised, as a relative ``bound`` (rounded
    up) and a ``within`` flag: whether the achieved error, unrounded, kept it, and the decoded
    tensor kept the original's sign (:func:`keeps_sign`). ``error``: ``|x^ - x|``, where the
    caller has it already. ``update``: ``|x - base|``, for a tensor coded as its update since a
    base, whose bound is relative to it: where it passes ``|x|`` (keys that shifted between
    checkpoints, a layer re-initialized: the base predicts the tensor worse than zeros do) the
    plan is not ``within``, and the tensor is stored bit-exact; a bound relative to such an
    "update" let ExCP and the adaptive mode decode it 1.05-1.40x ``|x|`` away. ``norm``:
    ``|x|``, where the caller has it already."""
    if norm is None:
        norm = magnitude(original)
    if error is None:
        error = distance(decoded, original)
    count = original.numel()
    record = {"mse": error * error / count if count else 0.0,
              "rel": error / norm if norm else float(error > 0)}
    record.update(more)
    rounded = {k: float(f"{v:.4g}") for k, v in record.items()}
    if bound is not None:
        rounded["bound"] = round_up(bound / norm) if norm else float(bound > 0)
        rounded["within"] = float(error <= bound and keeps_sign(original, decoded)
                                  and (update is None or update <= norm))
    return rounded


def keeps_sign(original: torch.Tensor, decoded: torch.Tensor) -> bool:
    """Whether ``decoded`` has no negative value where ``original`` has none. A tensor that is
    never negative (a variance such as BatchNorm's ``running_var``, Adam's ``exp_avg_sq`` where
    it could not be told from a weight) may feed a square root or a log: the L2 bound allows a
    small value to round below zero, this does not (a plan that misses it is stored bit-exact).
    Costs a block of each of the two where both have a negative value near their start (nearly
    every weight); one pass over a decoded tensor that has none (a second moment)."""
    return not hostpath.has_negative(decoded) or hostpath.has_negative(original)


def honoured(encoded: Encoded) -> bool:
    """Whether a plan's decoded error keeps the bound its record states (plans without one do)."""
    record = encoded.extra.get("error", {})
    return bool(record.get("within", 1.0))


def finished(encoded: Encoded) -> Encoded | Exact:
    """``encoded`` once it keeps its bound, else the tensor bit-exact; the record's ``within``
    flag is the encoder's own, and the header leaves it out."""
    record = encoded.extra.get("error", {})
    within = record.pop("within", 1.0)
    return encoded if within else Exact()


def delta_error(error: float, update: float) -> float:
    """The error relative to the update since the base, ``|x^ - x| / |x - base|``, from the
    two norms (``error`` and ``update``) the caller has taken already."""
    return error / update if update else float(error > 0)


def magnitude(tensor: torch.Tensor) -> float:
    """``|x|``, the L2 norm, summed in float64 without a float64 copy of the tensor (by the
    native core on the host)."""
    if _native_floats(tensor):
        return math.sqrt(_native.sum_squares(flat_array(tensor), None,
                                             tensor.element_size()))
    return _torch_norm(tensor)


def _torch_norm(tensor: torch.Tensor, other: torch.Tensor | None = None) -> float:
    """``|tensor - other|`` (``|tensor|`` without ``other``) by torch's ops, summed in float64;
    above ``hostpath.TORCH_PIECE`` elements piece by piece, so that a device holds no float64
    copy of the whole."""
    if tensor.numel() <= hostpath.TORCH_PIECE:
        return float(torch.linalg.vector_norm(tensor if other is None else tensor - other,
                                              dtype=torch.float64))
    if other is None:
        return math.sqrt(hostpath.sum_squares(lambda a: a, tensor))
    return math.sqrt(hostpath.sum_squares(torch.sub, tensor, other))


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b|``. The difference is taken in the tensors' (promoted, at least float32) type:
    exact where the two are within a factor of two of each other (Sterbenz), as a decoded value
    and its original are, else rounded to 2**-24 of itself; its norm is summed in float64."""
    dtype = a.dtype
    if not (dtype == b.dtype and dtype in (torch.float32, torch.float64)):
        dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
        a, b = a.to(dtype), b.to(dtype)
    if _native_floats(a) and _native_floats(b) and a.shape == b.shape:
        return math.sqrt(_native.sum_squares(flat_array(a),
                                             flat_array(b), a.element_size()))
    if a.shape == b.shape:
        return _torch_norm(a, b)
    return magnitude(a - b)


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite: on the host, a NaN or an infinity makes the native sum
    of squares non-finite (one pass, nothing allocated); only where that sum overflows, from
    finite values, does the element-wise check run."""
    if _native_floats(tensor):
        total = _native.sum_squares(flat_array(tensor), None,
                                    tensor.element_size())
        if math.isfinite(total):
            return True
    return bool(torch.isfinite(tensor).all())


def _native_floats(tensor: torch.Tensor) -> bool:
    return native(tensor) and tensor.dtype in (torch.float32, torch.float64)


_ROLES = (
    ("norm", re.compile(r"(^|[._])(ln|norm|layernorm|rmsnorm|bn)[^.]*[._]", re.I)),
    ("bias", re.compile(r"\.bias$")),
    ("embedding", re.compile(r"(embed|wte|wpe|tok|lm_head|pos_emb)", re.I)),
    ("attention", re.compile(r"(attn|attention|q_proj|k_proj|v_proj|o_proj|query|key|value)", re.I)),
    ("mlp", re.compile(r"(mlp|fc|ffn|feed_forward|up_proj|down_proj|gate_proj|dense|c_proj)", re.I)),
)


def role_of(name: str, ndim: int) -> str:
    """The tensor's role in the network, from its name: embedding, attention, mlp, norm or bias
    (1-D tensors are norms or biases), else ``other``."""
    for role, pattern in _ROLES:
        if pattern.search(name) and (role in ("norm", "bias") or ndim >= 2):
            return role
    return "bias" if ndim <= 1 else "other"


class JointPolicy(LosslessPolicy):
    """A lossy mode: each group of a weight and its moments is planned together against the base.

    The first checkpoint of a chain (no base) stays lossless: a keyframe. A tensor equal to the
    base's decoded tensor stays bit-exact (:class:`~ckptzip.policy.Exact`), and so does each
    plan whose decoded error would break the bound its record states.

    ``scope`` picks what is coded lossy (:data:`SCOPES`); ``keep_exact`` lists glob patterns of
    tensor names (``model.ema.*``) kept bit-exact whatever the scope.
    """

    #: The per-parameter optimizer states the mode codes lossy, and the moment each stands for.
    state_roles: ClassVar[Mapping[str, str]] = ADAM_ROLES

    def reads_v_base(self, leaves: list[Leaf], values: GroupValues) -> bool:
        """Whether the group's plan reads the base's ``exp_avg_sq`` too (:meth:`plan_state`
        decodes it when the group's turn comes, and frees it once the group is planned);
        ``values`` without the tensors kept as unchanged."""
        return False

    def __init__(self, pairing: Mapping[str, int | str] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, scope: str = "floats",
                 keep_exact: Sequence[str] = ()) -> None:
        super().__init__(chunk_bytes)
        if scope not in SCOPES:
            raise ConfigError(f"{self.mode}: scope must be one of {SCOPES}, not {scope!r}")
        if pairing is not None and not (isinstance(pairing, Mapping) and all(
                isinstance(k, str) and type(v) in (int, str) for k, v in pairing.items())):
            raise ConfigError(f"{self.mode}: pairing must map weight names (as `ckptzip inspect` "
                              f"lists them) to optimizer state keys (indices, or parameter names), "
                              f"not {pairing!r:.80}")
        if isinstance(keep_exact, str) or not all(isinstance(p, str) for p in keep_exact):
            raise ConfigError(f"{self.mode}: keep_exact must be a list of glob patterns of tensor "
                              f"names (such as 'model.ema.*'), not {keep_exact!r}")
        self.pairing = pairing
        self.scope = scope
        self.keep_exact = tuple(keep_exact)
        #: Whether this checkpoint's training went on from the base as decoded (plan_state).
        self.resumed = False
        #: The next added leaf's provisional index, per planning thread (:meth:`add_leaf`).
        self._numbering = threading.local()
        #: Adam's ``beta2`` by (optimizer root path, parameter index or name), as the state's
        #: optimizer dicts say (:meth:`observe_state`); empty where unknown.
        self.betas: dict[tuple[tuple[object, ...], int | str], float] = {}
        #: Each optimizer's parameter groups, by its root path (:meth:`observe_state`).
        self.runs: dict[tuple[object, ...], list[list[int]]] = {}

    def observe_state(self, state: Any) -> None:
        """Read what the state says of its optimizers (their ``betas``) before planning it."""
        self.betas = second_moment_betas(state)
        self.runs = param_group_runs(state)

    def plan_state(self, leaves: list[Leaf], base: Base | None,
                   progress: Planned | None = None, *, resumed: bool = False,
                   threads: int = 1) -> dict[int, Encoded | Exact]:
        """Each group planned on its own, on ``threads`` threads. A group numbers the leaves it
        adds provisionally, from a range of its own; once planned, in order, they take the next
        final indices, so the plans do not depend on the thread count.

        A mode that surveys the whole checkpoint first (:meth:`survey`) looks at every group
        (:meth:`groups`) before it plans any; the others look at each group in its own task,
        just before planning it: no thread waits for the slowest look, and a group's base
        tensors are decoded in its turn rather than every weight's at once."""
        if base is None:
            return {}
        plans: dict[int, Encoded | Exact] = {}
        self.resumed = resumed
        self._warn_unhandled(leaves)
        self._warn_shared_views(leaves)
        candidates = self._candidate_groups(leaves, base)
        surveys = type(self).survey is not JointPolicy.survey
        looked: list[GroupValues | None]
        if surveys:
            finite = self.groups(leaves, base, plans, threads, candidates)
            self.survey(leaves, finite, base, threads)
            looked, members = list(finite), [v.group for v in finite]
            del finite
        else:
            looked, members = [None] * len(candidates), candidates
        sizes = [group_bytes(leaves, group) for group in members]
        first = PROVISIONAL_LEAVES - len(members) * LEAVES_PER_GROUP
        if first < len(leaves):
            raise ConfigError(f"{self.mode}: {len(leaves)} tensors are more than a lossy plan numbers")

        def look_and_plan(position: int) -> _Planned:
            values = looked[position]
            looked[position] = None  # the group's values, its base tensors among them
            kept: dict[int, Encoded | Exact] = {}
            if values is None:
                values = self._look(leaves, members[position], base, kept)
                if values is None:
                    return None
            start = first + position * LEAVES_PER_GROUP
            self._numbering.next = start
            exp_avg_sq = values.group.exp_avg_sq
            if (values.v is not None and exp_avg_sq is not None
                    and self.reads_v_base(leaves, values)):  # decoded in the group's turn
                values.v_base = _base_value(leaves[exp_avg_sq], base)
            group_plans = self.plan_group(leaves, values.on_device(), base)
            _free_planned_bases(leaves, group_plans, base)
            # the group's host arrays coded in its own task: the threads share the coding as
            # they share the plans, and the save holds the coded chunks from here, not the arrays
            precode(self, leaves, group_plans)
            return kept, start, group_plans

        # a plan is kept until the file is written whichever order the groups finish in; then
        # numbered in the state's order
        gate = device_gate(leaves, members, sizes)
        planned: dict[int, _Planned] = {}
        total = sum(sizes)
        for position, result in by_task(look_and_plan, sizes, threads, gate):
            planned[position] = result
            if progress is not None:
                progress(sizes[position], total)
        added = len(leaves)
        for position, group in enumerate(members):
            result = planned.pop(position)
            if result is None:
                _warn_non_finite(leaves, group, self.mode)
                continue
            kept, start, group_plans = result
            plans.update(kept)
            added = _renumber(group_plans, start, added)
            plans.update(group_plans)
        return plans

    def check_state(self, leaves: list[Leaf]) -> None:
        """Raise :class:`ConfigError` now if an explicit ``pairing`` does not fit the state (a
        caller that plans later, in the background, asks first)."""
        if self.pairing is not None:
            group_state(leaves, self.pairing, self.mode, self.state_roles)

    def survey(self, leaves: list[Leaf], groups: list[GroupValues], base: Base,
               threads: int = 1) -> None:
        """Look at every group before any is planned (what holds for the whole checkpoint), on
        ``threads`` threads; nothing by default."""

    def add_leaf(self, count: int = 1) -> int:
        """The provisional index of the first of ``count`` leaves the group being planned adds
        to the file (:meth:`plan_state` gives them their final ones)."""
        index: int = self._numbering.next
        if index + count > PROVISIONAL_LEAVES:
            raise AssertionError("a group added more leaves than LEAVES_PER_GROUP")
        self._numbering.next = index + count
        return index

    def next_leaf(self) -> int:
        """The index :meth:`add_leaf` will give next, without taking it (a trial plan)."""
        index: int = self._numbering.next
        return index

    def _warn_unhandled(self, leaves: list[Leaf]) -> None:
        """Warn, naming them, of per-parameter optimizer states the mode does not know (an SGD
        momentum buffer outside the adaptive mode, Adafactor's factored moments): they stay
        lossless."""
        unknown: dict[str, list[str]] = {}
        entries = optimizer_entries(leaves)
        lone = lone_first_moments(leaves)
        for index, leaf in enumerate(leaves):
            key = optimizer_state_key(leaf)
            if key is None and in_optimizer_state(leaf, entries):  # a key no mode knows
                flat = FLAT_STATE.match(str(leaf.path[-1]))
                key = flat["key"] if len(leaf.path) == 1 and flat else str(leaf.path[-1])
            if index in lone:
                key = "exp_avg without exp_avg_sq (not Adam's: Lion's momentum?)"
            if key is not None and key not in self.state_roles and lossy_candidate(leaf):
                unknown.setdefault(key, []).append(leaf.name)
        if unknown:
            listed = "; ".join(f"{key} ({len(names)}: {', '.join(names[:2])}"
                               f"{', ...' if len(names) > 2 else ''})" for key, names in unknown.items())
            known = ", ".join(self.state_roles)
            warnings.warn(f"ckptzip mode {self.mode!r} knows the optimizer states {known} only; "
                          f"these stay lossless: {listed}", UnhandledStateWarning, stacklevel=5)

    def _warn_shared_views(self, leaves: list[Leaf]) -> None:
        """Warn, naming them, of float tensors kept lossless because they are views of different
        shapes into one storage: a flat buffer's parameters (Megatron's, DeepSpeed's), or
        moments held that way."""
        shared = [leaf for leaf in leaves if leaf.shared_views and leaf.dtype.kind == "float"]
        if not shared:
            return
        names = [render_path(alias) for leaf in shared for alias in leaf.aliases]
        warnings.warn(
            f"ckptzip mode {self.mode!r}: {len(names)} tensors are views of different shapes "
            f"into {len(shared)} shared storage{'s' if len(shared) > 1 else ''} (a flat "
            f"parameter buffer: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); they "
            f"stay lossless, since a lossy plan bounds each tensor's error alone. To code them "
            f"lossy, save copies that share nothing: {{k: v.clone() for k, v in "
            f"state_dict.items()}}", SharedViewsWarning, stacklevel=5)

    def _candidate_groups(self, leaves: list[Leaf], base: Base | None = None) -> list[Group]:
        """The weight groups a lossy plan may code, without the tensors the scope or
        ``keep_exact`` leaves out; with ``base``, paired around the weights frozen since it."""
        candidates = []
        unchanged = None if base is None else (lambda index: _same_bits(leaves[index], base))
        kept = self._kept_exact(leaves)
        for group in group_state(leaves, self.pairing, self.mode, self.state_roles, unchanged,
                                 self.runs):
            if self.scope == "optimized" and group.exp_avg is None and group.exp_avg_sq is None:
                continue  # a weight no Adam moment pairs with: outside the scope, lossless
            for role in ("weight", "exp_avg", "exp_avg_sq"):
                if getattr(group, role) in kept:
                    setattr(group, role, None)
            candidates.append(group)
        return candidates

    def _kept_exact(self, leaves: list[Leaf]) -> set[int]:
        """The leaves ``keep_exact`` names, by any of their key paths (a tied weight is stored
        once, under its first path: ``lm_head.weight`` tied to ``wte.weight`` is kept exact by
        either name); warns of a pattern that names no tensor (a misspelt name would otherwise
        leave lossy what the user meant to keep exact)."""
        if not self.keep_exact:
            return set()
        kept: set[int] = set()
        used: set[str] = set()
        for index, leaf in enumerate(leaves):
            names = [leaf.name, *(render_path(alias) for alias in leaf.aliases)]
            for pattern in self.keep_exact:
                if any(fnmatch.fnmatchcase(name, pattern) for name in names):
                    kept.add(index)
                    used.add(pattern)
        unused = [pattern for pattern in self.keep_exact if pattern not in used]
        if unused:
            warnings.warn(f"ckptzip mode {self.mode!r}: keep_exact {unused!r} names no tensor of "
                          f"the state; use dotted key paths as `ckptzip inspect` lists them "
                          f"(glob patterns: 'model.head.*')", KeepExactWarning, stacklevel=6)
        return kept

    def _look(self, leaves: list[Leaf], group: Group, base: Base,
              kept: dict[int, Encoded | Exact]) -> GroupValues | None:
        """A group's values, without its tensors equal to the base's decoded ones (those go to
        ``kept`` as :class:`~ckptzip.policy.Exact`); None when a value is NaN or infinite,
        here or in the base (the caller warns: :func:`_warn_non_finite`)."""
        values = self._values(leaves, group, base)
        tensors = (values.w, values.w_base, values.m, values.v)
        if not all(_all_finite(t) for t in tensors if t is not None):
            return None
        if values.v is not None and hostpath.has_negative(values.v):
            # no Adam second moment (a custom optimizer's signed statistic of that name): the
            # modes' log-domain codings and step arithmetic need v >= 0, so it stays as it is
            assert group.exp_avg_sq is not None
            kept[group.exp_avg_sq] = Exact()
            values.v = None
            warnings.warn(f"{leaves[group.exp_avg_sq].name}: an exp_avg_sq with negative values "
                          f"is not Adam's second moment; stored lossless, not as {self.mode} "
                          f"deltas", UnhandledStateWarning, stacklevel=2)
        self._keep_unchanged(leaves, values, base, kept)
        return values

    def groups(self, leaves: list[Leaf], base: Base, plans: dict[int, Encoded | Exact],
               threads: int = 1, candidates: list[Group] | None = None) -> list[GroupValues]:
        """Each weight group's values (of ``candidates``, by default
        :meth:`_candidate_groups`), without the tensors kept bit-exact, which go to ``plans``
        as :class:`~ckptzip.policy.Exact`: those equal to the base's decoded tensor, those the
        scope or ``keep_exact`` leaves out, and groups with NaN or infinite values (here or in
        the base), with a :class:`NonFiniteWarning`. The groups are looked at on ``threads``
        threads, after one parallel decode of every weight's base."""
        if candidates is None:
            candidates = self._candidate_groups(leaves, base)
        base.prefetch([leaves[g.weight].name for g in candidates if g.weight is not None])

        def look(position: int) -> tuple[GroupValues | None, dict[int, Encoded | Exact]]:
            kept: dict[int, Encoded | Exact] = {}
            return self._look(leaves, candidates[position], base, kept), kept

        # the small groups together, as their plans; on a device, the unchanged check copies
        # each weight's base there: a share at a time
        sizes = [group_bytes(leaves, g) for g in candidates]
        looked = dict(by_task(look, sizes, threads, device_gate(leaves, candidates, sizes)))
        finite = []
        for position, group in enumerate(candidates):
            values, kept = looked.pop(position)
            if values is None:
                _warn_non_finite(leaves, group, self.mode)
                continue
            plans.update(kept)
            finite.append(values)
        return finite

    @staticmethod
    def _keep_unchanged(leaves: list[Leaf], values: GroupValues, base: Base,
                        plans: dict[int, Encoded | Exact]) -> None:
        """Take out of ``values`` each tensor equal to the base's decoded tensor of its name,
        which goes to ``plans`` as unchanged (a weight whose update is zero everywhere, only a
        zero's sign apart, is kept exact too)."""
        group = values.group
        if (values.w is not None and values.w_base is not None
                and hostpath.equal(values.w, values.w_base.to(values.w.device))):
            assert group.weight is not None
            plans[group.weight] = Exact(unchanged=_same_bits(leaves[group.weight], base))
            values.weight = values.w = values.w_base = None
        for role, attr in (("exp_avg", "m"), ("exp_avg_sq", "v")):
            index = getattr(group, role)
            if index is not None and getattr(values, attr) is not None and _same_bits(leaves[index], base):
                plans[index] = Exact(unchanged=True)
                setattr(values, attr, None)

    def plan_group(self, leaves: list[Leaf], values: GroupValues,
                   base: Base) -> dict[int, Encoded | Exact]:
        raise NotImplementedError

    @staticmethod
    def _values(leaves: list[Leaf], group: Group, base: Base) -> GroupValues:
        def get(index: int | None) -> torch.Tensor | None:
            return None if index is None else hostpath.cast(leaves[index].tensor, torch.float32)

        weight = None if group.weight is None else leaves[group.weight]
        w_base = None if weight is None else _base_value(weight, base)
        if w_base is None:
            weight = None
        return GroupValues(group, weight, get(group.weight) if weight else None, w_base,
                           get(group.exp_avg), get(group.exp_avg_sq))


#: A group's plan as :meth:`JointPolicy.plan_state` keeps it: the tensors its look kept exact,
#: the first provisional index of the leaves it adds, and its plans; None for a group with NaN
#: or infinite values.
_Planned = tuple[dict[int, Encoded | Exact], int, dict[int, Encoded | Exact]] | None


def _warn_non_finite(leaves: list[Leaf], group: Group, mode: str) -> None:
    names = ", ".join(leaves[i].name for i in group.members())
    warnings.warn(f"{names}: NaN or infinite values (here or in the base); stored lossless, not "
                  f"as {mode} deltas", NonFiniteWarning, stacklevel=3)


def precode(policy: LosslessPolicy, leaves: list[Leaf],
            plans: dict[int, Encoded | Exact]) -> None:
    """Code the chunks of each host array a group's plans store, as the writer would (the same
    chunk size, the same native call, the same bytes), and keep them on the plan
    (:attr:`~ckptzip.policy.Encoded.coded`), its array then a meta tensor (its dtype and shape,
    no memory). A group's task does it once the group is planned: the threads share the coding
    as they share the plans (the writer had coded every array after the last plan, while one
    thread planned the small groups alone), and the save holds the coded chunks of a group from
    then on, not its arrays. Arrays whose pipeline the native core does not code whole are left
    to the writer."""
    for index, plan in plans.items():
        if not isinstance(plan, Encoded) or not native(plan.array):
            continue
        spec = plan.pipeline.native_spec(False)
        leaf = leaves[index] if index < len(leaves) else plan.added
        if spec is None or leaf is None:
            continue
        chunk = plan.pipeline.chunk_size(policy.chunk_bytes(leaf))
        raw = tensor_bytes(plan.array)
        batch = [(raw[start:start + chunk], None, *spec) for start in range(0, len(raw), chunk)]
        if not batch:
            continue
        plan.coded = (chunk, *code_chunks(batch))
        # the array's bytes are in the chunks now: only its dtype and shape are read again
        del batch, raw
        plan.array = torch.empty(plan.array.shape, dtype=plan.array.dtype, device="meta")


def _free_planned_bases(leaves: list[Leaf], plans: dict[int, Encoded | Exact], base: Base) -> None:
    """Once a group is planned, free the base's decoded bytes of each of its tensors planned
    lossy, first taking the CRC-32C the header records of those coded against the base: a save
    then holds the base tensors of the groups not yet planned, not the whole base until its file
    is written. A tensor kept exact keeps its base tensor: the writer codes it against it."""
    for index, plan in plans.items():
        if isinstance(plan, Encoded) and index < len(leaves):  # not a leaf the group adds
            name = leaves[index].name
            if plan.uses_base:
                plan.base_crc = _native.crc32c(base.raw(name))
            base.release(name)


#: A group's plan costs about as much fixed time as the transforms of this many bytes: a few
#: hundred torch calls and Python steps, each holding the GIL (about 3 ms for a bias of 384
#: elements on the 2-core VM of docs/BENCHMARKS.md §7, where a 384 x 1536 weight's group, 7 MB,
#: takes 40-60 ms).
GROUP_FIXED_BYTES = 512 << 10


def plan_tasks(sizes: list[int], threads: int) -> list[list[int]]:
    """The groups' positions as the pool's tasks, in the order they start: first the groups
    whose bytes do not outweigh their fixed cost (:data:`GROUP_FIXED_BYTES`) together in one
    task, on one thread; then each other group alone, the largest first (no thread idles at the
    end behind one large group, such as an embedding's). The small groups' plans are mostly the
    GIL's: two threads planning them at once hand it to each other at every torch call, and
    took twice as long as one (the demo GPT's 50 norms and biases: 0.18-0.26 s against
    0.09-0.11 s). Started first, beside the first large groups, they leave the end to the large
    groups, which the threads share evenly; started last, one thread planned them alone while
    the other idled (the demo GPT's saves on 2 threads, paired against last: adaptive and
    BitSnap 24 ms faster of 0.56-0.78 s, ExCP 6-9 ms of 0.36 s in 9 and 10 of 12 pairs). One
    thread plans every group in the same order."""
    order = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)
    if threads <= 1:
        return [[position] for position in order]
    large = [[p] for p in order if sizes[p] >= GROUP_FIXED_BYTES]
    small = [p for p in order if sizes[p] < GROUP_FIXED_BYTES]
    if not small:
        return large
    return [small, *large]


def group_bytes(leaves: list[Leaf], group: Group) -> int:
    """The bytes of a group's tensors, as its leaves hold them."""
    return sum(leaves[i].nbytes for i in group.members())


def device_gate(leaves: list[Leaf], groups: list[Group],
                sizes: list[int]) -> tuple[ByteGate, Callable[[int], int]] | None:
    """For groups on a device (torch's ops, not the native passes), a gate over their positions
    (weighing ``sizes``) that lets those running at once hold at most :data:`DEVICE_PLAN_SHARE`
    of the groups' bytes (or the largest alone): a group's transforms take a few times its bytes
    in temporaries there, on the device's memory, and its unchanged check a copy of its base.
    None on the host."""
    if not any(not native(leaves[i].tensor) for g in groups for i in g.members()):
        return None
    capacity = max(int(DEVICE_PLAN_SHARE * sum(sizes)), max(sizes))
    return ByteGate(capacity), sizes.__getitem__


_Result = TypeVar("_Result")


def by_task(fn: Callable[[int], _Result], sizes: list[int], threads: int,
            gate: tuple[ByteGate, Callable[[int], int]] | None) -> Iterator[tuple[int, _Result]]:
    """``fn`` of each group's position, the groups run as :func:`plan_tasks`' tasks on
    ``threads`` threads, every task in flight at once (none waits behind a slow one); yields
    (position, result) in the tasks' order. ``gate``: a device's, over the positions."""
    tasks = plan_tasks(sizes, threads)

    def run(task: list[int]) -> list[_Result]:
        return [fn(position) for position in task]

    for task, results in zip(tasks, ordered_map(run, tasks, threads, torch_ops=True,
                                                gate=_per_task(gate), in_flight=len(tasks))):
        yield from zip(task, results)


def _per_task(gate: tuple[ByteGate, Callable[[int], int]] | None,
              ) -> tuple[ByteGate, Callable[[list[int]], int]] | None:
    """A gate over groups' positions as one over :func:`by_task`'s items (tasks of positions): a
    task takes its groups one at a time, so it holds the temporaries of one group at most."""
    if gate is None:
        return None
    byte_gate, weigh = gate
    return byte_gate, lambda task: max(map(weigh, task))


def _base_value(leaf: Leaf, base: Base) -> torch.Tensor | None:
    """The base's decoded tensor of ``leaf``'s name in float32 on the host (a group takes it to
    the leaf's device in its turn, :meth:`GroupValues.on_device`), where the base has one of the
    leaf's dtype and shape; else None."""
    found = base.tensor(leaf.name)
    if found is None or (found.dtype, found.shape) != (leaf.dtype, leaf.shape):
        return None
    return base.value(leaf.name).float()


def _renumber(plans: dict[int, Encoded | Exact], start: int, added: int) -> int:
    """Give the leaves a group added, numbered provisionally from ``start``, their final indices
    from ``added`` on, in ``plans`` and in the stages that read them; returns the next free one."""
    numbers = {index: added + i for i, index in enumerate(sorted(i for i in plans if i >= start))}
    if not numbers:
        return added
    for index in list(plans):
        plan = plans.pop(index)
        if isinstance(plan, Encoded):
            pipeline = plan.pipeline
            plan.pipeline = dataclasses.replace(
                pipeline, transforms=tuple(t.renumbered(numbers) for t in pipeline.transforms))
        plans[numbers.get(index, index)] = plan
    return added + len(numbers)


def _same_bits(leaf: Leaf, base: Base) -> bool:
    """Whether ``leaf`` holds exactly the bits of the base's decoded tensor of its name."""
    found = base.tensor(leaf.name)
    if found is None or (found.dtype, found.shape) != (leaf.dtype, leaf.shape):
        return False
    if not native(leaf.tensor) and _head_differs(leaf, base):
        return False
    data = leaf.host_bytes()
    if base.differs(leaf.name, data):  # the base file's chunk CRCs tell: nothing decoded
        return False
    # a tensor that differs keeps its base bytes: its group's plan reads them (a second moment's
    # base under the ratio coding, a weight kept exact for its zeros' signs coded against it),
    # and _free_planned_bases frees them once the group is planned
    return _native.bytes_equal(data, base.raw(leaf.name))  # one memcmp


def _head_differs(leaf: Leaf, base: Base) -> bool:
    """Whether the first bytes of a tensor on a device already differ from its base's: nearly
    every moment changes between checkpoints, and its whole copy to the host (2/3 of a state's
    bytes, through pageable memory) is what the unchanged-tensor check cost there."""
    head = base.head_bytes(leaf.name)
    itemsize = leaf.dtype.itemsize
    if not 0 < head <= leaf.nbytes or head % itemsize or not leaf.tensor.is_contiguous():
        return False
    first = leaf.tensor.detach().reshape(-1)[:head // itemsize]
    return base.head_differs(leaf.name, tensor_bytes(first))


def finish_decoded(
    leaf: Leaf, array: torch.Tensor, quantizer: KMeans | None, *, residual: bool = False,
    ratio: BaseRatio | None = None, partition: BasePartition | None = None,
    base: torch.Tensor | None = None, original: torch.Tensor | None = None,
    support: tuple[Support, torch.Tensor] | None = None, codes: torch.Tensor | None = None,
    lowrank: tuple[LowRank, dict[int, torch.Tensor]] | None = None,
    zeros: tuple[ExactZeros, torch.Tensor] | None = None,
    rounding: tuple[TensorToTensor, ...] = (), bound: float | None = None, **more: float,
) -> tuple[Encoded, torch.Tensor]:
    """The plan that stores ``array``, and the tensor a reader will decode from it. Store
    ``array`` (pruned elements zero; a residual against ``base`` when ``residual``, the ratio
    to it when ``ratio``, the :class:`~ckptzip.codecs.BaseRatio` stage that takes it; the
    codes partitioned by the base's zeros after the quantizer with ``partition``);
    only at a sibling's non-zeros with ``support``, its stage and that mask), through
    ``quantizer`` (needed unless ``residual``), and record the error of what a reader will
    decode against ``original`` (the leaf by default). ``codes``: the quantizer's codes of
    ``array``, where the caller fixed them (a codebook rescaled after assigning them).
    ``lowrank``: the stage and its decoded factors by leaf index, when ``array`` is already
    what is left after their product. ``zeros``: the stage and the packed change mask of an
    update whose unchanged elements decode exactly. ``rounding``: the stages of an unbiased
    rounding before the quantizer (a :class:`~ckptzip.codecs.Dither` whose shift ``array``
    already holds). ``bound``: the absolute L2 error the mode promises; by default, no worse than
    storing nothing (:data:`NO_WORSE`: the update, or the tensor, left out)."""
    stages: tuple[TensorToTensor, ...] = (
        (LossyResidual(leaf.dtype.name),) if residual else (ratio,) if ratio is not None
        else ())
    siblings = {**({} if lowrank is None else lowrank[1]),
                **({} if zeros is None else {zeros[0].leaf: zeros[1]})}
    context = TransformContext(leaf.name, base, None if support is None else support[1],
                               siblings or None)
    if zeros is not None:
        stages = (*stages, zeros[0])
    if lowrank is not None:
        stages = (*stages, lowrank[0])
    stages = (*stages, *rounding)
    if support is not None:
        stages = (*stages, support[0])
        array = support[0].encode(array, context)
    if quantizer is not None:
        array = quantizer.encode(array, context) if codes is None else codes
        stages = (*stages, quantizer)
    if partition is not None:
        array = partition.encode(array, context)
        stages = (*stages, partition)
    decoded = undo(stages, array, context)  # what a reader will decode
    reference = leaf.tensor if original is None else original
    kept = hostpath.count_nonzero(array)  # no boolean copy: one native pass on the host
    more.setdefault("kept", kept / reference.numel() if reference.numel() else 0.0)
    # each norm once: the error enters the record and the error relative to the update, and
    # the update the default bound too
    error = distance(decoded, reference)
    update = distance(reference, base) if residual and base is not None else None
    norm = magnitude(reference)  # the default bound's and the record's
    if bound is None:
        bound = NO_WORSE * (norm if update is None else update)
    if update is not None:  # a residual against a base
        more["rel_delta"] = delta_error(error, update)
    record = error_record(reference, decoded, bound=bound, error=error, update=update, norm=norm,
                          **more)
    return (Encoded(coded(stages, array), array, {"error": record},
                    uses_base=residual or ratio is not None), decoded)


def finish(
    leaf: Leaf, array: torch.Tensor, quantizer: KMeans | None, **options: Any,
) -> Encoded:
    """:func:`finish_decoded`'s plan, without the tensor a reader decodes."""
    return finish_decoded(leaf, array, quantizer, **options)[0]
