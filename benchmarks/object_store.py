"""ckptzip on object storage against its peers: one training state, one local S3 server (SeaweedFS
on 127.0.0.1, started here by tests/s3server.py), one run.

The state is a transformer's full training state in fp32: per block the weights of width
``--width`` (4 attention matrices, a 4x MLP) with AdamW's ``exp_avg`` and ``exp_avg_sq``, in the
layout of ``optimizer.state_dict()``, plus step and scheduler. ``--blocks`` sets its size (1 block
of width 1024: 151 MB; 40 blocks: 6.0 GB). Methods, each saving the same state to the server and
loading it back:

* ``ckptzip``: ``ckptzip.save(state, "s3://...")`` (a multipart upload streamed while coding) and
  ``ckptzip.load`` (ranged requests in parallel while decoding);
* ``torch.save + s3fs``: ``torch.save`` to a local file, then ``s3fs`` ``put_file``; loading,
  ``get_file`` then ``torch.load``: what users do without ckptzip;
* ``DCP FsspecWriter``: torch's own fsspec storage for ``torch.distributed.checkpoint``;
* ``ckptzip.dcp``: :class:`ckptzip.dcp.CompressedWriter` / ``CompressedReader`` on the URL.

For each: wall seconds of save and load (the range over ``--repeat`` runs, methods taking turns)
and MB/s of state, after one unmeasured save and load of a small state by each method (clients,
sessions and thread pools made); bytes uploaded and downloaded, counted at s3fs's S3 calls (PUT and UploadPart
bodies sent, GET response bodies read), so every method is counted the same way; peak extra resident memory
(RSS sampled every millisecond, from a heap trimmed with ``malloc_trim``) of a save and of a
load, as a fraction of the state (a load's beyond
the loaded state, or beyond the preallocated target for DCP). Then ``ckptzip.open(url)
.get_tensor`` of one tensor: the bytes it fetched. Building the state, the reference checksums,
the checks of every load (bit for bit, by CRC-32C per tensor) and the clean-up between runs are
outside every clock.

    python benchmarks/object_store.py                         # the scoreboard, 151 MB, 3 runs
    python benchmarks/object_store.py --blocks 40 --repeat 1 \\
        --methods ckptzip,torch.save+s3fs                      # the 6 GB scale run
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import fsspec.asyn
import s3fs
import torch
import torch.distributed.checkpoint as dcp
from async_save import PeakRSS
from common import OUT_DIR, REPO, csv, info_markdown, machine_info, write_results
from dcp import tensors
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

import ckptzip
from ckptzip import _native
from ckptzip.dcp import CompressedReader, CompressedWriter
from ckptzip.tree import tensor_bytes

sys.path.insert(0, str(REPO))
from tests.s3server import SeaweedS3, weed_binary

METHODS = ("ckptzip", "torch.save+s3fs", "DCP FsspecWriter", "ckptzip.dcp")


class CountedBody:
    """A GET's streaming body that counts the bytes its reader takes (s3fs may open a GET of
    the whole object and close it unread: its ContentLength is not what crossed)."""

    def __init__(self, body: Any, traffic: Traffic) -> None:
        self._body, self._traffic = body, traffic

    async def read(self, *args: Any) -> bytes:
        data = await self._body.read(*args)
        self._traffic.down += len(data)
        return bytes(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


class Traffic:
    """Bytes through s3fs's S3 calls: request bodies of PUT and UploadPart sent, response bodies
    of GET read."""

    def __init__(self) -> None:
        self.up = self.down = self.requests = 0
        original = s3fs.S3FileSystem._call_s3
        traffic = self

        async def counted(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            reply = await original(fs, method, *args, **kwargs)
            traffic.requests += 1
            if method in ("put_object", "upload_part"):
                body = kwargs.get("Body", b"")
                traffic.up += body.getbuffer().nbytes if isinstance(body, io.BytesIO) else len(body)
            elif method == "get_object":
                reply["Body"] = CountedBody(reply["Body"], traffic)
            return reply

        s3fs.S3FileSystem._call_s3 = counted
        # the sync call_s3 wraps the coroutine function it was made from: wrap the new one
        s3fs.S3FileSystem.call_s3 = fsspec.asyn.sync_wrapper(counted)

    def reset(self) -> None:
        self.up = self.down = self.requests = 0


def training_state(blocks: int, width: int) -> dict[str, Any]:
    """fp32 weights near a trained model's scale, AdamW moments in optimizer.state_dict() form."""
    shapes = {"attn.q": (width, width), "attn.k": (width, width), "attn.v": (width, width),
              "attn.o": (width, width), "mlp.up": (4 * width, width), "mlp.down": (width, 4 * width),
              "norm.weight": (width,)}
    generator = torch.Generator().manual_seed(0)
    model: dict[str, torch.Tensor] = {}
    moments: dict[int, dict[str, Any]] = {}
    for block in range(blocks):
        for name, shape in shapes.items():
            key = f"blocks.{block}.{name}"
            weight = torch.randn(shape, generator=generator) * 0.02
            exp_avg = torch.randn(shape, generator=generator) * 1e-4
            exp_avg_sq = torch.randn(shape, generator=generator).square_() * 1e-8 + 1e-12
            model[key] = weight
            moments[len(moments)] = {"step": torch.tensor(1000.0), "exp_avg": exp_avg,
                                     "exp_avg_sq": exp_avg_sq}
    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
               "params": list(range(len(moments)))}]
    return {"model": model, "optimizer": {"state": moments, "param_groups": groups},
            "scheduler": {"last_epoch": 1000, "base_lrs": [3e-4]}, "step": 1000}


