"""One rank of the multi-process DCP tests, launched by tests/test_dcp.py with torchrun (gloo, CPU).

``save DIR`` (any world size): an FSDP2-sharded model and its Adam state saved with
``dcp.save`` (``full``), one step later as a delta against it (``delta``), with ``dcp.async_save``
(``async``), and a save into ``fail`` (over a complete checkpoint) in which rank 1's disk fails
mid-file. Rank 0 keeps the unsharded reference states beside them with ``torch.save``.

``load DIR`` (any world size): the same model sharded over this world loads each checkpoint and
compares its unsharded state with the reference, bit for bit. The test calls :func:`load` in its
own process too, with an unsharded model (a world of one).

DIR may be a URL (``s3://bucket/dcp``): the checkpoints then go there with the storage options in
``CKPTZIP_TEST_STORAGE_OPTIONS`` (JSON), and the references to the local ``CKPTZIP_TEST_REFS``.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from ckptzip import sinks
from ckptzip.dcp import CompressedReader, CompressedWriter

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def options() -> dict[str, Any] | None:
    text = os.environ.get("CKPTZIP_TEST_STORAGE_OPTIONS")
    return json.loads(text) if text else None


def refs(root: str) -> str:
    """Where the reference states go: beside the checkpoints, or locally for a URL root."""
    return os.environ.get("CKPTZIP_TEST_REFS", root) if "://" in root else root


def writer_for(path: str, **kwargs: Any) -> CompressedWriter:
    return CompressedWriter(path, storage_options=options(), **kwargs)


def reader_for(path: str) -> CompressedReader:
    return CompressedReader(path, storage_options=options())


def mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same tiny MLP on every rank; odd sizes, so that shards are uneven."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 7), torch.nn.LayerNorm(7)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def sharded_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """:func:`mlp` sharded over the world with FSDP2."""
    model, _ = mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> None:
    torch.manual_seed(100 + step)  # the same batch on every rank
    model(torch.randn(16, 24)).square().mean().backward()
    optim.step()
    optim.zero_grad()


def states(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(model, optim)
    return {"model": model_state, "optim": optim_state, "step": step}


def reference(model: torch.nn.Module, optim: torch.optim.Optimizer, path: str) -> None:
    model_state, optim_state = get_state_dict(model, optim, options=FULL)
    if dist.get_rank() == 0:
        torch.save({"model": model_state, "optim": optim_state}, path)


def save(root: str) -> None:
    model, optim = sharded_model()
    train_step(model, optim, 1)
    reference(model, optim, f"{refs(root)}/full.pt")
    dcp.save(states(model, optim, 1), storage_writer=writer_for(f"{root}/full"))
    dcp.async_save(states(model, optim, 1), storage_writer=writer_for(f"{root}/async")).result()

    train_step(model, optim, 2)
    reference(model, optim, f"{refs(root)}/delta.pt")
    dcp.save(states(model, optim, 2), storage_writer=writer_for(f"{root}/delta", base=f"{root}/full"))

    dcp.save(states(model, optim, 2), storage_writer=writer_for(f"{root}/fail"))
    if dist.get_rank() == 1:
        def failing(sink: sinks.Sink, data: bytes) -> None:
            # a small file's coded chunks may go out in one write (a task's at once): every
            # write fails, the first included
            raise OSError(errno.ENOSPC, "No space left on device")

        sinks.FileSink.write = failing  # type: ignore[method-assign]
        sinks.StreamSink.write = failing  # type: ignore[method-assign]
    try:
        dcp.save(states(model, optim, 2), storage_writer=writer_for(f"{root}/fail"))
    except CheckpointException as exc:  # DCP re-raises rank 1's failure on every rank
        assert list(exc.failures) == [1] and "No space left" in str(exc), exc
    else:
        raise AssertionError("the save with a failing rank succeeded")


def same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}.{i}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


Build = Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]]


def load(root: str, build: Build = sharded_model) -> None:
    """Load each checkpoint into the model ``build`` makes; compare with the references."""
    for name, expected_step in (("full", 1), ("async", 1), ("delta", 2)):
        model, optim = build()
        state = states(model, optim, 0)
        dcp.load(state, storage_reader=reader_for(f"{root}/{name}"))
        assert state["step"] == expected_step
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        model_state, optim_state = get_state_dict(model, optim, options=FULL)
        if not dist.is_initialized() or dist.get_rank() == 0:
            ref = torch.load(f"{refs(root)}/{name.replace('async', 'full')}.pt", weights_only=True)
            same(ref, {"model": model_state, "optim": optim_state}, name)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        root = sys.argv[2]
        {"save": save, "load": load}[sys.argv[1]](root if "://" in root else os.path.abspath(root))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # the work is done and checked: leave without the interpreter's teardown, where gloo's
    # threads once aborted a rank ("terminate called without an active exception", SIGABRT) on
    # a loaded machine after a successful load
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
