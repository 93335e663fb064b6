"""State trees <-> a JSON description plus a list of tensor leaves, without pickle.

A checkpoint is any nesting of dicts, lists and tuples whose leaves are tensors, numpy arrays,
JSON-able scalars, strings, None and bytes. :func:`flatten` turns it into a JSON-able *node* (the
"tree" of the file header) and a list of :class:`Leaf` (the tensors to compress); :func:`unflatten`
rebuilds the same types and structure from them. Dict keys keep their types (an optimizer's int
parameter ids stay ints), tuples stay tuples, and tensors that share storage (tied weights) become
one leaf and come back sharing it.

Node grammar (also in docs/FORMAT.md): a JSON null/bool/int/finite float/str is itself; every other
value is an object whose ``"t"`` names its type.
"""

from __future__ import annotations

import math
import re
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import dtypes
from .dtypes import DType
from .errors import FormatError, UnsupportedError, VersionError

#: Deepest nesting a file may describe; deeper trees are rejected as malformed.
MAX_DEPTH = 256

KeyPath = tuple[Any, ...]

#: Python's default limit on the digits of an int parsed from text (3.11, 3.10.7): a reader's
#: ``json.loads`` refuses a longer int in a header, so no writer stores one.
MAX_INT_DIGITS = 4300
#: The most dims a stored tensor or view may have.
MAX_DIMS = 64


def render_path(path: KeyPath) -> str:
    """``("optimizer", "state", 3, "exp_avg")`` -> ``optimizer.state.3.exp_avg``."""
    return ".".join(str(k) for k in path) if path else "<root>"


@dataclass
class Leaf:
    """One stored array: its name (dotted key path), type, shape and data."""

    name: str
    path: KeyPath
    dtype: DType
    shape: tuple[int, ...]
    #: The values, as a torch tensor on its original device (numpy arrays and bytes are wrapped
    #: without copying). Not necessarily contiguous.
    tensor: torch.Tensor
    #: Other key paths whose values are this leaf (tied weights) or views into it.
    aliases: list[KeyPath] = field(default_factory=list)
    #: Whether the leaf is the span of one storage that views of different shapes share (the
    #: parameters of a flat buffer): each comes back as a view of it (``aliases``).
    shared_views: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def host_bytes(self) -> np.ndarray:
        """The raw little-endian element bytes as a contiguous 1-D uint8 array on the host."""
        return tensor_bytes(self.tensor)


