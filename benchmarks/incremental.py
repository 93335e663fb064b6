"""Incremental (delta) checkpoints on a real training run: ckptzip against zipnn's XOR delta.

A small GPT is trained on the Python standard library's source; its full state (weights and
AdamW moments) is kept at a base step and at 10, 50 and 200 steps later. For each interval the
newer state is coded against the base:

* ckptzip delta: ``ckptzip.dumps(new, base=base)`` / ``ckptzip.loads(blob, base=base)``, which picks
  per tensor the zigzagged difference of monotone-mapped patterns (coded in buckets of the base's
  exponent or not) or dense, and for integer tensors also XOR;
* zipnn delta: zipnn 0.5.4 on ``new ^ base`` per tensor (its delta method: the XOR, which is the
  buffer zipnn then codes in place, is inside its compression clock, and the XOR back inside its
  decompression clock);
* ckptzip dense: the same state without a base, for the speed comparison;
* zipnn dense: zipnn on ``new`` alone (its input copied before the clock: zipnn overwrites it),
  so that each tool's delta speed is also read against its own dense path.

Every decode is checked bit for bit, off the clocks. At N threads zipnn runs on its own threads
tensor after tensor or on a pool of N threads over the tensors, whichever is faster for it (per
direction; ``ckptzip.benchtool``). Loads are timed warm (repeated in this process) and in a fresh
process (one decode; ckptzip's base state is decoded there before the clock). Weights are measured
in fp32 and cast to bf16.

    python benchmarks/incremental.py           # trains 300 steps once (cached), then measures
    python benchmarks/incremental.py --out docs/scoreboard/raw   # the scoreboard run (make bench)
    python benchmarks/incremental.py --quick   # tiny model, short run: a smoke test
    python benchmarks/incremental.py --core    # only the chunk coders, dense against delta
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import OUT_DIR, info_markdown, machine_info, thread_counts, write_results

import ckptzip
from ckptzip import benchtool, peers
from ckptzip.codecs import BytePlanes, ContextPlanes, Entropy, Residual
from ckptzip.demo.datasets import default_cache_dir
from ckptzip.demo.train import CONFIGS, load_data, make_trainer
from ckptzip.pipeline import Pipeline
from ckptzip.policy import DEFAULT_CHUNK_BYTES

BASE_STEP, INTERVALS, TOTAL_STEPS = 100, (10, 50, 200), 300
QUICK_BASE_STEP, QUICK_INTERVALS, QUICK_TOTAL = 10, (2, 5, 10), 20


def training_states(quick: bool) -> dict[int, dict[str, Any]]:
    """Full states at the base step and at each interval after it (trained once, then cached)."""
    config = CONFIGS["tiny" if quick else "small"]
    base_step, intervals, total = (
        (QUICK_BASE_STEP, QUICK_INTERVALS, QUICK_TOTAL) if quick else (BASE_STEP, INTERVALS, TOTAL_STEPS)
    )
    wanted = [base_step, *(base_step + g for g in intervals)]
    cache = default_cache_dir() / f"incremental-{'tiny' if quick else 'small'}-{total}"
    paths = {step: cache / f"step-{step:05d}.pt" for step in wanted}
    if all(p.exists() for p in paths.values()):
        return {step: torch.load(p, weights_only=True) for step, p in paths.items()}
    cache.mkdir(parents=True, exist_ok=True)
    train, _ = load_data(config)
    trainer = make_trainer(config, total)
    states = {}
    for step in wanted:
        trainer.train(train, step - trainer.step)
        states[step] = ckptzip.loads(ckptzip.dumps(trainer.state()))  # a deep, exact copy
        torch.save(states[step], paths[step].with_suffix(".tmp"))
        os.replace(paths[step].with_suffix(".tmp"), paths[step])
        print(f"trained to step {step}", file=sys.stderr)
    return states


def weights(state: dict[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's tensors cast to ``dtype`` (tied weights stay one tensor)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for name, t in state["model"].items():
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen[ptr] = t.to(dtype) if t.is_floating_point() else t
        out[name] = seen[ptr]
    return out


def raw_size(state: Any) -> int:
    return sum(leaf.nbytes for leaf in ckptzip.tree.flatten(state)[1])


@dataclass
class Row:
    data: str
    interval: int
    threads: int
    tool: str
    raw_bytes: int
    stored_bytes: int
    compress_mbps: float
    decompress_mbps: float
    picks: str = ""
    #: one load in a fresh process (0 when not measured)
    fresh_decompress_mbps: float = 0.0
    #: how zipnn used its threads, compressing / decompressing (``own`` or ``pool``)
    how: str = ""

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes


Timed = Callable[[], tuple[float, Any]]


def clocked(fn: Callable[[], Any]) -> Timed:
    """A run whose clock covers all of ``fn``: (seconds, result)."""
    def run() -> tuple[float, Any]:
        started = time.perf_counter()
        result = fn()
        return time.perf_counter() - started, result
    return run


def interleaved_best(repeat: int, runs: dict[str, Timed]) -> dict[str, tuple[float, Any]]:
    """Best time (and last result) of each run, the runs taking turns round after round, so that a
    slow spell of a shared machine falls on all of them alike. Each run times itself, so that what
    it prepares (input copies) stays off its clock."""
    best: dict[str, tuple[float, Any]] = {name: (float("inf"), None) for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            seconds, result = run()
            best[name] = (min(best[name][0], seconds), result)
    return best


def assert_exact(expected: Any, actual: Any, what: str) -> None:
    for e, a in zip(ckptzip.tree.flatten(expected)[1], ckptzip.tree.flatten(actual)[1]):
        if not np.array_equal(e.host_bytes(), a.host_bytes()):
            raise SystemExit(f"{what}: {e.name} did not decode bit-exactly")


def picks(blob: bytes, raw: int) -> str:
    """Which representation the per-tensor trials picked, as shares of the raw bytes."""
    counts: Counter[str] = Counter()
    with ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as ckpt:
        for leaf in ckpt.leaves:
            residual = leaf.pipeline.residual
            kind = "dense" if residual is None else (
                residual.kind if isinstance(residual, Residual) else residual.codec_id)
            if isinstance(leaf.pipeline.serializer, ContextPlanes):
                kind += "+buckets"
            counts[kind] += leaf.nbytes
    return ", ".join(f"{k} {v / raw:.0%}" for k, v in counts.most_common())


@dataclass
class ZipnnRuns:
    """zipnn 0.5.4 per tensor on ``new ^ base`` (its delta method), or on ``new`` alone with no
    base (its dense path, the yardstick of its delta's speed), one way of using its threads."""

    triples: list[tuple[np.ndarray, np.ndarray | None, str]]  # (new bytes, base bytes, dtype)
    threads: int
    how: str
    pool: ThreadPoolExecutor

    @property
    def raw(self) -> int:
        return sum(a.size for a, _, _ in self.triples)

    def compress(self) -> tuple[float, list[bytes]]:
        zipnn = peers.get("zipnn")
        # zipnn codes its input in place: dense gets copies made off the clock; the delta's XOR
        # is a fresh buffer made inside it (that is the delta method's work)
        inputs = [a.copy() if b is None else None for a, b, _ in self.triples]

        def code(i: int, t: int) -> bytes:
            a, b, dtype = self.triples[i]
            work = inputs[i] if b is None else np.bitwise_xor(a, b)
            assert work is not None
            return zipnn.compress(work, threads=t, dtype=dtype, scratch=True)

        started = time.perf_counter()
        blobs = benchtool.per_tensor(code, len(self.triples), self.threads, self.how, self.pool)
        return time.perf_counter() - started, blobs

    def decompress(self, blobs: list[bytes]) -> Timed:
        zipnn = peers.get("zipnn")

        def decode(i: int, t: int) -> np.ndarray:
            a, b, dtype = self.triples[i]
            out = zipnn.decompress(blobs[i], a, threads=t, dtype=dtype)
            return out if b is None else np.bitwise_xor(out.view(np.uint8).reshape(-1), b)

        def run() -> tuple[float, list[np.ndarray]]:
            started = time.perf_counter()
            outs = benchtool.per_tensor(decode, len(self.triples), self.threads, self.how, self.pool)
            return time.perf_counter() - started, outs
        return run

    def check(self, outs: list[np.ndarray]) -> None:
        for out, (a, _, _) in zip(outs, self.triples):
            if not np.array_equal(out.view(np.uint8).reshape(-1), a):
                raise SystemExit("zipnn: its blob did not decode exactly")

    def fresh(self, directory: Path, blobs: list[bytes]) -> tuple[dict[str, Any], str]:
        bases = [b for _, b, _ in self.triples if b is not None]
        spec = benchtool.fresh_spec(directory, "zipnn", self.threads, blobs, how=self.how,
                                    arrays=[(a, dtype) for a, _, dtype in self.triples],
                                    base=b"".join(b.tobytes() for b in bases) if bases else None)
        return spec, benchtool.digest([a for a, _, _ in self.triples])


def zipnn_triples(new: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None,
                  ) -> list[tuple[np.ndarray, np.ndarray | None, str]]:
    """Each tensor's bytes, its base's (or None) and its dtype's name."""
    triples = []
    for name, t in new.items():
        a = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        b = None if base is None else base[name].contiguous().reshape(-1).view(torch.uint8).numpy()
        dtype = "bfloat16" if t.dtype == torch.bfloat16 else str(t.dtype).removeprefix("torch.")
        triples.append((a, b, dtype))
    return triples


def measure(data: str, g: int, new: Any, base: Any, threads: int, repeat: int,
            with_zipnn: bool, fresh_repeat: int) -> list[Row]:
    """ckptzip dense, ckptzip delta and (on weights) zipnn's dense path and XOR delta of one
    state, their compressions interleaved, then their decompressions; then one load each in
    fresh processes."""
    raw = raw_size(new)
    compress: dict[str, Timed] = {
        "ckptzip dense": clocked(lambda: ckptzip.dumps(new, threads=threads)),
        "ckptzip delta": clocked(lambda: ckptzip.dumps(new, base=base, threads=threads)),
    }
    zipnn: dict[str, ZipnnRuns] = {}
    pool = ThreadPoolExecutor(threads)
    if with_zipnn and peers.get("zipnn").available():
        for tool, triples in (("zipnn dense", zipnn_triples(new, None)),
                              ("zipnn xor-delta", zipnn_triples(new, base))):
            for how in benchtool.ways(threads):
                zipnn[f"{tool} ({how})"] = ZipnnRuns(triples, threads, how, pool)
                compress[f"{tool} ({how})"] = zipnn[f"{tool} ({how})"].compress
    packed = interleaved_best(repeat, compress)
    dense_blob, delta_blob = packed["ckptzip dense"][1], packed["ckptzip delta"][1]
    decompress: dict[str, Timed] = {
        "ckptzip dense": clocked(lambda: ckptzip.loads(dense_blob, threads=threads)),
        "ckptzip delta": clocked(lambda: ckptzip.loads(delta_blob, base=base, threads=threads)),
    }
    for name, runs in zipnn.items():
        decompress[name] = runs.decompress(packed[name][1])
    unpacked = interleaved_best(repeat, decompress)
    pool.shutdown()
    for name, runs in zipnn.items():
        runs.check(unpacked[name][1])
    expected = benchtool.digest([leaf.host_bytes() for leaf in ckptzip.tree.flatten(new)[1]])
    rows = []
    fresh_runs = []
    with tempfile.TemporaryDirectory(prefix="ckptzip-incremental-") as tmp:
        base_blob = ckptzip.dumps(base)
        for tool, blob, with_base in (("ckptzip dense", dense_blob, None),
                                      ("ckptzip delta", delta_blob, base)):
            assert_exact(new, ckptzip.loads(blob, base=with_base), f"{tool} {data}")
            rows.append(Row(data, g, threads, tool, raw, len(blob), raw / packed[tool][0] / 1e6,
                            raw / unpacked[tool][0] / 1e6, picks(blob, raw)))
            directory = Path(tmp) / tool.replace(" ", "-")
            directory.mkdir()
            fresh_runs.append((benchtool.fresh_spec(directory, benchtool.CKPTZIP, threads, [blob],
                                                    base=base_blob if with_base else None), expected))
        for tool in ("zipnn dense", "zipnn xor-delta"):
            ways = [f"{tool} ({how})" for how in benchtool.ways(threads)]
            if ways[0] not in zipnn:
                continue
            c = min(ways, key=lambda w: packed[w][0])
            d = min(ways, key=lambda w: unpacked[w][0])
            runs = zipnn[c]
            stored = sum(len(b) for b in packed[c][1])
            rows.append(Row(data, g, threads, tool, runs.raw, stored, runs.raw / packed[c][0] / 1e6,
                            runs.raw / unpacked[d][0] / 1e6, how=f"{runs.how} / {zipnn[d].how}"))
            directory = Path(tmp) / tool.replace(" ", "-")
            directory.mkdir()
            fresh_runs.append(zipnn[d].fresh(directory, packed[d][1]))
        if fresh_repeat > 0:
            for row, seconds in zip(rows, benchtool.fresh_best(fresh_runs, fresh_repeat)):
                row.fresh_decompress_mbps = row.raw_bytes / seconds / 1e6
    return rows


def run(quick: bool, threads_list: list[int], repeat: int, fresh_repeat: int) -> list[Row]:
    states = training_states(quick)
    steps = sorted(states)
    base_step = steps[0]
    rows: list[Row] = []
    for step in steps[1:]:
        g = step - base_step
        for threads in threads_list:
            for label, dtype in (("weights fp32", torch.float32), ("weights bf16", torch.bfloat16)):
                new, base = weights(states[step], dtype), weights(states[base_step], dtype)
                rows += measure(label, g, new, base, threads, repeat, True, fresh_repeat)
            rows += measure("full state", g, states[step], states[base_step], threads, repeat,
                            False, fresh_repeat)
            print(f"measured interval {g} on {threads} thread(s)", file=sys.stderr)
    return rows


def flat_weights(state: Any, dtype: torch.dtype) -> np.ndarray:
    unique = {id(t): t for t in weights(state, dtype).values()}.values()
    return np.concatenate([t.reshape(-1).view(torch.uint8).numpy() for t in unique])


def core_row(label: str, interval: int, new: np.ndarray, base: np.ndarray, width: int,
             repeat: int) -> str:
    """One row of :func:`core`: the chunk coders on the same chunks, timings interleaved. Beside
    dense and the delta the trials pick, the difference and the XOR each in plain byte planes
    and the dense entropy coder: what the delta would cost and give with the dense coder."""
    chunk = DEFAULT_CHUNK_BYTES
    pipelines = {
        "dense": Pipeline(serializer=BytePlanes(width, 1), compressors=(Entropy(),)),
        "delta": Pipeline(residual=Residual("float-diff", width), serializer=ContextPlanes(width)),
        "diff": Pipeline(residual=Residual("float-diff", width), serializer=BytePlanes(width, 0),
                         compressors=(Entropy(),)),
        "xor": Pipeline(residual=Residual("xor", width), serializer=BytePlanes(width, 1),
                        compressors=(Entropy(),)),
    }
    spans = [(start, min(start + chunk, len(new))) for start in range(0, len(new), chunk)]
    outs = {k: np.empty(len(new), np.uint8) for k in pipelines}

    def encoder(p: Pipeline) -> Callable[[], list[bytes]]:
        if p.residual is None:
            return lambda: [p.encode_chunk(new[a:b]) for a, b in spans]
        return lambda: [p.encode_chunk(new[a:b], base[a:b]) for a, b in spans]

    coded = interleaved_best(repeat, {k: clocked(encoder(p)) for k, p in pipelines.items()})

    def decoder(p: Pipeline, chunks: list[bytes], out: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            for c, (a, b) in zip(chunks, spans):
                p.decode_chunk(c, out[a:b], base[a:b] if p.residual is not None else None)
        return run

    decoded = interleaved_best(repeat, {k: clocked(decoder(p, coded[k][1], outs[k]))
                                        for k, p in pipelines.items()})
    for k, out in outs.items():
        if not np.array_equal(out, new):
            raise SystemExit(f"core {label}: the {k} chunks did not decode bit-exactly")
    c = {k: len(new) / coded[k][0] / 1e6 for k in coded}
    d = {k: len(new) / decoded[k][0] / 1e6 for k in decoded}
    ratio = {k: len(new) / sum(len(chunk) for chunk in coded[k][1]) for k in coded}
    plain = " | ".join(f"{ratio[k]:.3f}, {c[k] / c['dense']:.2f} / {d[k] / d['dense']:.2f}"
                       for k in ("diff", "xor"))
    return (f"| {label} | {interval} | {c['dense']:.0f} / {d['dense']:.0f} | "
            f"{c['delta']:.0f} / {d['delta']:.0f} | {c['delta'] / c['dense']:.2f} / "
            f"{d['delta'] / d['dense']:.2f} | {ratio['dense']:.3f} / {ratio['delta']:.3f} | "
            f"{plain} |")


def core(quick: bool, repeat: int) -> str:
    """The chunk coders alone on one thread: the weights' bytes in the policy's chunks, coded dense
    (byte planes and the entropy coder) and against the base (the bucketed float difference the
    delta trials pick for weights; also the difference and the XOR in plain planes). What a save
    or load adds to these (planning, trials, checksums, assembly) is the difference to the main
    table."""
    states = training_states(quick)
    steps = sorted(states)
    lines = ["| weights | interval | dense c / d MB/s | delta c / d MB/s | delta / dense (c / d) "
             "| ratio dense / delta | difference in plain planes: ratio, c / d vs dense "
             "| XOR in plain planes: ratio, c / d vs dense |", "|" + "---|" * 8]
    for step in steps[1:]:
        for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            width = torch.empty((), dtype=dtype).element_size()
            lines.append(core_row(label, step - steps[0], flat_weights(states[step], dtype),
                                  flat_weights(states[steps[0]], dtype), width, repeat))
    return "\n".join(lines)


def pays_below(delta_mbps: float, delta_ratio: float, dense_mbps: float, dense_ratio: float,
               ) -> str:
    """The storage bandwidth (MB/s of stored bytes) below which a delta save (or load) ends
    before the dense one, coding and I/O overlapped (each takes the longer of the two).

    Per raw MB the dense one takes max(1 / dense_mbps, 1 / (dense_ratio W)) and the delta one
    max(1 / delta_mbps, 1 / (delta_ratio W)). When the delta codes slower but stores less, the
    two meet where the delta is bound by its coder and the dense one by storage:
    W = delta_mbps / dense_ratio."""
    if delta_ratio <= dense_ratio:
        return "never"
    if delta_mbps >= dense_mbps:
        return "always"
    return f"{delta_mbps / dense_ratio:.0f}"


def markdown(rows: list[Row]) -> str:
    lines = ["| data | interval | threads | tool | ratio | vs zipnn xor | compress MB/s "
             "| decompress MB/s | decompress MB/s, fresh process | speed vs dense (c / d) "
             "| delta ends first below (write / read MB/s) | bytes coded as "
             "| zipnn's threads (c / d) |", "|" + "---|" * 13]
    index = {(r.data, r.interval, r.threads, r.tool): r for r in rows}
    for r in rows:
        zipnn = index.get((r.data, r.interval, r.threads, "zipnn xor-delta"))
        # each delta against its own tool's dense path
        own_dense = {"ckptzip delta": "ckptzip dense", "zipnn xor-delta": "zipnn dense"}
        dense = index.get((r.data, r.interval, r.threads, own_dense.get(r.tool, "")))
        vs_zipnn = f"{r.ratio / zipnn.ratio:.2f}x" if zipnn and r.tool == "ckptzip delta" else ""
        vs_dense = pays = ""
        if dense:
            vs_dense = (f"{r.compress_mbps / dense.compress_mbps:.2f} / "
                        f"{r.decompress_mbps / dense.decompress_mbps:.2f}")
            pays = (f"{pays_below(r.compress_mbps, r.ratio, dense.compress_mbps, dense.ratio)} / "
                    f"{pays_below(r.decompress_mbps, r.ratio, dense.decompress_mbps, dense.ratio)}")
        lines.append(f"| {r.data} | {r.interval} | {r.threads} | {r.tool} | {r.ratio:.3f} | {vs_zipnn} | "
                     f"{r.compress_mbps:.0f} | {r.decompress_mbps:.0f} | "
                     f"{r.fresh_decompress_mbps:.0f} | {vs_dense} | {pays} | {r.picks} | {r.how} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, short run (smoke test)")
    parser.add_argument("--threads", type=thread_counts, default=None,
                        help="e.g. 1,2 or all (default 1,all)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per measurement, best kept (default 3)")
    parser.add_argument("--fresh-repeat", type=int, default=None,
                        help="fresh processes timing one load each, best kept (default 3, none "
                             "with --quick)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where to write the results")
    parser.add_argument("--core", action="store_true",
                        help="time only the chunk coders, dense against delta, on one thread")
    args = parser.parse_args()
    if args.core:
        print(info_markdown(machine_info()) + "\n\n" + core(args.quick, args.repeat or 5))
        return
    threads_list = args.threads or ([1] if args.quick else thread_counts("1,all"))
    repeat = args.repeat or (1 if args.quick else 3)
    fresh_repeat = args.fresh_repeat if args.fresh_repeat is not None else 0 if args.quick else 3
    info = machine_info()
    rows = run(args.quick, threads_list, repeat, fresh_repeat)
    rules = (f"MB/s = 10^6 raw bytes per second, best of {repeat}, the tools in turns; input copies "
             "and bit-exact checks off the clocks. Fresh process: one load in a new process, best "
             f"of {fresh_repeat}. zipnn at N threads: its own threads tensor after tensor (own) or "
             "a pool of N threads over the tensors (pool), whichever is faster, per direction.")
    text = ("## Incremental checkpoints\n\n" + info_markdown(info) + "\n\n" + rules + "\n\n"
            + markdown(rows) + "\n")
    print(text)
    data = {"machine": info, "repeat": repeat, "fresh_repeat": fresh_repeat,
            "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}
    write_results("incremental", text, data, args.out)


if __name__ == "__main__":
    main()
