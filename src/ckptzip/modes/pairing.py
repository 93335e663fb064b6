"""Which tensors of a state are float weights and Adam moments, and which moments are whose.

Joint pruning (ExCP) needs each weight's own ``exp_avg`` and ``exp_avg_sq``. A checkpoint laid out
as ``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}`` (PyTorch, the HF Trainer,
Lightning) numbers the optimizer's parameters 0, 1, ... group after group, and each group lists
its parameters in the model's order. So the optimizer's states, by index, are the model's
parameters (tied ones once, frozen ones left out) in one ordered run, or two (weight decay and
no decay, as the HF Trainer and nanoGPT make them); they are paired by matching shapes along the
model's order, trying each split into two runs. Equal shapes in both groups could be told apart
only by the optimizer's ``param_groups``: pass ``pairing`` for layouts of more groups. An
optimizer state keyed by parameter names instead (``torch.distributed.checkpoint.state_dict.
get_state_dict``'s layout: ``state["0.weight"]["exp_avg"]``) pairs each name with the weight
whose last key is that name. An explicit ``pairing`` (weight name -> optimizer state index or
name) overrides this; where neither works, the moments are coded on their own, with a warning.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ..errors import ConfigError
from ..tree import Leaf, render_path

MOMENTS = ("exp_avg", "exp_avg_sq")
#: The per-parameter optimizer states a mode codes lossy, by their key in the optimizer's state,
#: and the moment each stands for in its weight's :class:`Group`: Adam's two moments.
ADAM_ROLES: Mapping[str, str] = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
#: Adam's moments and SGD's momentum buffer, as the first moment: SGD steps by ``lr * buffer``
#: as Adam steps by ``lr * exp_avg / sqrt(exp_avg_sq)`` (the adaptive mode).
MOMENTUM_ROLES: Mapping[str, str] = {**ADAM_ROLES, "momentum_buffer": "exp_avg"}
#: Float tensors smaller than this stay lossless: nothing to gain, and statistics are meaningless.
MIN_LOSSY_ELEMENTS = 16
#: The per-parameter states of torch.optim's optimizers, by their keys: under a ``state`` dict
#: keyed by parameter names (not indices), a leaf is taken for an optimizer state only when its
#: key is one of these, so that a model's own dict called ``state`` is not.
TORCH_STATE_KEYS = frozenset({
    "step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "sum", "square_avg",
    "grad_avg", "acc_delta", "exp_inf", "mu_product", "eta", "mu", "ax", "prev", "step_size",
})


class PairingWarning(UserWarning):
    """The optimizer's moments could not be matched to the model's weights."""


@dataclass
class Group:
    """A weight and its Adam moments (leaf indices; any of them may be missing)."""

    weight: int | None = None
    exp_avg: int | None = None
    exp_avg_sq: int | None = None
    #: The optimizer's index (or name) of the parameter, when the moments come from an
    #: optimizer state.
    param_id: int | str | None = None

    def members(self) -> tuple[int, ...]:
        """The leaf indices the group has: its weight, then its moments."""
        return tuple(i for i in (self.weight, self.exp_avg, self.exp_avg_sq) if i is not None)


#: An optimizer's per-parameter state under one flat key, as torch.distributed.checkpoint names
#: its items: ``optim.state.<parameter fqn>.<state key>``, with the ``@offsets`` ckptzip's DCP
#: writer gives a shard (a weight's shard and its moments' have the same offsets).
FLAT_STATE = re.compile(r"^(?:(?P<root>.+?)\.)?state\.(?P<param>.+)\.(?P<key>\w+)(?P<shard>@[\d,]*)?$")


def _flat_state(leaf: Leaf) -> re.Match[str] | None:
    """The parts of a flat key like ``optim.state.0.weight.exp_avg@0,0`` whose state key is
    one of :data:`TORCH_STATE_KEYS`, else None."""
    if len(leaf.path) != 1 or not isinstance(leaf.path[0], str):
        return None
    match = FLAT_STATE.match(leaf.path[0])
    return match if match is not None and match["key"] in TORCH_STATE_KEYS else None


def _moment_of(leaf: Leaf, roles: Mapping[str, str] = ADAM_ROLES
               ) -> tuple[tuple[object, ...], int | str, str] | None:
    """``(optimizer root path, parameter index, moment)`` for a leaf like
    ``optimizer.state.3.exp_avg`` whose state key ``roles`` names (the moment: its role)."""
    key = optimizer_state_key(leaf)
    if key is None or key not in roles:
        return None
    flat = _flat_state(leaf)
    if flat is not None:  # the parameter's name with the shard's offsets: a shard pairs with one
        return (flat["root"] or "",), flat["param"] + (flat["shard"] or ""), roles[key]
    param = leaf.path[-2]
    assert isinstance(param, (int, str))  # optimizer_state_key saw to it
    return leaf.path[:-3], param, roles[key]


#: How deep :func:`second_moment_betas` looks for optimizer state dicts.
BETAS_DEPTH = 6


_Groups = tuple[tuple[object, ...], list[dict[Any, Any]]]


def _param_groups(state: Any) -> Iterator[_Groups]:
    """``(path, param_groups)`` of each optimizer state dict in ``state`` (a dict with ``state``
    and ``param_groups``, as torch's optimizers save them), at most :data:`BETAS_DEPTH` levels
    down; a group that is not a dict is left out."""

    def visit(node: Any, path: tuple[object, ...]) -> Iterator[_Groups]:
        if len(path) > BETAS_DEPTH:
            return
        if isinstance(node, dict):
            groups = node.get("param_groups")
            if "state" in node and isinstance(groups, (list, tuple)):
                yield path, [group for group in groups if isinstance(group, dict)]
                return
            for key, value in node.items():
                yield from visit(value, (*path, key))
        elif isinstance(node, (list, tuple)):
            for key, value in enumerate(node):
                yield from visit(value, (*path, key))

    yield from visit(state, ())


def second_moment_betas(state: Any) -> dict[tuple[tuple[object, ...], int | str], float]:
    """``beta2`` by ``(optimizer root path, parameter index)``, read from each optimizer state
    dict in ``state`` whose groups list their ``params`` and ``betas`` (torch's Adam and AdamW);
    nothing where no group says."""
    found: dict[tuple[tuple[object, ...], int | str], float] = {}
    for path, groups in _param_groups(state):
        for group in groups:
            betas, params = group.get("betas"), group.get("params")
            if (isinstance(betas, (list, tuple)) and len(betas) == 2
                    and isinstance(betas[1], (int, float)) and isinstance(params, list)):
                for index in params:
                    if type(index) in (int, str):  # an index, or a parameter's name
                        found[(path, index)] = float(betas[1])
    return found


def param_group_runs(state: Any) -> dict[tuple[object, ...], list[list[int]]]:
    """Each optimizer's parameter indices, group by group (its ``param_groups``' ``params``), by
    the optimizer's root path: each group lists its parameters in the model's order, so each is
    one run of the model's weights (:func:`_by_order`)."""
    found: dict[tuple[object, ...], list[list[int]]] = {}
    for path, groups in _param_groups(state):
        runs = [group.get("params") for group in groups]
        if all(isinstance(run, list) and all(type(i) is int for i in run) for run in runs):
            found[path] = [list(run) for run in runs if run]
    return found


def moment_key(leaf: Leaf) -> tuple[tuple[object, ...], int | str] | None:
    """``(optimizer root path, parameter index)`` of a moment leaf, the key of
    :func:`second_moment_betas`."""
    moment = _moment_of(leaf)
    return None if moment is None else (moment[0], moment[1])


def optimizer_state_key(leaf: Leaf) -> str | None:
    """The key of a per-parameter optimizer state (``exp_avg``, ``momentum_buffer``, ...) for a
    leaf like ``optimizer.state.3.momentum_buffer``, or, keyed by the parameter's name,
    ``optimizer.state.0.weight.exp_avg`` (a key of :data:`TORCH_STATE_KEYS`), else None."""
    path = leaf.path
    if len(path) >= 3 and path[-3] == "state" and isinstance(path[-1], str) and (
            type(path[-2]) is int or (type(path[-2]) is str and path[-1] in TORCH_STATE_KEYS)):
        return path[-1]
    flat = _flat_state(leaf)
    return None if flat is None else flat["key"]


def lone_first_moments(leaves: list[Leaf]) -> set[int]:
    """The ``exp_avg`` leaves with no ``exp_avg_sq`` beside them in their optimizer's entry: no
    Adam first moment (Lion keeps its momentum under that key alone, and steps by its sign, which
    a first moment's coding flipped in 18-29% of the elements), so no mode's moment."""
    paths = {path for leaf in leaves for path in (leaf.path, *leaf.aliases)}
    lone: set[int] = set()
    for index, leaf in enumerate(leaves):
        if optimizer_state_key(leaf) != "exp_avg":
            continue
        flat = _flat_state(leaf)
        if flat is not None:  # optim.state.<name>.exp_avg@<offsets>
            key = str(leaf.path[0])
            sibling: tuple[object, ...] = (key[:flat.start("key")] + "exp_avg_sq" + key[flat.end("key"):],)
        else:
            sibling = (*leaf.path[:-1], "exp_avg_sq")
        if sibling not in paths:
            lone.add(index)
    return lone


def optimizer_entries(leaves: list[Leaf]) -> frozenset[tuple[object, ...]]:
    """The per-parameter entries of optimizer states keyed by parameter name: the paths
    ``(..., "state", name)``, or a flat key's ``(root, name)``, under which some leaf has a key
    of :data:`TORCH_STATE_KEYS` (torch's optimizers all keep a ``step`` tensor there). Every
    leaf under such an entry is the optimizer's, a key no mode knows (Adafactor's ``row_var``)
    included: it must never be taken for a weight."""
    found: set[tuple[object, ...]] = set()
    for leaf in leaves:
        path = leaf.path
        if (len(path) >= 3 and path[-3] == "state" and type(path[-2]) is str
                and path[-1] in TORCH_STATE_KEYS):
            found.add(path[:-1])
        flat = _flat_state(leaf)
        if flat is not None:
            found.add((flat["root"] or "", flat["param"]))
    return frozenset(found)


def in_optimizer_state(leaf: Leaf, entries: frozenset[tuple[object, ...]]) -> bool:
    """Under some optimizer's per-parameter ``state`` (moments, momentum buffers, steps, and
    under an entry of :func:`optimizer_entries` any other key)."""
    path = leaf.path
    if optimizer_state_key(leaf) is not None or any(
            a == "state" and type(b) is int for a, b in pairwise(path)):
        return True
    if len(path) >= 3 and path[-3] == "state" and path[:-1] in entries:
        return True
    flat = FLAT_STATE.match(path[0]) if len(path) == 1 and isinstance(path[0], str) else None
    return flat is not None and (flat["root"] or "", flat["param"]) in entries


def lossy_candidate(leaf: Leaf) -> bool:
    """Whether a lossy mode may code the leaf: a float of 16 or 32 bits (an fp8 tensor is a
    byte an element already, its grid too coarse to round onto another; the modes plan in
    float32, and an fp64 tensor's update below float32's resolution decoded several times its
    size away) of at least :data:`MIN_LOSSY_ELEMENTS` elements, that is one tensor: not the
    storage several views of different shapes share (a flat parameter buffer's parameters,
    whose errors a plan of their span would neither bound nor record one by one)."""
    return (leaf.dtype.kind == "float" and 2 <= leaf.dtype.itemsize <= 4
            and leaf.numel >= MIN_LOSSY_ELEMENTS and not leaf.shared_views)


def group_state(leaves: list[Leaf], pairing: Mapping[str, int | str] | None, mode: str,
                roles: Mapping[str, str] = ADAM_ROLES,
                unchanged: Callable[[int], bool] | None = None,
                runs: Mapping[tuple[object, ...], list[list[int]]] | None = None) -> list[Group]:
    """Every lossy-coded tensor of the state, grouped as weight + moments where possible (the
    optimizer states ``roles`` names are the moments). ``unchanged(index)``: whether a weight
    equals its base's, to pair by order around frozen weights; ``runs``: each optimizer's
    parameter groups (:func:`param_group_runs`), by its root path (see :func:`_by_order`)."""
    states: dict[int | str, Group] = {}
    roots: set[tuple[object, ...]] = set()
    lone = lone_first_moments(leaves)
    for index, leaf in enumerate(leaves):
        found = _moment_of(leaf, roles)
        if found is None or not lossy_candidate(leaf) or index in lone:
            continue
        root, param_id, moment = found
        roots.add(root)
        group = states.setdefault(param_id, Group(param_id=param_id))
        setattr(group, moment, index)
    entries = optimizer_entries(leaves)
    weights = [
        i for i, leaf in enumerate(leaves)
        if lossy_candidate(leaf) and not in_optimizer_state(leaf, entries)
    ]
    if not states:
        if pairing:  # it names optimizer states the state does not have
            _explicit(leaves, weights, states, pairing)
        return [Group(weight=w) for w in weights]
    if len(roots) > 1:
        return _unpaired(weights, states, mode, f"the state holds {len(roots)} optimizers")
    named = all(type(param_id) is str for param_id in states)
    if not named and not all(type(param_id) is int for param_id in states):
        return _unpaired(weights, states, mode, "its state mixes parameter indices and names")
    matched: dict[int | str, int] | None
    if pairing is not None:
        matched = _explicit(leaves, weights, states, pairing)
    elif named:
        matched = _by_name(leaves, weights, states, mode)
    else:
        root_runs = None if runs is None else runs.get(next(iter(roots)))
        matched = _by_order(leaves, weights, states, unchanged, root_runs)
        if matched is not None:
            matched = _settle_ambiguity(leaves, weights, states, matched, mode, unchanged)
    if matched is None:
        return _unpaired(weights, states, mode, "their shapes do not follow the model's parameters")
    for param_id, weight in matched.items():
        states[param_id].weight = weight
    paired = set(matched.values())
    return [*states.values(), *(Group(weight=w) for w in weights if w not in paired)]


def _shape(leaves: list[Leaf], group: Group) -> tuple[int, ...]:
    index = group.exp_avg if group.exp_avg is not None else group.exp_avg_sq
    assert index is not None
    return leaves[index].shape


def _by_name(leaves: list[Leaf], weights: list[int], states: dict[int | str, Group],
             mode: str) -> dict[int | str, int]:
    """Pair optimizer states keyed by parameter names with the weights whose last key is that
    name (``model.state_dict()``'s keys are those names), or, in a flat state of dotted keys
    (DCP's items: ``model.0.weight@0,0`` beside ``optim.state.0.weight.exp_avg@0,0``), ends with
    it, and whose shape is the states'; a name that no weight, or several, answer to leaves its
    states on their own, with a warning."""
    by_key: dict[object, list[int]] = {}
    by_tail: dict[str, list[int]] = {}
    for w in weights:
        key = leaves[w].path[-1]
        by_key.setdefault(key, []).append(w)
        if len(leaves[w].path) == 1 and isinstance(key, str):
            parts = key.split(".")
            for i in range(1, len(parts)):
                by_tail.setdefault(".".join(parts[i:]), []).append(w)
    matched: dict[int | str, int] = {}
    lost = []
    for param_id, group in states.items():
        shape = _shape(leaves, group)
        found = [w for w in by_key.get(param_id, []) if leaves[w].shape == shape]
        if not found and isinstance(param_id, str):
            found = [w for w in by_tail.get(param_id, []) if leaves[w].shape == shape]
        if len(found) == 1:
            matched[param_id] = found[0]
        else:
            lost.append(str(param_id))
    if lost:
        warnings.warn(
            f"ckptzip mode {mode!r}: {len(lost)} optimizer states keyed by parameter name match "
            f"no single weight of their name and shape ({', '.join(lost[:3])}"
            f"{', ...' if len(lost) > 3 else ''}); coding their moments on their own, which "
            f"compresses less. Pass pairing={{weight name: parameter name}} to pair them.",
            PairingWarning, stacklevel=6,
        )
    return matched


def _by_order(leaves: list[Leaf], weights: list[int], states: dict[int | str, Group],
              unchanged: Callable[[int], bool] | None = None,
              runs: list[list[int]] | None = None) -> dict[int | str, int] | None:
    """Pair optimizer states (by index) with weights (in model order): one run in model order
    per parameter group where the optimizer's ``param_groups`` say which (``runs``: each
    group's parameter indices), else one run, or two (decay and no-decay groups), split where
    both runs fit. Guessing the split took the first that fit, trying the largest first: with
    nanoGPT's groups (every matrix, then every bias) the last matrix's run took a bias, and the
    biases' moments went to one another's weights.

    Where a shape has more weights than states (frozen layers, buffers), the earliest weights
    of it would be taken: a frozen first layer of several alike took the next layer's moments,
    and each later layer its successor's. So, given ``unchanged``, the weights of such shapes
    that equal their base (frozen: the optimizer has no state for them) are left out first;
    where the states no longer fit, all are matched as before."""
    if unchanged is not None:
        states_of = Counter(_shape(leaves, group) for group in states.values())
        weights_of = Counter(leaves[w].shape for w in weights)
        frozen = {w for w in weights
                  if weights_of[leaves[w].shape] > states_of[leaves[w].shape] > 0 and unchanged(w)}
        if frozen:
            found = _by_order(leaves, [w for w in weights if w not in frozen], states, runs=runs)
            if found is not None:
                return found
            # more unchanged weights than surplus ones (a layer held at lr=0 beside a frozen
            # one of its shape): leave out only the surplus, the earliest unchanged first (frozen
            # layers come first), rather than all of them or none (a trained layer then lost
            # its moments to the frozen one)
            surplus = {shape: weights_of[shape] - states_of[shape] for shape in states_of}
            dropped: set[int] = set()
            for w in weights:
                shape = leaves[w].shape
                if w in frozen and surplus.get(shape, 0) > 0:
                    dropped.add(w)
                    surplus[shape] -= 1
            if dropped != frozen:  # else the same try as above
                found = _by_order(leaves, [w for w in weights if w not in dropped], states,
                                  runs=runs)
                if found is not None:
                    return found
    shapes = [leaves[w].shape for w in weights]
    if runs is not None:
        ordered = [run for run in ([i for i in run if i in states] for run in runs) if run]
        if sorted(i for run in ordered for i in run) == sorted(states, key=int):
            used: set[int] = set()
            by_groups: dict[int | str, int] = {}
            for run in ordered:
                positions = _run([_shape(leaves, states[i]) for i in run], shapes, used)
                if positions is None:
                    break
                used.update(positions)
                by_groups.update((i, weights[k]) for i, k in zip(run, positions))
            else:
                return by_groups
    ids = sorted(states, key=int)
    wanted = [_shape(leaves, states[i]) for i in ids]
    for split in [len(ids), *range(len(ids) - 1, 0, -1)]:
        first = _run(wanted[:split], shapes, set())
        second = None if first is None else _run(wanted[split:], shapes, set(first))
        if first is not None and second is not None:
            return {i: weights[k] for i, k in zip(ids, first + second)}
    return None


#: Key names of a copy of the weights that no optimizer steps (an EMA, an SWA average, a
#: distillation teacher): where the optimizer's states fit such a copy and the model alike,
#: the other run is the model's.
COPY_NAMES = re.compile(r"(^|[._-])(ema|swa|averaged?|avg|shadow|teacher)([._-]|$)", re.IGNORECASE)


def _settle_ambiguity(leaves: list[Leaf], weights: list[int], states: dict[int | str, Group],
                      matched: dict[int | str, int], mode: str,
                      unchanged: Callable[[int], bool] | None = None) -> dict[int | str, int]:
    """``matched``, or another run of the weights where the states fit it too and only it is
    not named as a copy (:data:`COPY_NAMES`): shapes alone cannot tell the optimizer's weights
    from a copy of them, and an EMA laid out before the model took the model's moments, so
    ExCP pruned the model's update at its cap. Where names cannot tell either, it warns. Weights
    unchanged since the base (``unchanged``: frozen layers) make no such run."""
    ids = sorted(states, key=int)
    taken = set(matched.values())
    rest = [w for w in weights if w not in taken]
    wanted = [_shape(leaves, states[i]) for i in ids]
    positions = _run(wanted, [leaves[w].shape for w in rest], set()) if len(ids) > 1 else None
    if positions is not None and unchanged is not None:  # their bytes read only where it may be
        rest = [w for w in rest if not unchanged(w)]
        positions = _run(wanted, [leaves[w].shape for w in rest], set())
    if positions is None:
        return matched
    other = {i: rest[k] for i, k in zip(ids, positions)}

    def a_copy(run: dict[int | str, int]) -> bool:
        return all(COPY_NAMES.search(render_path(leaves[w].path[:-1])) for w in run.values())

    if a_copy(matched) and not a_copy(other):
        return other
    if a_copy(other) and not a_copy(matched):
        return matched
    first, second = leaves[matched[ids[0]]].name, leaves[other[ids[0]]].name
    warnings.warn(
        f"ckptzip mode {mode!r}: the optimizer's states fit two runs of the state's weights by "
        f"shape (from {first} and from {second}); pairing them with the first, in the state's "
        f"order. If the second is the trained model, pass pairing={{weight name: optimizer "
        f"state index}} or put the model first.", PairingWarning, stacklevel=5)
    return matched


def _run(wanted: list[tuple[int, ...]], shapes: list[tuple[int, ...]], used: set[int]) -> list[int] | None:
    """Positions of ``wanted`` as a subsequence of ``shapes`` (skipping ``used``), earliest first."""
    found: list[int] = []
    position = 0
    for shape in wanted:
        while position < len(shapes) and (position in used or shapes[position] != shape):
            position += 1
        if position == len(shapes):
            return None
        found.append(position)
        position += 1
    return found


def _explicit(
    leaves: list[Leaf], weights: list[int], states: dict[int | str, Group],
    pairing: Mapping[str, int | str],
) -> dict[int | str, int]:
    by_name = {leaves[w].name: w for w in weights}
    for w in weights:  # a tied weight's other paths name it too
        by_name.update((render_path(alias), w) for alias in leaves[w].aliases)
    matched: dict[int | str, int] = {}
    for name, param_id in pairing.items():
        weight = by_name.get(name)
        if weight is None or param_id not in states:
            raise ConfigError(
                f"pairing: {name!r} -> {param_id!r} names no float weight or no optimizer state; "
                f"use dotted key paths (as `ckptzip inspect` lists them) and the optimizer "
                f"state's keys (indices, or parameter names)"
            )
        if leaves[weight].shape != _shape(leaves, states[param_id]):
            raise ConfigError(f"pairing: {name!r} and optimizer state {param_id} differ in shape")
        matched[param_id] = weight
    return matched


def _unpaired(weights: list[int], states: dict[int | str, Group], mode: str,
              why: str) -> list[Group]:
    warnings.warn(
        f"ckptzip mode {mode!r}: cannot pair the optimizer's moments with the model's weights "
        f"({why}); coding them on their own, which compresses less. Pass pairing={{weight name: "
        f"optimizer state index}} to pair them.",
        PairingWarning, stacklevel=5,
    )
    return [*states.values(), *(Group(weight=w) for w in weights)]