def fingerprint(state: Any) -> dict[str, tuple[torch.dtype, tuple[int, ...], int]]:
    """Every tensor's dtype, shape and CRC-32C: the reference a load is checked against."""
    return {name: (t.dtype, tuple(t.shape), _native.crc32c(tensor_bytes(t.contiguous())))
            for name, t in tensors(state).items()}


@dataclass
class Row:
    method: str
    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    uploaded: int = 0
    downloaded: int = 0
    stored: int = 0
    save_extra: list[int] = field(default_factory=list)
    load_extra: list[int] = field(default_factory=list)


@dataclass
class Method:
    name: str
    #: Where it saves, under the run's prefix: an object or a directory of them.
    suffix: str
    #: Saves to the URL; what it returns is not used.
    save: Callable[[str], object]
    #: Loads from the URL (into the target, for DCP) and returns the loaded state.
    load: Callable[[str, Any], Any]
    #: DCP loads into a state its caller allocated: made before the clock, not counted as extra.
    into_target: bool = False


def methods(state: dict[str, Any], options: dict[str, Any], threads: int, work: Path,
            fs: Any) -> dict[str, Method]:
    local = work / "state.pt"

    def torch_save(url: str) -> None:
        torch.save(state, local)
        fs.put_file(str(local), url)
        local.unlink()

    def torch_load(url: str, target: Any) -> Any:
        fs.get_file(url, str(local))
        loaded = torch.load(local, weights_only=True)
        local.unlink()
        return loaded

    def fsspec_load(url: str, target: Any) -> Any:
        dcp.load(target, storage_reader=FsspecReader(url, **options))
        return target

    def ckptzip_dcp_load(url: str, target: Any) -> Any:
        dcp.load(target, storage_reader=CompressedReader(url, threads=threads, storage_options=options))
        return target

    return {method.name: method for method in (
        Method("ckptzip", "state.ckz",
               lambda url: ckptzip.save(state, url, threads=threads, storage_options=options),
               lambda url, target: ckptzip.load(url, threads=threads, storage_options=options)),
        Method("torch.save+s3fs", "state.pt", torch_save, torch_load),
        Method("DCP FsspecWriter", "dcp",
               lambda url: dcp.save(state, storage_writer=FsspecWriter(url, thread_count=threads, **options)),
               fsspec_load, into_target=True),
        Method("ckptzip.dcp", "ckzdcp",
               lambda url: dcp.save(state, storage_writer=CompressedWriter(
                   url, threads=threads, storage_options=options)),
               ckptzip_dcp_load, into_target=True),
    )}