def host_copies(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor copied into fresh CPU memory, same dtype and shape (pinned, with non-blocking
    copies and one synchronization, for CUDA tensors), so the originals may change as soon as
    this returns; a meta tensor (no data) as it is."""
    copies: list[torch.Tensor] = []
    on_cuda = False
    for tensor in tensors:
        if tensor.is_meta:  # no data to copy (an array coded already, see Encoded.coded)
            copies.append(tensor)
            continue
        pin = tensor.device.type == "cuda"
        on_cuda |= pin
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        copies.append(copy.copy_(tensor.detach(), non_blocking=pin))
    if on_cuda:
        torch.cuda.synchronize()
    return copies


#: Real dtypes numpy has: a host tensor of one gives its array in one torch call.
_NUMPY_REAL = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32,
                         torch.int16, torch.int8, torch.uint8, torch.bool})


def flat_array(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor's elements as a 1-D numpy array (for a native pass): a view of its memory
    where it is contiguous (a native pass's output writes through it), a contiguous copy
    otherwise. The same array as ``tensor.detach().contiguous().reshape(-1).numpy()`` in one
    torch call where the tensor is contiguous, not three: each of torch's calls lets go of the
    GIL and takes it back (``reshape`` six times), and on two threads every letting go can hand
    the GIL to the other thread, which the first then waits out (a lossy save made some 120,000
    of them)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.numpy().reshape(-1)


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's raw little-endian element bytes as a contiguous 1-D uint8 array on the host
    (a view where the tensor already is one, a copy otherwise)."""
    if tensor.is_cpu and tensor.dtype in _NUMPY_REAL and not tensor.is_neg():
        return flat_array(tensor).view(np.uint8)  # two or three torch calls, not seventeen
    flat = tensor.detach().resolve_conj().resolve_neg().reshape(-1)
    return flat.to("cpu").contiguous().view(torch.uint8).numpy()


@dataclass
class _TensorRef:
    node: dict[str, Any]
    path: KeyPath
    tensor: torch.Tensor


class _Flattener:
    def __init__(self) -> None:
        self.leaves: list[Leaf] = []
        self.torch_refs: list[_TensorRef] = []
        self.by_object: dict[int, int] = {}

    def add_leaf(self, path: KeyPath, dtype: DType, tensor: torch.Tensor) -> int:
        # named once the whole tree is known (flatten: leaf_names)
        self.leaves.append(Leaf("", path, dtype, tuple(tensor.shape), tensor))
        return len(self.leaves) - 1

    def visit(self, value: Any, path: KeyPath) -> Any:
        if len(path) > MAX_DEPTH:  # a reader refuses deeper trees (any node): never write one
            raise UnsupportedError(f"{render_path(path[:8])}...: the state nests deeper than "
                                   f"{MAX_DEPTH} levels, more than a checkpoint may; flatten it")
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            return _checked_str(value, path)
        if isinstance(value, int) and type(value) is int:
            return _checked_int(value, path)
        if type(value) is float:
            return value if math.isfinite(value) else _non_finite(value)
        if isinstance(value, torch.Tensor):
            return self.visit_tensor(value, path)
        if isinstance(value, np.ndarray):
            if type(value) is not np.ndarray and not isinstance(value, np.memmap):
                sub = type(value)  # a memmap is plain data; other subclasses add meaning
                raise UnsupportedError(
                    f"{render_path(path)}: a numpy {sub.__module__}.{sub.__qualname__}, an "
                    "ndarray subclass, would load as a plain ndarray without what the subclass "
                    "adds (a masked array's mask, np.matrix's product); store np.asarray(x) "
                    "instead, and a masked array's mask as an array of its own (np.ma.getmaskarray(x))")
            return self.visit_ndarray(value, path)
        if isinstance(value, np.generic):
            dt = dtypes.from_numpy(value.dtype, render_path(path))
            raw = np.asarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
            return {"t": "npscalar", "dtype": dt.name, "v": raw.hex()}
        if isinstance(value, (bytes, bytearray)):
            kind = "bytes" if type(value) is bytes else "bytearray"
            data = torch.frombuffer(bytearray(value), dtype=torch.uint8) if value else (
                torch.empty(0, dtype=torch.uint8)
            )
            index = self.add_leaf(path, dtypes.from_torch(torch.uint8, ""), data)
            return {"t": kind, "i": index}
        if type(value) is complex:
            return {"t": "complex", "v": [self.visit(value.real, path), self.visit(value.imag, path)]}
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "v": dtypes.from_torch(value, render_path(path)).name}
        if isinstance(value, torch.device):
            return {"t": "device", "v": str(value)}
        if isinstance(value, torch.Size):
            return {"t": "size", "v": list(value)}
        if type(value) in (dict, OrderedDict):
            return self.visit_dict(value, path)
        if type(value) in (list, tuple):
            kind = "list" if type(value) is list else "tuple"
            return {"t": kind, "v": [self.visit(v, (*path, i)) for i, v in enumerate(value)]}
        raise UnsupportedError(
            f"{render_path(path)}: a value of type {type(value).__module__}.{type(value).__qualname__} "
            f"cannot be stored without pickle; convert it to tensors, numpy arrays, dicts, lists, "
            f"tuples, numbers, strings, bytes or None"
        )

    def visit_dict(self, value: dict[Any, Any], path: KeyPath) -> dict[str, Any]:
        node: dict[str, Any]
        if all(type(k) is str for k in value):
            node = {"t": "dict", "o": {_checked_key(k, path): self.visit(v, (*path, k))
                                       for k, v in value.items()}}
        else:
            keys = []
            for k in value:
                if isinstance(k, (torch.Tensor, np.ndarray, bytes, bytearray, dict, list)):
                    raise UnsupportedError(
                        f"{render_path(path)}: dict key {k!r:.40} of type {type(k).__name__} cannot "
                        f"be stored; use str, int, float, bool, None or tuples of them as keys"
                    )
                keys.append(self.visit(k, (*path, "<key>")))
            node = {"t": "dict", "k": keys, "v": [self.visit(v, (*path, k)) for k, v in value.items()]}
        if type(value) is OrderedDict:
            node["ordered"] = True
            metadata = getattr(value, "_metadata", None)
            if metadata is not None:
                node["m"] = self.visit(metadata, (*path, "_metadata"))
        return node

    def visit_tensor(self, value: torch.Tensor, path: KeyPath) -> dict[str, Any]:
        kind = type(value)
        if (kind is torch.Tensor or kind is torch.nn.Parameter) and value.layout == torch.strided \
                and not value.is_nested and value.device.type != "meta" \
                and value.dtype in dtypes.TORCH_DTYPES:  # the common case, checked at once
            return self.tensor_node(value, path)
        where = render_path(path)
        if value.is_nested:  # strided (layout torch.strided, yet no sizes) or jagged
            raise UnsupportedError(
                f"{where}: a nested tensor cannot be stored; store its components as a list of "
                "tensors, list(x.unbind()), and rebuild it with torch.nested.nested_tensor"
            )
        if value.layout != torch.strided:
            raise UnsupportedError(
                f"{where}: {value.layout} tensors cannot be stored; convert with .to_dense()"
            )
        if value.device.type == "meta":
            raise UnsupportedError(f"{where}: a meta tensor has no data to store; materialize it")
        kind = type(value)
        if kind.__name__ == "DTensor" and kind.__module__.startswith("torch.distributed"):
            raise UnsupportedError(
                f"{where}: a DTensor, this rank's shard of a distributed tensor (FSDP2, tensor "
                "parallelism); ckptzip.save stores whole tensors. Save a sharded state with "
                "torch.distributed.checkpoint and ckptzip.dcp.CompressedWriter (docs/DCP.md), or "
                "gather it first: torch.distributed.checkpoint.state_dict.get_state_dict(model, "
                "optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))")
        if kind not in (torch.Tensor, torch.nn.Parameter):
            try:  # a subclass whose data is a storage of its own is stored as a plain tensor
                value.detach().untyped_storage().data_ptr()
            except Exception:  # its own dispatch may raise anything
                raise UnsupportedError(
                    f"{where}: a tensor of subclass {kind.__module__}.{kind.__qualname__}, "
                    "whose data is not one storage, cannot be stored; convert it to a plain "
                    "tensor first") from None
        dtypes.from_torch(value.dtype, where)
        return self.tensor_node(value, path)

    def tensor_node(self, value: torch.Tensor, path: KeyPath) -> dict[str, Any]:
        node: dict[str, Any] = {"t": "tensor"}
        if isinstance(value, torch.nn.Parameter):
            node["param"] = True
        if value.requires_grad:
            node["grad"] = True
        self.torch_refs.append(_TensorRef(node, path, value.detach()))
        return node

    def visit_ndarray(self, value: np.ndarray, path: KeyPath) -> dict[str, Any]:
        index = self.by_object.get(id(value))
        if index is None:
            dt = dtypes.from_numpy(value.dtype, render_path(path))
            array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
            raw = array.reshape(-1).view(np.uint8)
            if dt.torch_dtype is None:
                raise UnsupportedError(f"{render_path(path)}: numpy dtype {value.dtype} unsupported")
            # torch.from_numpy gives empty arrays a zero stride, which .view(dtype) rejects
            flat = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
            tensor = flat.view(dt.torch_dtype).reshape(value.shape)
            index = self.add_leaf(path, dt, tensor)
            self.by_object[id(value)] = index
        else:
            self.leaves[index].aliases.append(path)
        if value.dtype.byteorder == ">":  # stored little-endian; the array comes back as it was
            return {"t": "ndarray", "i": index, "bo": ">"}
        return {"t": "ndarray", "i": index}

    def assign_torch_leaves(self) -> None:
        """Give every tensor a leaf, storing tensors that share storage once.

        Identical views of one storage (tied weights) all point at one leaf. Different views of one
        storage with one dtype share a leaf holding the span of storage they cover, and each comes
        back as an ``as_strided`` view of it, as torch.save would restore them.
        """
        groups: dict[tuple[Any, ...], list[_TensorRef]] = {}
        singles: list[list[_TensorRef]] = []
        for ref in self.torch_refs:
            t = ref.tensor
            empty = t.numel() == 0 or t.untyped_storage().nbytes() == 0
            if (t.is_conj() or t.is_neg()) and not empty:
                # Torch's lazy conjugate / negative bit: the storage holds the values before
                # the bit applies, so a view of it (or its span, as_strided) is wrong for the
                # tensors that lack the bit or have another. The tensor is resolved into a leaf
                # of its own, no longer tied to the storage it views (it loads as a plain
                # tensor of its values); identical views with the same bits stay one leaf.
                key = ("lazy", t.is_conj(), t.is_neg(), str(t.device), t.untyped_storage().data_ptr(),
                       t.dtype, t.storage_offset(), t.shape, t.stride())
                same = groups.setdefault(key, [])
                ref.tensor = same[0].tensor if same else t.resolve_conj().resolve_neg()
                same.append(ref)
            elif empty:
                ref.tensor = t.resolve_conj().resolve_neg()  # no values, no bits on its leaf
                singles.append([ref])
            else:
                groups.setdefault((str(t.device), t.untyped_storage().data_ptr()), []).append(ref)
        position = {id(ref): i for i, ref in enumerate(self.torch_refs)}
        ordered = sorted([*groups.values(), *singles], key=lambda refs: position[id(refs[0])])
        for refs in ordered:
            self.assign_group(refs)

    def assign_group(self, refs: list[_TensorRef]) -> None:
        first = refs[0].tensor
        if len(refs) == 1 and first.is_contiguous():  # no other view, no overlap: itself
            refs[0].node["i"] = self.add_leaf(refs[0].path, dtypes.from_torch(first.dtype, ""), first)
            return
        geometry = {(r.tensor.dtype, r.tensor.storage_offset(), r.tensor.shape, r.tensor.stride())
                    for r in refs}
        covered = sum((n - 1) * s for n, s in zip(first.shape, first.stride()) if n > 0) + 1
        # one geometry is stored as the tensor itself, unless its elements overlap in memory
        # (an expand()ed tensor, stride 0): stored whole it would grow, and a lossy mode would
        # code its copies of one value apart; as a view of the storage it covers, it stays one
        if len(geometry) == 1 and covered >= first.numel():
            index = self.add_leaf(refs[0].path, dtypes.from_torch(first.dtype, ""), first)
            self.leaves[index].aliases.extend(r.path for r in refs[1:])
            for r in refs:
                r.node["i"] = index
            return
        if len({r.tensor.dtype for r in refs}) > 1:
            for r in refs:  # differently typed views of one storage: stored separately
                r.node["i"] = self.add_leaf(r.path, dtypes.from_torch(r.tensor.dtype, ""), r.tensor)
            return
        start = min(r.tensor.storage_offset() for r in refs)
        end = max(
            r.tensor.storage_offset()
            + sum((n - 1) * s for n, s in zip(r.tensor.shape, r.tensor.stride()) if n > 0)
            + 1
            for r in refs
        )
        span = torch.as_strided(first, (end - start,), (1,), start)
        index = self.add_leaf(refs[0].path, dtypes.from_torch(first.dtype, ""), span)
        self.leaves[index].aliases.extend(r.path for r in refs)
        self.leaves[index].shared_views = len(geometry) > 1
        for r in refs:
            r.node.update(
                t="view", i=index, offset=r.tensor.storage_offset() - start,
                shape=list(r.tensor.shape), stride=list(r.tensor.stride()),
            )


