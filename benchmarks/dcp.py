"""ckptzip as PyTorch DCP's storage layer, against DCP's own writers, on one training state.

The state is the demo GPT's full training state (weights, AdamW moments, scheduler, RNG) after 270
steps of a 300-step run, and the delta row codes step 300 against it. Each method saves it with
``dcp.save`` into a fresh directory and loads it back with ``dcp.load`` into preallocated tensors,
in this one process (a world of one):

* ``FileSystemWriter``: DCP's default, one ``torch.save`` stream per item, no compression;
* ``FileSystemWriter + zstd``: the same with DCP's built-in ``ZStandard`` stream extension
  (experimental, ``_extensions=[ZStandard()]``; read back by ``FileSystemReader``'s default
  extension registry);
* ``ckptzip.dcp``: :class:`~ckptzip.dcp.CompressedWriter` / :class:`~ckptzip.dcp.CompressedReader`;
* ``ckptzip.dcp delta``: the step-300 state with ``base=`` the step-270 checkpoint.

All get the same cores (DCP's writers ``thread_count``, ckptzip ``threads``). Times are wall
seconds, best of ``--repeat``, files fsynced as each writer does by default, reads from the page
cache. Every load is checked bit for bit. The tied embedding is cloned so that every method stores
the same bytes (ckptzip alone would otherwise store it once).

    python benchmarks/dcp.py            # the 10.8M-parameter GPT (trained once, then cached)
    python benchmarks/dcp.py --quick    # the tiny GPT: a smoke test
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from common import OUT_DIR, info_markdown, machine_info, write_results
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptzip.dcp import CompressedReader, CompressedWriter, RankFile
from ckptzip.demo.datasets import gpt_training_run
from ckptzip.demo.train import CONFIGS
from ckptzip.parallel import cpu_count


@dataclass
class Row:
    method: str
    state: str
    raw_mb: float
    stored_mb: float
    metadata_kb: float
    ratio: float
    save_s: float
    load_s: float


def dcp_state(state: dict[str, Any]) -> dict[str, Any]:
    """The training state as DCP saves it, every tensor with its own storage."""
    return {
        "model": {k: v.clone() for k, v in state["model"].items()},
        "optimizer": state["optimizer"],
        "scheduler": state["scheduler"],
        "step": state["step"],
        "rng": state["rng"],
    }


def tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        return {k: v for key, value in state.items() for k, v in tensors(value, f"{prefix}.{key}").items()}
    if isinstance(state, (list, tuple)):
        return {k: v for i, value in enumerate(state) for k, v in tensors(value, f"{prefix}.{i}").items()}
    return {}


def empty_like(state: Any) -> Any:
    """A target for ``dcp.load``: zeroed tensors of the same layout, the rest as in ``state``."""
    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: empty_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [empty_like(v) for v in state]
    return state


def directory_bytes(path: Path) -> tuple[int, int]:
    """Bytes of all files in a checkpoint directory, and of its .metadata."""
    sizes = {p.name: p.stat().st_size for p in path.iterdir()}
    return sum(sizes.values()), sizes[".metadata"]


Writer = Callable[[Path], Any]
Reader = Callable[[Path], Any]


@dataclass
class Method:
    name: str
    label: str
    state: dict[str, Any]
    writer: Writer
    reader: Reader


def save_and_load(method: Method, target: Path) -> tuple[float, float]:
    """Save, load into a fresh target, check bit for bit; the two wall times."""
    started = time.perf_counter()
    dcp.save(method.state, storage_writer=method.writer(target))
    save_s = time.perf_counter() - started
    loaded = empty_like(method.state)
    started = time.perf_counter()
    dcp.load(loaded, storage_reader=method.reader(target))
    load_s = time.perf_counter() - started
    expected = tensors(method.state)
    for key, value in tensors(loaded).items():
        assert value.dtype == expected[key].dtype and torch.equal(value, expected[key]), (method.name, key)
    return save_s, load_s


def measure(methods: list[Method], work: Path, repeat: int) -> list[Row]:
    """Each method ``repeat`` times, taking turns so that a change of machine load hits them all;
    the best time of each."""
    best = {m.name: (float("inf"), float("inf")) for m in methods}
    for attempt in range(repeat):
        for method in methods:
            target = work / f"{method.name.replace(' ', '_')}-{attempt}"
            save_s, load_s = save_and_load(method, target)
            best[method.name] = (min(best[method.name][0], save_s), min(best[method.name][1], load_s))
            if attempt < repeat - 1:
                shutil.rmtree(target)
    rows = []
    for method in methods:
        raw = sum(t.nbytes for t in tensors(method.state).values())
        stored, metadata = directory_bytes(work / f"{method.name.replace(' ', '_')}-{repeat - 1}")
        rows.append(Row(method.name, method.label, raw / 1e6, stored / 1e6, metadata / 1e3, raw / stored,
                        *best[method.name]))
        print(rows[-1], flush=True)
    return rows


#: The parameters of one transformer block of a Llama-7B-like model (width 4096, MLP 11008).
BLOCK = {"attn.q": (4096, 4096), "attn.k": (4096, 4096), "attn.v": (4096, 4096),
         "attn.o": (4096, 4096), "mlp.gate": (11008, 4096), "mlp.up": (11008, 4096),
         "mlp.down": (4096, 11008), "norm1": (4096,), "norm2": (4096,)}


@dataclass
class MetadataRow:
    ranks: int
    items: int
    writer: str
    mb: float
    bytes_per_item: float
    unpickle_s: float


def synthetic_metadata(ranks: int, layers: int, ckptzip: bool) -> Metadata:
    """The ``.metadata`` DCP would write for a Llama-like model and its Adam moments, every
    tensor sharded on dim 0 over ``ranks`` ranks (FSDP2), with each writer's storage records."""
    shapes = {f"layers.{i}.{name}.weight": shape for i in range(layers) for name, shape in BLOCK.items()}
    shapes.update({"embed.weight": (32000, 4096), "norm.weight": (4096,), "lm_head.weight": (32000, 4096)})
    tensors = {f"model.{k}": v for k, v in shapes.items()}
    for suffix in ("exp_avg", "exp_avg_sq"):
        tensors.update({f"optim.state.{k}.{suffix}": v for k, v in shapes.items()})
    per_rank: list[Any] = [
        RankFile(f"__{r}_0.ckz", f"{r:032x}") if ckptzip else f"__{r}_0.distcp" for r in range(ranks)
    ]
    state: dict[str, Any] = {}
    storage: dict[MetadataIndex, Any] = {}
    for fqn, shape in tensors.items():
        rows = -(-shape[0] // ranks)
        chunks = []
        for r in range(ranks):
            offsets = torch.Size([r * rows, *([0] * (len(shape) - 1))])
            sizes = torch.Size([max(0, min(rows, shape[0] - r * rows)), *shape[1:]])
            chunks.append(ChunkStorageMetadata(offsets, sizes))
            length = sizes.numel() * 4
            storage[MetadataIndex(fqn, offsets)] = (
                per_rank[r] if ckptzip else _StorageInfo(per_rank[r], length * r, length)
            )
        state[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(shape), chunks)
    return Metadata(state_dict_metadata=state, storage_data=storage)


def measure_metadata(ranks: int, layers: int) -> list[MetadataRow]:
    rows = []
    for ckptzip in (False, True):
        blob = pickle.dumps(synthetic_metadata(ranks, layers, ckptzip))
        started = time.perf_counter()
        metadata = pickle.loads(blob)
        unpickle_s = time.perf_counter() - started
        items = len(metadata.storage_data)
        writer = "ckptzip.dcp" if ckptzip else "FileSystemWriter"
        rows.append(MetadataRow(ranks, items, writer, len(blob) / 1e6, len(blob) / items, unpickle_s))
        print(rows[-1], flush=True)
    return rows


def markdown(rows: list[Row], info: dict[str, Any], threads: int, repeat: int) -> str:
    lines = [
        "# DCP benchmark: ckptzip.dcp against DCP's FileSystemWriter and its zstd extension",
        "",
        info_markdown(info),
        "",
        f"One process (a world of one), {threads} threads for every method, best of {repeat}. "
        "Ratio = tensor bytes / bytes of every file in the checkpoint directory (rank files and "
        ".metadata). MB/s = 10^6 tensor bytes per second of `dcp.save` / `dcp.load`, planning and "
        "fsync included; loads read from the page cache. Every load is checked bit for bit.",
        "",
        "| method | state | raw MB | stored MB | .metadata KB | ratio | save s | load s "
        "| save MB/s | load MB/s |",
        "| :-- | :-- | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.state} | {r.raw_mb:.1f} | {r.stored_mb:.1f} | {r.metadata_kb:.1f} | "
            f"{r.ratio:.3f} | {r.save_s:.3f} | {r.load_s:.3f} | {r.raw_mb / r.save_s:.0f} | "
            f"{r.raw_mb / r.load_s:.0f} |"
        )
    return "\n".join(lines) + "\n"


def metadata_markdown(rows: list[MetadataRow], layers: int) -> str:
    lines = [
        "",
        f"**`.metadata` size** of a Llama-like model ({layers} blocks of width 4096) with its Adam "
        "moments, every tensor sharded on dim 0 over all ranks (FSDP2): DCP's own records plus each "
        "writer's storage records, pickled as DCP does; built in memory, not saved.",
        "",
        "| ranks | items | writer | .metadata MB | bytes per item | unpickle s |",
        "| --: | --: | :-- | --: | --: | --: |",
    ]
    for r in rows:
        lines.append(f"| {r.ranks} | {r.items} | {r.writer} | {r.mb:.2f} | {r.bytes_per_item:.0f} | "
                     f"{r.unpickle_s:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny GPT, short run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the best counts")
    parser.add_argument("--threads", type=int, default=cpu_count(), help="threads for every method")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where dcp.md/dcp.json go")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    info = machine_info()
    if args.quick:
        run = gpt_training_run(20, 10, config=CONFIGS["tiny"], progress=False)
    else:
        run = gpt_training_run(300, 30, progress=False)
    (base_step, base_state), (step, new_state) = run[-2], run[-1]
    del run
    base, new = dcp_state(base_state), dcp_state(new_state)
    threads = args.threads
    with tempfile.TemporaryDirectory(prefix="ckptzip-dcp-bench-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        label = f"step {base_step}"
        base_dir = work / "base"
        dcp.save(base, storage_writer=CompressedWriter(base_dir, threads=threads))
        methods = [
            Method("FileSystemWriter", label, base, lambda p: dcp.FileSystemWriter(p, thread_count=threads),
                   dcp.FileSystemReader),
            Method("FileSystemWriter + zstd", label, base,
                   lambda p: dcp.FileSystemWriter(p, thread_count=threads, _extensions=[ZStandard()]),
                   dcp.FileSystemReader),
            Method("ckptzip.dcp", label, base, lambda p: CompressedWriter(p, threads=threads),
                   lambda p: CompressedReader(p, threads=threads)),
            Method("ckptzip.dcp delta", f"step {step} vs {base_step}", new,
                   lambda p: CompressedWriter(p, threads=threads, base=base_dir),
                   lambda p: CompressedReader(p, threads=threads)),
        ]
        rows = measure(methods, work, args.repeat)
    layers = 2 if args.quick else 32
    meta_rows = [row for ranks in ((2, 8) if args.quick else (8, 64, 256))
                 for row in measure_metadata(ranks, layers)]
    data = {"info": info, "threads": threads, "repeat": args.repeat, "rows": [asdict(r) for r in rows],
            "metadata": [asdict(r) for r in meta_rows]}
    text = markdown(rows, info, threads, args.repeat) + metadata_markdown(meta_rows, layers)
    write_results("dcp-quick" if args.quick else "dcp", text, data, args.out)


if __name__ == "__main__":
    main()