def skeleton(state: Any) -> Any:
    """The state's structure with its tensors on the meta device (no memory)."""
    if isinstance(state, torch.Tensor):
        return torch.empty_like(state, device="meta")
    if isinstance(state, dict):
        return {k: skeleton(v) for k, v in state.items()}
    if isinstance(state, list):
        return [skeleton(v) for v in state]
    return state


def allocate(shape: Any) -> Any:
    """A DCP load target of the skeleton's layout, zeroed (``empty_like`` of the state)."""
    if isinstance(shape, torch.Tensor):
        return torch.zeros(shape.shape, dtype=shape.dtype)
    if isinstance(shape, dict):
        return {k: allocate(v) for k, v in shape.items()}
    if isinstance(shape, list):
        return [allocate(v) for v in shape]
    return shape


def trim_heap() -> None:
    """Collect garbage and hand glibc's free heap back to the system: freed tensors stay
    resident in malloc's arenas otherwise, and the next load that reuses them (torch.load's
    storages do, ckptzip's mapped buffers do not) would look as if it took no memory at all."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def timed(action: Callable[[], Any]) -> tuple[float, int, Any]:
    """Seconds, peak extra RSS and result of ``action`` (the heap trimmed before the clock)."""
    trim_heap()
    peak = PeakRSS()
    started = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - started
    return seconds, peak.stop(), result


def warm_up(args: argparse.Namespace, options: dict[str, Any], work: Path, fs: Any, bucket: str) -> None:
    """Each method saves and loads a small state once, unmeasured: the first calls of a process
    create clients, sessions and thread pools, which no later save pays again."""
    small = training_state(1, 128)
    for method in methods(small, options, args.threads, work, fs).values():
        if method.name in args.methods:
            url = f"s3://{bucket}/warm-up/{method.suffix}"
            method.save(url)
            method.load(url, allocate(skeleton(small)) if method.into_target else None)
    fs.rm(f"{bucket}/warm-up", recursive=True)


def stored_bytes(fs: Any, url: str) -> int:
    path = url.replace("s3://", "", 1)
    fs.invalidate_cache()
    if fs.isdir(path):
        return sum(int(info["size"]) for info in fs.find(path, detail=True).values())
    return int(fs.size(path))


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ckptzip-objstore-", dir=args.work))
    server = SeaweedS3(work / "seaweedfs").start()
    try:
        traffic = Traffic()
        options = server.storage_options()
        fs = server.filesystem()
        bucket = server.bucket("bench")
        print(f"building the state ({args.blocks} blocks of width {args.width}) ...", flush=True)
        state = training_state(args.blocks, args.width)
        state_bytes = sum(t.nbytes for t in tensors(state).values())
        reference = fingerprint(state)
        layout = skeleton(state)
        print(f"state: {state_bytes / 1e6:,.0f} MB in {len(reference)} tensors", flush=True)
        warm_up(args, options, work, fs, bucket)
        chosen = methods(state, options, args.threads, work, fs)
        rows = {name: Row(name) for name in args.methods}
        for attempt in range(args.repeat):
            for name in args.methods:
                method, row = chosen[name], rows[name]
                url = f"s3://{bucket}/{attempt}/{method.suffix}"
                traffic.reset()
                seconds, extra, _ = timed(partial(method.save, url))
                row.save_s.append(seconds)
                row.save_extra.append(extra)
                row.uploaded, row.stored = traffic.up, stored_bytes(fs, url)
                print(f"{name}: saved in {seconds:.2f} s, extra {extra / 1e6:,.0f} MB", flush=True)
        del state, chosen  # the loads run without the original: checked against the fingerprints
        chosen = methods({}, options, args.threads, work, fs)
        gc.collect()
        for attempt in range(args.repeat):
            for name in args.methods:
                method, row = chosen[name], rows[name]
                url = f"s3://{bucket}/{attempt}/{method.suffix}"
                target = allocate(layout) if method.into_target else None
                traffic.reset()
                seconds, extra, loaded = timed(partial(method.load, url, target))
                row.load_s.append(seconds)
                # beyond the loaded state (a DCP target was allocated before the clock)
                row.load_extra.append(extra - (0 if method.into_target else state_bytes))
                row.downloaded = traffic.down
                if fingerprint(loaded) != reference:
                    raise AssertionError(f"{name}: the loaded state differs from the saved one")
                del loaded, target
                gc.collect()
                print(f"{name}: loaded in {seconds:.2f} s, extra {row.load_extra[-1] / 1e6:,.0f} MB",
                      flush=True)
        get_tensor: dict[str, Any] = {}
        if "ckptzip" in args.methods:
            name = "blocks.0.attn.q"
            traffic.reset()
            with ckptzip.open(f"s3://{bucket}/0/state.ckz", storage_options=options) as ckpt:
                value = ckpt.get_tensor(f"model.{name}")
                get_tensor = {"tensor": f"model.{name}", "tensor_bytes": value.nbytes,
                              "fetched": ckpt.source.bytes_fetched,  # type: ignore[attr-defined]
                              "requests": ckpt.source.requests,  # type: ignore[attr-defined]
                              "s3_downloaded": traffic.down, "file_bytes": ckpt.source.size}
            if _native.crc32c(tensor_bytes(value)) != reference[f".model.{name}"][2]:
                raise AssertionError("get_tensor differs from the saved tensor")
        return {"state_bytes": state_bytes, "tensors": len(reference), "threads": args.threads,
                "repeat": args.repeat, "rows": [asdict(r) for r in rows.values()],
                "get_tensor": get_tensor, "versions": versions()}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def versions() -> dict[str, str]:
    import aiobotocore
    import botocore

    weed = weed_binary()
    version = subprocess.run([weed, "version"], capture_output=True, text=True).stdout.split("\n")[0] \
        if weed else "missing"
    return {"s3fs": s3fs.__version__, "fsspec": fsspec.__version__, "botocore": botocore.__version__,
            "aiobotocore": aiobotocore.__version__, "seaweedfs": version.strip()}


def spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if len(values) == 1 or high - low < 0.005 else f"{low:.2f}-{high:.2f}"


def markdown(result: dict[str, Any], info: dict[str, Any]) -> str:
    mb = result["state_bytes"] / 1e6
    lines = [
        f"State: {mb:,.0f} MB of fp32 tensors ({result['tensors']}), weights and AdamW moments; "
        f"{result['threads']} threads; {result['repeat']} run(s) each, ranges min-max.",
        "",
        "| method | save s | save MB/s | load s | load MB/s | stored MB | uploaded MB | "
        "downloaded MB | peak extra, save | peak extra, load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        save_rate = [mb / s for s in row["save_s"]]
        load_rate = [mb / s for s in row["load_s"]]
        lines.append(
            f"| {row['method']} | {spread(row['save_s'])} | {spread(sorted(save_rate))} | "
            f"{spread(row['load_s'])} | {spread(sorted(load_rate))} | {row['stored'] / 1e6:,.1f} | "
            f"{row['uploaded'] / 1e6:,.1f} | {row['downloaded'] / 1e6:,.1f} | "
            f"{max(row['save_extra']) / result['state_bytes']:.1%} | "
            f"{max(row['load_extra']) / result['state_bytes']:.1%} |")
    got = result["get_tensor"]
    if got:
        lines += ["", f"`ckptzip.open(url).get_tensor({got['tensor']!r})` "
                      f"({got['tensor_bytes'] / 1e6:.1f} MB tensor): fetched {got['fetched']:,} bytes "
                      f"in {got['requests']} requests (s3fs counted {got['s3_downloaded']:,}) of a "
                      f"{got['file_bytes'] / 1e6:,.1f} MB object."]
    v = result["versions"]
    lines += ["", info_markdown(info),
              f"- Object store: {v['seaweedfs']} on 127.0.0.1 (same machine); s3fs {v['s3fs']}, fsspec "
              f"{v['fsspec']}, botocore {v['botocore']}, aiobotocore {v['aiobotocore']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1, help="transformer blocks (1: 151 MB at width 1024)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--methods", type=csv(list(METHODS)), default=list(METHODS))
    parser.add_argument("--work", default=None, help="where the server's data and local files go")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    result = run(args)
    info = machine_info()
    text = markdown(result, info)
    print(text)
    write_results(f"object_store-{result['state_bytes'] // 10**6}MB", text, {**result, "machine": info},
                  args.out)


if __name__ == "__main__":
    main()