def _checked_str(value: str, path: KeyPath) -> str:
    """``value``, once it is known to encode as UTF-8 (a header's JSON)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, as surrogateescape decodes a byte
            raise UnsupportedError(
                f"{render_path(path)}: the string {value!a:.60} holds a lone surrogate "
                "(a non-UTF-8 name decoded with surrogateescape?), which UTF-8 cannot store; "
                "store it as bytes (os.fsencode(s)) or decode it with errors='replace'") from None
    return value


def _checked_key(key: str, path: KeyPath) -> str:
    """A str dict key at ``path``, once it is known to encode as UTF-8."""
    if not key.isascii():  # the message names the dict: the key itself may not print
        _checked_str(key, (*path, f"<key {key!a:.60}>"))
    return key


_PLAIN_NAN = struct.pack("<d", float("nan"))


def _non_finite(value: float) -> dict[str, Any]:
    """A float JSON cannot hold; a NaN other than Python's own (a sign, a payload) keeps its
    bits."""
    node: dict[str, Any] = {"t": "float", "v": repr(value)}
    bits = struct.pack("<d", value)
    if math.isnan(value) and bits != _PLAIN_NAN:
        node["bits"] = bits.hex()
    return node


def _checked_int(value: int, path: KeyPath) -> int:
    """``value``, once it is known to have few enough digits for a reader's JSON parser."""
    if value.bit_length() > 2000:  # 603 digits or fewer are always within the limits
        limit = getattr(sys, "get_int_max_str_digits", lambda: 0)() or MAX_INT_DIGITS
        limit = min(limit, MAX_INT_DIGITS)  # the writer's own json.dumps has its limit too
        if abs(value) >= 10**limit:
            raise UnsupportedError(
                f"{render_path(path)}: an int of {value.bit_length()} bits has more than {limit} "
                "digits, more than a header's JSON may hold (Python's int/str limit); store it "
                "as bytes: x.to_bytes((x.bit_length() + 8) // 8, 'little', signed=True)")
    return value


