"""atheris harness: every registered codec's decode, reached the way the reader reaches it.

Input: ``u16 LE spec length | JSON spec | payload``. The spec's ``pipeline`` (a list of codec
configs) goes through ``Pipeline.from_config`` (so ``codec_from_config`` of every codec id), then:

* a pipeline with chunk stages (residual, byteplanes or ctxplanes, entropy) decodes one chunk of
  ``raw`` bytes with ``Pipeline.decode_chunk``; for a residual the payload starts with the base's
  ``raw`` bytes, the stored stream follows;
* a pipeline of whole-tensor transforms (kmeans, sparse, lossy-residual, support, lowrank,
  zeros, dither, mark) undoes them
  with the reader's own ``CheckpointFile._finish_leaf``, on the payload viewed as the spec's
  ``encoded`` array; for a ``support`` stage the next ``prod(shape)`` bytes are the sibling's
  support (non-zero: kept); for a ``lowrank`` stage the next bytes are its two factors, float32
  matrices of the spec's ``u_shape`` and ``v_shape`` (what the reader passes: decoded sibling
  leaves the parser checked are matrices); for a ``zeros`` stage the next ``ceil(prod(shape) /
  8)`` bytes are its change mask (the parser checked that size); the leaf's base tensor is taken
  from the rest of the payload when it holds one.

The harness admits only what the container's parser guarantees (chunks of whole serializer
elements, a base chunk as long as the chunk, an encoded array of the declared size, a tensor at
most MAX_TRANSFORM_EXPANSION times larger
unless a base of its size is given), so any outcome but a value or a ckptzip.Error is a
finding.

    .venv/bin/python fuzz/atheris_codecs.py -runs=1000000 -rss_limit_mb=2048 -timeout=10 \
        fuzz/build/corpus-atheris-codecs fuzz/corpus/codecs
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atheris_boot import fuzz, instrumented

with instrumented():
    import numpy as np
    import torch

    import ckptzip
    from ckptzip.codecs import ExactZeros, LowRank, SqrtScale
    from ckptzip.container import MAX_TRANSFORM_EXPANSION, LeafInfo, _array_type
    from ckptzip.pipeline import Pipeline
    from ckptzip.reader import CheckpointFile

#: Largest chunk the harness decodes: memory per run, not safety.
MAX_RAW = 1 << 20


class _Reader:
    """The one attribute of a CheckpointFile that _finish_leaf uses."""

    name = "<fuzz>"


def _chunk(pipeline: Pipeline, spec: dict[str, Any], payload: bytes) -> bool:
    """Decode one chunk; False where the input breaks what the container guarantees."""
    raw = spec.get("raw")
    if type(raw) is not int or not 0 <= raw <= MAX_RAW:
        return False
    raw -= raw % getattr(pipeline.serializer, "width", 1)  # the container's whole-element rule
    base = None
    if pipeline.residual is not None:
        if len(payload) < raw:
            return False
        base, payload = np.frombuffer(payload, np.uint8, raw), payload[raw:]
    out = np.zeros(raw, np.uint8)
    pipeline.decode_chunk(payload, out, base)
    return True


def _transforms(pipeline: Pipeline, spec: dict[str, Any], payload: bytes) -> bool:
    """Undo the transforms; False where the input breaks what the container guarantees."""
    if not isinstance(spec.get("encoded"), dict):
        return False
    dtype, shape, nbytes = _array_type(spec, "<fuzz>")
    array_dtype, array_shape, array_nbytes = _array_type(spec["encoded"], "<fuzz>")
    if len(payload) < array_nbytes:
        return False
    tail = payload[array_nbytes:]
    support, sibling_nbytes = None, 0
    if pipeline.support is not None:  # the sibling's support: one byte per element
        sibling_nbytes = math.prod(shape)
        if len(tail) < sibling_nbytes:
            return False
        mask = np.frombuffer(tail, np.uint8, sibling_nbytes) != 0
        support, tail = torch.from_numpy(mask.copy()).reshape(shape), tail[sibling_nbytes:]
    siblings: dict[int, torch.Tensor] = {}
    for stage in pipeline.transforms:
        if isinstance(stage, ExactZeros):  # its change mask: a bit per element
            count = -(-math.prod(shape) // 8)
            if len(tail) < count:
                return False
            siblings[stage.leaf] = torch.from_numpy(np.frombuffer(tail, np.uint8, count).copy())
            tail = tail[count:]
            continue
        if isinstance(stage, SqrtScale):  # a step's scale: float32 of the tensor's shape
            count = math.prod(shape)
            if len(tail) < 4 * count:
                return False
            scale = np.frombuffer(tail, np.float32, count).copy().reshape(shape)
            siblings[stage.leaf], tail = torch.from_numpy(scale), tail[4 * count:]
            continue
        if not isinstance(stage, LowRank):
            continue
        for j, key in ((stage.u, "u_shape"), (stage.v, "v_shape")):
            dims = spec.get(key)
            if (not isinstance(dims, list) or len(dims) != 2
                    or not all(type(d) is int and 0 <= d <= MAX_RAW for d in dims)
                    or 4 * math.prod(dims) > MAX_RAW or len(tail) < 4 * math.prod(dims)):
                return False
            factor = np.frombuffer(tail, np.float32, math.prod(dims)).copy().reshape(dims)
            siblings[j], tail = torch.from_numpy(factor), tail[4 * math.prod(dims):]
    # the base tensor's bytes, when the rest holds them
    base = np.frombuffer(tail, np.uint8, nbytes).copy() if len(tail) >= nbytes else None
    if base is None and nbytes > MAX_TRANSFORM_EXPANSION * (array_nbytes + sibling_nbytes + 1):
        return False  # the container's bound for leaves without a base
    leaf = LeafInfo(0, "t", dtype, shape, nbytes, 1, pipeline, (), {}, array_dtype, array_shape,
                    array_nbytes)
    buffer = torch.empty(array_nbytes, dtype=torch.uint8)
    buffer.numpy()[:] = np.frombuffer(payload, np.uint8, array_nbytes)
    CheckpointFile._finish_leaf(_Reader(), leaf, buffer, base, support,  # type: ignore[arg-type]
                                siblings)
    return True


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    size = int.from_bytes(data[:2], "little")
    try:
        spec = json.loads(data[2 : 2 + size])
    except (ValueError, RecursionError):
        return
    if not isinstance(spec, dict):
        return
    payload = data[2 + size :]
    try:
        pipeline = Pipeline.from_config(spec.get("pipeline"), "<fuzz>")
        if pipeline.residual or pipeline.serializer or pipeline.compressors:
            _chunk(pipeline, spec, payload)
        elif pipeline.transforms:
            _transforms(pipeline, spec, payload)
    except ckptzip.Error:
        pass


if __name__ == "__main__":
    fuzz(test_one_input)
