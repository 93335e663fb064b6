"""Copies of a training state that training may go on changing: on the host (:func:`snapshot`),
or on the accelerator where the tensors are (:func:`device_snapshot`, for lossy transforms run
there in the background). :class:`ckptzip.CheckpointManager` makes one per async save."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .tree import Leaf, flatten, host_copies, unflatten


def snapshot(state: Any, flat: tuple[Any, list[Leaf]] | None = None) -> Any:
    """A host copy of ``state`` with the same structure, types, ties and views.

    Every array is copied into fresh CPU memory (pinned, with non-blocking copies and one
    synchronization, for CUDA tensors), so training may change ``state`` as soon as this returns.
    A value ckptzip cannot store raises :class:`ckptzip.UnsupportedError` here, not later.
    """
    tree, leaves = flat or flatten(state)
    copies = host_copies(leaf.tensor for leaf in leaves)
    return unflatten(tree, copies.__getitem__, len(copies))


@dataclass
class DeviceSnapshot:
    """A copy of a state made on its accelerator: CUDA tensors are cloned on the device (a
    device-to-device copy, far faster than one to the host), CPU values copied to fresh memory.
    ``ready`` marks, on the training stream, when the clones are complete."""

    state: Any
    ready: Any  # torch.cuda.Event | None
    #: The CUDA device of the clones (the first one's, for a state spread over several).
    device: Any = None

    @contextlib.contextmanager
    def background(self) -> Iterator[None]:
        """Run the block on that device's side stream, which first waits for the clones, so
        background work overlaps training's kernels instead of queueing behind them (tensors on
        other devices keep their own stream order after their clones)."""
        if self.ready is None:
            yield
            return
        with torch.cuda.device(self.device):
            stream = _side_stream()
            stream.wait_event(self.ready)
            with torch.cuda.stream(stream):
                yield
            stream.synchronize()


_SIDE_STREAMS: dict[int, Any] = {}


def _side_stream() -> Any:
    """One side stream per device for background transforms, kept for the process's life: the
    caching allocator keeps freed blocks per stream, so a new stream per save would allocate
    (and synchronize the device) afresh every time."""
    device = torch.cuda.current_device()
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def device_snapshot(state: Any, flat: tuple[Any, list[Leaf]] | None = None) -> DeviceSnapshot:
    """Clone ``state``'s CUDA tensors on their device and copy the rest to the host, keeping the
    structure, ties and views (:func:`snapshot` copies everything to the host)."""
    tree, leaves = flat or flatten(state)
    copies: list[torch.Tensor] = []
    on_cuda = False
    for leaf in leaves:
        source = leaf.tensor.detach()
        if source.device.type == "cuda":
            on_cuda = True
            copies.append(source.clone(memory_format=torch.contiguous_format))
        else:
            copies.append(torch.empty(source.shape, dtype=source.dtype).copy_(source))
    ready = device = None
    if on_cuda:
        device = next(c.device for c in copies if c.device.type == "cuda")
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))
    return DeviceSnapshot(unflatten(tree, copies.__getitem__, len(copies)), ready, device)