def flatten(state: Any) -> tuple[Any, list[Leaf]]:
    """Describe ``state`` as a JSON-able node plus its leaves (see the module docstring)."""
    flattener = _Flattener()
    node = flattener.visit(state, ())
    flattener.assign_torch_leaves()
    for leaf, name in zip(flattener.leaves, leaf_names(node, len(flattener.leaves))):
        leaf.name = name
    return node, flattener.leaves


TENSOR_KINDS = ("tensor", "view", "ndarray")
LEAF_KINDS = (*TENSOR_KINDS, "bytes", "bytearray")


def _key_text(key: Any) -> str:
    """A dict key node as text in a dotted name: ``3``, ``name``, ``(2,x)`` for a tuple key."""
    if isinstance(key, dict):
        items = key.get("v")
        if key.get("t") in ("tuple", "list") and isinstance(items, list):
            return "(" + ",".join(_key_text(item) for item in items) + ")"
        return "?"
    return str(key)


def leaf_refs(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every node of a tree that refers to a leaf, with its key path as text, in tree order."""
    if not isinstance(node, dict):
        return
    kind = node.get("t")
    if kind in LEAF_KINDS:
        yield path, node
    elif kind in ("list", "tuple") and isinstance(node.get("v"), list):
        for i, child in enumerate(node["v"]):
            yield from leaf_refs(child, (*path, str(i)))
    elif kind == "dict":
        if isinstance(node.get("o"), dict):
            for key, child in node["o"].items():
                yield from leaf_refs(child, (*path, key))
        elif isinstance(node.get("k"), list) and isinstance(node.get("v"), list):
            for key, child in zip(node["k"], node["v"]):
                yield from leaf_refs(child, (*path, _key_text(key)))


def leaf_index(node: Any) -> int | None:
    """The index of the leaf a tree node refers to, or None (not a leaf node, or malformed)."""
    index = node.get("i") if isinstance(node, dict) else None
    return index if type(index) is int else None


def leaf_paths(node: Any) -> dict[str, int]:
    """The leaf index at each place a tree refers to a leaf, by dotted key path (``#2``, ``#3``
    set colliding paths apart), in tree order."""
    found: dict[str, int] = {}
    for path, ref in leaf_refs(node):
        index = leaf_index(ref)
        if index is not None:
            found[unique_name(path, found)] = index
    return found


def flat_items(node: Any) -> dict[str, Any] | None:
    """The item nodes, by key, of a tree that is a dict with str keys (as :func:`flatten` stores
    one), or None for any other tree."""
    if isinstance(node, dict) and node.get("t") == "dict" and isinstance(node.get("o"), dict):
        items: dict[str, Any] = node["o"]
        return items
    return None


def flat_tree(items: dict[str, Any]) -> dict[str, Any]:
    """The tree of a dict of these item nodes (a part of what :func:`flat_items` gave)."""
    return {"t": "dict", "o": items}


def unique_name(path: tuple[str, ...], taken: Container[str]) -> str:
    """The dotted name of ``path``, with ``#2``, ``#3`` appended while it is already taken."""
    name = candidate = ".".join(path) if path else "<root>"
    n = 1
    while candidate in taken:
        n += 1
        candidate = f"{name}#{n}"
    return candidate


def leaf_names(node: Any, n_leaves: int) -> list[str]:
    """Each leaf's name: the dotted key path of the first place the tree refers to it; ``#2``,
    ``#3`` set apart names that would otherwise collide. Writers and readers both derive names
    this way, so files need not store them."""
    names: list[str | None] = [None] * n_leaves
    taken: set[str] = set()
    for path, ref in leaf_refs(node):
        index = ref.get("i")
        if type(index) is not int or not 0 <= index < n_leaves or names[index] is not None:
            continue
        name = unique_name(path, taken)
        taken.add(name)
        names[index] = name
    return [name if name is not None else f"<unreferenced {i}>" for i, name in enumerate(names)]


LeafGetter = Callable[[int], torch.Tensor]


class _Builder:
    def __init__(self, get_leaf: LeafGetter, n_leaves: int, source: str,
                 device: torch.device | None = None) -> None:
        self.get_leaf = get_leaf
        self.n_leaves = n_leaves
        self.source = source
        self.device = device
        self.cache: dict[int, torch.Tensor] = {}
        self.moved: dict[int, torch.Tensor] = {}

    def fail(self, path: KeyPath, what: str) -> FormatError:
        return FormatError(
            f"{self.source}: malformed tree at {render_path(path)}: {what}; the header is damaged "
            f"or was not written by ckptzip"
        )

    def leaf(self, node: dict[str, Any], path: KeyPath, *, host: bool = False) -> torch.Tensor:
        """Leaf ``node["i"]``, fetched once; on ``self.device`` (moved once, so tensors tied
        through it stay tied) unless ``host``: numpy arrays and bytes are made on the host."""
        index = node.get("i")
        if type(index) is not int or not 0 <= index < self.n_leaves:
            raise self.fail(path, f"leaf index {index!r} out of range")
        if index not in self.cache:
            self.cache[index] = self.get_leaf(index)
        if host or self.device is None:
            return self.cache[index]
        if index not in self.moved:
            self.moved[index] = self.cache[index].to(self.device)
        return self.moved[index]

    def ints(self, value: Any, path: KeyPath, what: str) -> list[int]:
        if not isinstance(value, list) or not all(type(v) is int and 0 <= v < 1 << 63 for v in value):
            raise self.fail(path, f"{what} must be a list of non-negative 64-bit ints")
        return value

    def build(self, node: Any, path: KeyPath) -> Any:
        if len(path) > MAX_DEPTH:
            raise self.fail(path, f"nesting deeper than {MAX_DEPTH}")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise self.fail(path, f"unexpected {type(node).__name__}")
        kind = node["t"]
        builder = getattr(self, "build_" + kind, None)
        if builder is None:
            raise VersionError(f"{self.source}: {render_path(path)}: unknown tree node type "
                               f"{kind!r}; the file needs a newer ckptzip (pip install -U ckptzip)")
        return builder(node, path)

    def build_float(self, node: dict[str, Any], path: KeyPath) -> float:
        if node.get("v") not in ("nan", "inf", "-inf"):
            raise self.fail(path, "bad non-finite float")
        if "bits" not in node:
            return float(node["v"])
        bits = node["bits"]
        if node["v"] != "nan" or not isinstance(bits, str) or not re.fullmatch("[0-9a-f]{16}", bits):
            raise self.fail(path, "a NaN's bits must be 16 lowercase hex digits")
        value: float = struct.unpack("<d", bytes.fromhex(bits))[0]
        if not math.isnan(value):
            raise self.fail(path, "a NaN's bits are not a NaN")
        return value

    def build_complex(self, node: dict[str, Any], path: KeyPath) -> complex:
        parts = node.get("v")
        if not isinstance(parts, list) or len(parts) != 2:
            raise self.fail(path, "complex needs two parts")
        real, imag = (self.build(p, path) for p in parts)
        if not isinstance(real, float) or not isinstance(imag, float):
            raise self.fail(path, "complex parts must be floats")
        return complex(real, imag)

    def build_npscalar(self, node: dict[str, Any], path: KeyPath) -> np.generic:
        dt = dtypes.from_name(str(node.get("dtype")))
        try:
            raw = bytes.fromhex(node.get("v", ""))
        except (TypeError, ValueError):
            raise self.fail(path, "numpy scalar bytes are not hex") from None
        if dt.numpy_dtype is None or len(raw) != dt.itemsize:
            raise self.fail(path, "numpy scalar of the wrong size")
        return np.frombuffer(raw, dtype=dt.numpy_dtype.newbyteorder("<"))[0].astype(dt.numpy_dtype)

    def build_dtype(self, node: dict[str, Any], path: KeyPath) -> torch.dtype:
        torch_dtype = dtypes.from_name(str(node.get("v"))).torch_dtype
        if torch_dtype is None:
            raise self.fail(path, "not a torch dtype")
        return torch_dtype

    def build_device(self, node: dict[str, Any], path: KeyPath) -> torch.device:
        try:
            return torch.device(str(node.get("v")))
        except RuntimeError:
            raise self.fail(path, "bad device") from None

    def build_size(self, node: dict[str, Any], path: KeyPath) -> torch.Size:
        return torch.Size(self.ints(node.get("v"), path, "size"))

    def build_list(self, node: dict[str, Any], path: KeyPath) -> list[Any]:
        items = node.get("v")
        if not isinstance(items, list):
            raise self.fail(path, "list items missing")
        return [self.build(v, (*path, i)) for i, v in enumerate(items)]

    def build_tuple(self, node: dict[str, Any], path: KeyPath) -> tuple[Any, ...]:
        return tuple(self.build_list(node, path))

    def build_dict(self, node: dict[str, Any], path: KeyPath) -> dict[Any, Any]:
        result: dict[Any, Any] = OrderedDict() if node.get("ordered") else {}
        if "o" in node:
            if not isinstance(node["o"], dict):
                raise self.fail(path, "dict items missing")
            for k, v in node["o"].items():
                result[k] = self.build(v, (*path, k))
        else:
            keys, values = node.get("k"), node.get("v")
            if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
                raise self.fail(path, "dict keys and values do not match")
            for k_node, v_node in zip(keys, values):
                key = self.build(k_node, (*path, "<key>"))
                try:
                    result[key] = self.build(v_node, (*path, key))
                except TypeError:
                    raise self.fail(path, "unhashable dict key") from None
        if "m" in node:
            if not isinstance(result, OrderedDict):  # writers give only OrderedDicts metadata
                raise self.fail(path, "metadata on a plain dict")
            result._metadata = self.build(node["m"], (*path, "_metadata"))  # type: ignore[attr-defined]
        return result

    def build_tensor(self, node: dict[str, Any], path: KeyPath) -> torch.Tensor:
        return self.finish_tensor(self.leaf(node, path), node, path)

    def build_view(self, node: dict[str, Any], path: KeyPath) -> torch.Tensor:
        base = self.leaf(node, path)
        shape = self.ints(node.get("shape"), path, "view shape")
        stride = self.ints(node.get("stride"), path, "view stride")
        offset = node.get("offset")
        if type(offset) is not int or not 0 <= offset < 1 << 63 or len(shape) != len(stride) \
                or len(shape) > MAX_DIMS or math.prod(shape) >= 1 << 63:
            raise self.fail(path, "bad view geometry")
        reach = offset + sum((n - 1) * s for n, s in zip(shape, stride) if n > 0)
        if math.prod(shape) > 0 and reach >= base.numel():
            raise self.fail(path, "view reaches past its storage")
        return self.finish_tensor(torch.as_strided(base, shape, stride, offset), node, path)

    def finish_tensor(self, tensor: torch.Tensor, node: dict[str, Any], path: KeyPath) -> torch.Tensor:
        if node.get("grad") and not (tensor.is_floating_point() or tensor.is_complex()):
            raise self.fail(path, f"a {tensor.dtype} tensor cannot require gradients")
        if node.get("param"):
            return torch.nn.Parameter(tensor, requires_grad=bool(node.get("grad")))
        if node.get("grad"):
            return tensor.requires_grad_(True)
        return tensor

    def build_ndarray(self, node: dict[str, Any], path: KeyPath) -> np.ndarray:
        tensor = self.leaf(node, path, host=True)
        dt = dtypes.from_torch(tensor.dtype, render_path(path))
        if dt.numpy_dtype is None:
            raise self.fail(path, f"dtype {dt.name} has no numpy equivalent")
        array = tensor.reshape(-1).view(torch.uint8).numpy().view(dt.numpy_dtype).reshape(tensor.shape)
        if not self.big_endian(node, dt, path):
            return array
        return array.astype(array.dtype.newbyteorder(">"))

    def big_endian(self, node: dict[str, Any], dt: DType, path: KeyPath) -> bool:
        if "bo" not in node:
            return False
        if node["bo"] != ">" or dt.itemsize == 1:
            raise self.fail(path, 'an array\'s byte order must be ">", of items wider than a byte')
        return True

    def build_bytes(self, node: dict[str, Any], path: KeyPath) -> bytes:
        tensor = self.leaf(node, path, host=True)
        if tensor.dtype != torch.uint8 or tensor.dim() != 1:  # what writers store bytes as
            raise self.fail(path, f"bytes from a {tensor.dtype}{list(tensor.shape)} leaf")
        return tensor.numpy().tobytes()

    def build_bytearray(self, node: dict[str, Any], path: KeyPath) -> bytearray:
        return bytearray(self.build_bytes(node, path))


class _Checker(_Builder):
    """A :class:`_Builder` over stand-ins of the leaves (meta tensors of their dtypes and
    shapes): every check a load makes of the tree, nothing decoded or allocated."""

    def build_ndarray(self, node: dict[str, Any], path: KeyPath) -> np.ndarray:
        tensor = self.leaf(node, path)
        dt = dtypes.from_torch(tensor.dtype, render_path(path))
        if dt.numpy_dtype is None:
            raise self.fail(path, f"dtype {tensor.dtype} has no numpy equivalent")
        self.big_endian(node, dt, path)
        return np.empty(0)

    def build_bytes(self, node: dict[str, Any], path: KeyPath) -> bytes:
        tensor = self.leaf(node, path)
        if tensor.dtype != torch.uint8 or tensor.dim() != 1:
            raise self.fail(path, f"bytes from a {tensor.dtype}{list(tensor.shape)} leaf")
        return b""


def check_tree(node: Any, leaves: list[tuple[torch.dtype, tuple[int, ...]]],
               source: str = "<memory>") -> None:
    """Raise the :class:`FormatError` a load of ``node`` would (a leaf index out of range, a
    view past its storage, an unknown node type, nesting too deep), given each leaf's dtype and
    shape, without the leaves' data: ``ckptzip verify`` says OK only of a file that loads."""

    def stand_in(index: int) -> torch.Tensor:
        dtype, shape = leaves[index]
        return torch.empty(shape, dtype=dtype, device="meta")

    _Checker(stand_in, len(leaves), source).build(node, ())


def unflatten(node: Any, get_leaf: LeafGetter, n_leaves: int, source: str = "<memory>",
              device: torch.device | None = None) -> Any:
    """Rebuild a state from its node; ``get_leaf(i)`` gives leaf ``i`` as a torch tensor with its
    stored dtype and shape. Leaves referenced several times are fetched once and shared. Tensors
    are put on ``device`` (None: where ``get_leaf`` gives them); numpy arrays and bytes are
    made on the host whatever it is."""
    return _Builder(get_leaf, n_leaves, source, device).build(node, ())
