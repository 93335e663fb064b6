"""Regenerates the atheris harnesses' seed corpora from real files of today's writer:

* fuzz/corpus/container: small ``.ckz`` files: lossless (deflated header, plain header, small
  chunks, every leaf kind), a lossless delta and the lossy modes (excp, bitsnap, adaptive), each
  coded against fuzz_states.base_state() (the base the harnesses pass);
* fuzz/corpus/codecs: one input of atheris_codecs.py per chunk and per whole-tensor transform of
  those files, plus context-plane chunks (``u16 LE spec length | JSON spec | payload``).

Run from the repository root after building the extension:

    PYTHONPATH=src python fuzz/make_atheris_corpus.py
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzz_states  # noqa: E402
from make_corpus import write_seeds  # noqa: E402

import ckptzip  # noqa: E402
from ckptzip import _native  # noqa: E402
from ckptzip.chain import MemoryBase  # noqa: E402
from ckptzip.codecs import ExactZeros, LowRank, SqrtScale  # noqa: E402
from ckptzip.container import FLAG_DEFLATE, PRELUDE_SIZE, load_header, pack_prelude  # noqa: E402
from ckptzip.pipeline import Pipeline  # noqa: E402
from ckptzip.policy import MIN_CHUNK_BYTES  # noqa: E402
from ckptzip.reader import CheckpointFile  # noqa: E402
from ckptzip.storage import BytesSource  # noqa: E402


def plain_header(blob: bytes, flags: int = 0) -> bytes:
    """The same file with its header stored as plain JSON, under ``flags``: with FLAG_DEFLATE the
    harnesses deflate it before loading (atheris_common.fix_checksums), so mutations edit JSON."""
    stored_flags, length = struct.unpack_from("<IQ", blob, 12)
    raw = load_header(blob[PRELUDE_SIZE : PRELUDE_SIZE + length], stored_flags, "<seed>")
    return pack_prelude(raw, flags) + raw + blob[PRELUDE_SIZE + length :]


def container_files() -> list[bytes]:
    base, new, mixed = fuzz_states.base_state(), fuzz_states.next_state(), fuzz_states.mixed_state()
    meta = {"run": "seed", "step": 2, "tags": ["a", None, 1.5]}
    lossless = ckptzip.dumps(mixed, threads=1, metadata=meta)
    seeds = [
        lossless,
        plain_header(lossless),
        # several chunks a tensor, at the smallest chunks a writer makes
        ckptzip.dumps({**mixed, "long": torch.linspace(-1, 1, 3000).bfloat16()}, threads=1,
                      chunk_bytes=MIN_CHUNK_BYTES),
        ckptzip.dumps(base, threads=1),
        ckptzip.dumps(new, base=base, threads=1),
    ]
    seeds += [ckptzip.dumps(new, base=base, mode=m, threads=1) for m in ("excp", "bitsnap", "adaptive")]
    # the second moments stored at the first's support (support stages), and as their ratio to
    # the base's (base-ratio stages), the first moments as themselves and as Adam's step
    # (sqrt-scale stages)
    seeds.append(ckptzip.dumps(new, base=base, mode="adaptive", threads=1, joint_restart=True))
    seeds.append(ckptzip.dumps(new, base=base, mode="adaptive", threads=1, joint_restart=False,
                               ratio_coding=True, step_coding=False))
    seeds.append(ckptzip.dumps(new, base=base, mode="adaptive", threads=1, joint_restart=False,
                               ratio_coding=True, step_coding=True))
    return seeds


def with_context_planes(blob: bytes) -> bytes:
    """A lossless delta with its 2-, 4- and 8-byte residual leaves recoded as context planes
    (ctxplanes), which the writer picks for large tensors only; plain JSON header, deflate flag."""
    flags, length = struct.unpack_from("<IQ", blob, 12)
    header = json.loads(load_header(blob[PRELUDE_SIZE : PRELUDE_SIZE + length], flags, "<seed>"))
    ckpt = CheckpointFile(BytesSource(blob), threads=1, base=MemoryBase(fuzz_states.base_state()))
    data = bytearray()
    for leaf, entry in zip(ckpt.leaves, header["leaves"]):
        residual = leaf.pipeline.residual
        start = ckpt.data_start + leaf.chunks[0].offset if leaf.chunks else 0
        if residual is None or residual.width == 1:
            entry["offset"] = len(data)
            data += blob[start : start + leaf.stored_bytes]
            continue
        stages = [residual.get_config(), {"id": "ctxplanes", "width": residual.width, "rotate": 1}]
        header["pipelines"].append(stages)
        entry.update(pipeline=len(header["pipelines"]) - 1, offset=len(data))
        raw = ckpt.read_leaves([leaf.index])[leaf.index].reshape(-1).view(torch.uint8).numpy()
        base = ckpt._base_raw(leaf)
        for k, chunk in enumerate(leaf.chunks):
            lo, hi = k * leaf.chunk_bytes, k * leaf.chunk_bytes + chunk.raw_length
            stored = Pipeline.from_config(stages).encode_chunk(raw[lo:hi].tobytes(), base[lo:hi].tobytes())
            entry["chunks"][k][:2] = [len(stored), _native.crc32c(stored)]
            data += stored
    ckpt.close()
    header["data_length"] = len(data)
    text = json.dumps(header).encode()
    return pack_prelude(text, FLAG_DEFLATE) + text + bytes(data)


def container_seeds(files: list[bytes]) -> list[bytes]:
    """The files with plain JSON headers under the deflate flag, the first two as written (one
    truly deflated, one plain)."""
    seeds = files[:2] + [plain_header(blob, FLAG_DEFLATE) for blob in files]
    return list(dict.fromkeys([*seeds, with_context_planes(files[4])]))


def codec_input(spec: dict[str, Any], payload: bytes) -> bytes:
    text = json.dumps(spec, separators=(",", ":")).encode()
    return struct.pack("<H", len(text)) + text + payload


def leaf_seeds(blob: bytes, base: MemoryBase) -> list[bytes]:
    """Per chunk: its pipeline's chunk stages, raw length, base chunk and stored bytes. Per leaf
    with transforms: the transforms, the leaf and encoded types, the encoded array, the sibling
    data its stages read (a support, low-rank factors) and the base."""
    seeds: list[bytes] = []
    ckpt = CheckpointFile(BytesSource(blob), threads=1, base=base)
    for leaf in ckpt.leaves:
        p = leaf.pipeline
        chunk_stages = Pipeline((), p.residual, p.serializer, p.compressors)
        base_raw = ckpt._base_raw(leaf) if "base" in leaf.extra else None
        array = bytearray(leaf.array_nbytes)
        for k, chunk in enumerate(leaf.chunks):
            start = ckpt.data_start + chunk.offset
            stored = blob[start : start + chunk.length]
            lo, hi = k * leaf.chunk_bytes, k * leaf.chunk_bytes + chunk.raw_length
            chunk_base = b"" if p.residual is None or base_raw is None else base_raw[lo:hi].tobytes()
            p.decode_chunk(stored, memoryview(array)[lo:hi], chunk_base or None)
            if k < 2:  # two chunks of a leaf are plenty
                spec = {"pipeline": chunk_stages.get_config(), "raw": chunk.raw_length}
                seeds.append(codec_input(spec, chunk_base + stored))
        if p.transforms:
            spec = {
                "pipeline": [t.get_config() for t in p.transforms],
                "dtype": leaf.dtype.name, "shape": list(leaf.shape),
                "encoded": {"dtype": leaf.array_dtype.name, "shape": list(leaf.array_shape)},
            }
            tail = b"" if base_raw is None else base_raw.tobytes()
            factors = b""
            for stage in p.transforms:  # low-rank factors: float32 matrices, U then V
                if isinstance(stage, ExactZeros):  # a change mask: its packed bits
                    factors += ckpt.read_leaves([stage.leaf])[stage.leaf].numpy().tobytes()
                if isinstance(stage, SqrtScale):  # a step's scale: float32, the tensor's shape
                    factors += ckpt.read_leaves([stage.leaf])[stage.leaf].float().numpy().tobytes()
                if isinstance(stage, LowRank):
                    decoded = ckpt.read_leaves([stage.u, stage.v])
                    spec["u_shape"] = list(decoded[stage.u].shape)
                    spec["v_shape"] = list(decoded[stage.v].shape)
                    factors += b"".join(decoded[j].numpy().tobytes() for j in (stage.u, stage.v))
            tail = factors + tail
            if p.support is not None:  # the sibling's support, a byte per element
                sibling = ckpt.read_leaves([p.support])[p.support]
                tail = (sibling != 0).to(torch.uint8).numpy().tobytes() + tail
            seeds.append(codec_input(spec, bytes(array) + tail))
    ckpt.close()
    return seeds


def codec_seeds(files: list[bytes]) -> list[bytes]:
    """:func:`leaf_seeds` of every file, of a low-rank update, and context-plane chunks."""
    seeds: list[bytes] = []
    for blob in files:
        seeds += leaf_seeds(blob, MemoryBase(fuzz_states.base_state()))
    # low-rank factors: the fuzz states' matrices are too small to factor, so a 96 x 64 weight
    # whose update is rank 3 plus a little noise is saved against its base
    generator = torch.Generator().manual_seed(5)
    old = torch.randn(96, 64, generator=generator)
    update = torch.randn(96, 3, generator=generator) @ torch.randn(3, 64, generator=generator)
    new = old + 1e-3 * (update + 0.01 * torch.randn(96, 64, generator=generator))
    blob = ckptzip.dumps({"w": new}, mode="adaptive", base={"w": old}, threads=1)
    seeds += leaf_seeds(blob, MemoryBase({"w": old}))
    # a change mask: the same update with its first rows untouched (an embedding's unused rows)
    new[:40] = old[:40]
    blob = ckptzip.dumps({"w": new}, mode="adaptive", base={"w": old}, threads=1)
    seeds += leaf_seeds(blob, MemoryBase({"w": old}))
    # a second moment non-zero over a base that is zero there (a token first seen since the
    # base): its ratio to the base with the zeros filled (the base-ratio-filled stage); half its
    # base's rows zero, so that its codes are stored with those first (base-partition)
    v_old = 1e-6 * torch.rand(128, 64, generator=generator)
    v_old[::2] = 0
    moments = {"step": torch.tensor(5.0), "exp_avg": 1e-3 * torch.randn(128, 64, generator=generator)}
    weight = torch.randn(128, 64, generator=generator)

    def adam_state(v: torch.Tensor, w: torch.Tensor) -> dict[str, Any]:
        return {"model": {"w": w}, "optimizer": {"state": {0: {**moments, "exp_avg_sq": v}},
                "param_groups": [{"params": [0], "lr": 1e-3, "betas": (0.9, 0.999)}]}}

    first_seen = v_old.clone()
    first_seen[::6] += 1e-6 * torch.rand(64, generator=generator)  # some unseen rows now seen
    old_state = adam_state(v_old, weight)
    blob = ckptzip.dumps(adam_state(first_seen, weight + 1e-3), mode="adaptive", base=old_state,
                         threads=1)
    seeds += leaf_seeds(blob, MemoryBase(old_state))
    # context planes: only large tensors choose them in a file, so code two chunks directly
    rng = np.random.default_rng(4)
    for dtype, width in ((torch.float32, 4), (torch.bfloat16, 2)):
        old = torch.from_numpy(rng.standard_normal(256).astype(np.float32)).to(dtype)
        new = old + (torch.from_numpy(rng.standard_normal(256).astype(np.float32)) * 1e-3).to(dtype)
        old_raw, new_raw = (t.view(torch.uint8).numpy().tobytes() for t in (old, new))
        config = [{"id": "residual", "kind": "float-diff", "width": width},
                  {"id": "ctxplanes", "width": width, "rotate": 1}]
        stream = Pipeline.from_config(config).encode_chunk(new_raw, old_raw)
        seeds.append(codec_input({"pipeline": config, "raw": len(new_raw)}, old_raw + stream))
    return list(dict.fromkeys(seeds))


def main() -> None:
    files = container_files()
    write_seeds(HERE / "corpus" / "container", container_seeds(files))
    # legacy-*: inputs of stages today's writers no longer use (the mark), kept as seeds
    write_seeds(HERE / "corpus" / "codecs", codec_seeds(files), keep_legacy=True)


if __name__ == "__main__":
    main()
