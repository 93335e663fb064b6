"""Fidelity of the lossy modes, as a matrix: does training resumed from every decoded checkpoint
go on as if nothing had happened, across setups, seeds and each mode's knob?

Per setup and seed: a lossless prefix of training (shared by every arm of that seed), then the
chain's keyframe (stored lossless), then ``deltas`` delta checkpoints ``every`` steps apart. In
every arm, training resumes from each checkpoint *as decoded* (closed loop, ExCP's protocol), so a
chain of 10 deltas is 10 resumes. The final validation loss is that of the last decoded
checkpoint, on a small validation set fixed per setup.

* **Gap**: per seed, ``100 * (val_arm / val_lossless - 1)`` against the lossless arm of the same
  seed (paired); reported as the mean over seeds and its range.
* **Noise floor**: the lossless arm's own seed-to-seed spread of the final validation loss,
  ``100 * (max - min) / mean`` over its seeds (percent). An arm is *within noise* when every seed's
  |gap| is at most that floor.
* **Full-state ratio**: the raw fp32 bytes of every weight (a tied weight once, frozen weights
  included) and every per-parameter optimizer state (Adam's two moments; SGD's momentum buffer)
  over the stored bytes of the file, mean over the delta checkpoints. **Trainable ratio**: the
  same without the frozen weights and their stored bytes (it differs only where weights are
  frozen, the LoRA setup).
* **Kept fractions**: the fraction of trained weight elements whose decoded value changed from
  the base's, and of optimizer-state elements (``exp_avg``) decoded non-zero, mean over deltas.

Arms at every seed: ``lossless``, each mode at its default, and ``excp-fair`` (ExCP with ``alpha``
set so that its weight pruning is as strong on this model as in the paper's regime: the multiplier
of the median at ExCP's cap of 2.5 for every tensor, ``alpha = 2.5 * max sqrt(mean(v))`` over the
keyframe's tensors). Sweep points, at ``--sweep-seeds`` seeds: adaptive's ``error_budget`` scaled,
ExCP's pruning strength ``s`` (``alpha = s * median sqrt(mean(v))``), BitSnap's ``density``.

Jobs run in priority order on ``--workers`` processes (each with one torch thread); every finished
arm is appended to ``<work>/runs.jsonl`` and a re-run skips those, so the matrix can be resumed or
extended. An arm stopped mid-chain (a GPU lease's call that ended) left its delta files and a
progress file (``<setup>-s<seed>-<arm>.progress.json``): a re-run decodes its checkpoints again
and trains on from the last, to the figures of an arm that ran through. ``--stop-at HH:MM``
(UTC) starts no job after that time. The report (``--report-only`` re-renders it) is
``fidelity-matrix.{md,json}`` and ``fidelity-<setup>.png`` (ratio against gap, one panel per
mode) under ``--out``/``--png-out``. ``--quick`` (the tests) runs the tiny GPT.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import ckptzip
from ckptzip.demo.gpt import GPTConfig
from ckptzip.demo.train import TrainConfig
from ckptzip.held import hold_loaded, open_held_base
from ckptzip.modes.adaptive import (
    DEFAULT_BUDGET,
    RESTART_EXP_AVG_BUDGET,
    STEP_EXP_AVG_BUDGET,
    AdaptivePolicy,
)
from ckptzip.modes.bitsnap import BitsnapPolicy
from ckptzip.modes.excp import ExcpPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT_DIR, info_markdown, machine_info, write_results
from fidelity_setups import Setup, Task, gpt_setup, minilm_setup

#: The demo's 10.8M GPT shape with a context of 64 (10.75M parameters): 8 x 64 tokens a step.
GPT10M = GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=64)
#: 0.44M parameters, 2 layers of width 128.
GPT044 = GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64)
#: The single-model harness's run before the matrix (the demo's trainer, this model, batch 16, lr
#: 1e-3): benchmarks/probes/quantizer_probe.py trains it.
FULL = TrainConfig(model=GPT044, batch_size=16, lr=1e-3, corpus_bytes=2_000_000)

SETUPS: dict[str, Setup] = {s.name: s for s in (
    Setup("gpt10m-adamw", "GPT 10.75M from scratch, AdamW at PyTorch's defaults (betas 0.9/0.999, "
          "weight decay 0.01), lr 1e-3, warmup from 0 over 20 steps then cosine to 1e-4 at step 90, "
          "clip 1, batch 8x64 bytes", gpt_setup(GPT10M, 8, 1e-3, "adamw-default", warmup=20),
          prefix=40, every=5),
    Setup("gpt-b095", "GPT 0.44M from scratch, AdamW betas 0.9/0.95, weight decay 0.1 on matrices, "
          "lr 1e-3, warmup from 0 over 40 steps then cosine to 1e-4 at step 200, clip 1, batch "
          "16x64 bytes", gpt_setup(GPT044, 16, 1e-3, "adamw-0.95", warmup=40), prefix=100, every=10),
    Setup("minilm-full", "all-MiniLM-L6-v2 (13.9M with its vocabulary trimmed to the KJV's tokens) "
          "+ new head, KJV verse -> book (66 classes), all layers trained, AdamW defaults, lr 1e-4, "
          "warmup from 0 over 10 steps then cosine to 1e-5 at step 70, clip 1, batch 16 verses",
          minilm_setup(False, 16, 1e-4, warmup=10), prefix=20, every=5),
    Setup("minilm-lora", "the same, encoder frozen, LoRA (r=8, alpha=16) on query and value + the "
          "head trained (99k parameters), AdamW defaults, lr 2e-3, warmup from 0 over 10 steps "
          "then cosine to 2e-4 at step 70", minilm_setup(True, 16, 2e-3, warmup=10), prefix=20,
          every=5),
    Setup("gpt-sgd", "GPT 0.44M from scratch, SGD momentum 0.9, lr 0.3, warmup from 0 over 40 "
          "steps then cosine to 0.03 at step 200, clip 1, batch 16x64 bytes",
          gpt_setup(GPT044, 16, 0.3, "sgd", warmup=40), prefix=100, every=10),
)}
#: On a GPU (``--setups gpt100m-adamw``, CUDA only): 106M parameters, the GPT-2-small shape with
#: 15 layers and a context of 256.
GPT100M = GPTConfig(n_layer=15, n_head=12, n_embd=768, block_size=256)
GPU_SETUPS: dict[str, Setup] = {s.name: s for s in (
    Setup("gpt100m-adamw", "GPT 106M from scratch on a GPU (bf16 autocast, fp32 weights and "
          "moments), AdamW at PyTorch's defaults (betas 0.9/0.999, weight decay 0.01), lr 6e-4, "
          "warmup from 0 over 200 steps then cosine to 6e-5 at step 2000, clip 1, batch 16x256 "
          "bytes of a 24 MB corpus",
          gpt_setup(GPT100M, 16, 6e-4, "adamw-default", warmup=200, corpus_bytes=24_000_000,
                    device="cuda"), prefix=1500, every=50),
)}
QUICK = Setup("tiny-b095", "GPT 0.1M (tiny) from scratch, AdamW betas 0.9/0.95, lr 1e-3, warmup "
              "from 0 over 20 steps, clip 1, batch 8x32 bytes",
              gpt_setup(GPTConfig.tiny(), 8, 1e-3, "adamw-0.95", warmup=20, corpus_bytes=1_000_000),
              prefix=20, every=4)

MODES = ("adaptive", "excp", "bitsnap")
#: ExCP's cap on its pruning multiplier (of the median |dW|).
EXCP_CAP = 2.5
EXCP_ALPHA = ExcpPolicy().alpha
BITSNAP_DENSITY = BitsnapPolicy().density


#: The budget adaptive's curve scales: session 15's default, ``exp_avg``'s twice today's
#: (:data:`~ckptzip.modes.adaptive.DEFAULT_BUDGET`), so that the points measured then keep
#: their options. The default arm runs the library's defaults.
REFERENCE_BUDGET = {"weight": 0.75, "exp_avg": 0.665, "exp_avg_sq": 0.4}


@dataclass(frozen=True)
class ArmSpec:
    name: str
    mode: str
    #: The mode's knob: adaptive's budget scale, ExCP's alpha ("published", "fair" or a pruning
    #: strength), BitSnap's density.
    knob: Any = None
    tier: str = "default"  # "default": every seed; "sweep": --sweep-seeds
    #: Options of the mode besides the knob.
    extra: tuple[tuple[str, Any], ...] = ()
    #: The setups it runs in (None: all).
    setups: tuple[str, ...] | None = None


#: The arms at every seed: lossless, each mode at its default, and the fair ExCP.
DEFAULT_ARMS = (ArmSpec("lossless", "lossless"), ArmSpec("adaptive", "adaptive", "default"),
                ArmSpec("excp", "excp", "published"), ArmSpec("excp-fair", "excp", "fair"),
                ArmSpec(f"bitsnap-d{BITSNAP_DENSITY:g}", "bitsnap", BITSNAP_DENSITY))
#: The other points of each mode's curve (4 per mode with the defaults; ExCP's published and fair
#: alphas are two of its four), in the order they run: modes alternate, so a matrix cut short by
#: --stop-at still has points of each.
#: Adaptive's points code exp_avg_sq as values unless named ``-ratio`` (``ratio_coding``), and
#: exp_avg as the moment itself unless named ``-step`` (``step_coding``, the default since
#: session 22): the curves measured before keep their options.
VALUE = (("ratio_coding", False), ("step_coding", False))
MOMENT = (("step_coding", False),)
SWEEP_ARMS = (
    ArmSpec("adaptive-x1", "adaptive", 1.0, "sweep", VALUE),
    ArmSpec("adaptive-x1.5", "adaptive", 1.5, "sweep", VALUE),
    ArmSpec("excp-s1", "excp", 1.0, "sweep"), ArmSpec("bitsnap-d0.4", "bitsnap", 0.4, "sweep"),
    ArmSpec("adaptive-x0.5", "adaptive", 0.5, "sweep", VALUE),
    ArmSpec("excp-s1.75", "excp", 1.75, "sweep"), ArmSpec("bitsnap-d0.05", "bitsnap", 0.05, "sweep"),
    ArmSpec("bitsnap-d0.2", "bitsnap", 0.2, "sweep"),
    ArmSpec("adaptive-x2", "adaptive", 2.0, "sweep", VALUE),
    # half the published alpha: on MiniLM ExCP's gap runs from -0.91% at 1.5e-5 to +3.46% at
    # 5e-5 (session 16's probes), within noise between
    ArmSpec("excp-a2.5e-5", "excp", "published", "sweep", (("alpha", EXCP_ALPHA / 2),)),
    # and between that and the published one, where MiniLM's gap crosses its floor (session 23)
    ArmSpec("excp-a3e-5", "excp", "published", "sweep", (("alpha", EXCP_ALPHA * 0.6),)),
    ArmSpec("excp-a3.5e-5", "excp", "published", "sweep", (("alpha", EXCP_ALPHA * 0.7),)),
    # between half the published alpha and 0.6 of it, where MiniLM's gap crosses its floor
    # (session 25: the adaptive curve got its point there too, -m1.1875)
    ArmSpec("excp-a2.75e-5", "excp", "published", "sweep", (("alpha", EXCP_ALPHA * 0.55),)),
)
#: exp_avg_sq coded as its ratio to the base's (``ratio_coding``), in priority order, at every
#: seed where it can differ from the value coding: Adam with beta2 = 0.999 (under 0.95 exp_avg_sq
#: restarts jointly and is stored at exp_avg's support; SGD has no second moment).
RATIO_SETUPS = ("gpt10m-adamw", "minilm-full", "minilm-lora", "gpt100m-adamw")
RATIO_ARMS = tuple(ArmSpec(name, "adaptive", scale, "sweep", (("ratio_coding", True), *MOMENT),
                           RATIO_SETUPS)
                   for name, scale in (("adaptive-ratio", 1.0), ("adaptive-ratio-x1.5", 1.5),
                                       ("adaptive-ratio-x0.5", 0.5)))
#: The ratio coding with exp_avg_sq's budget at a quarter (0.1): a second moment that moves by a
#: common factor keeps a tight budget for a fraction of a bit per element.
RATIO_TIGHT_V = ArmSpec("adaptive-ratio-v0.1", "adaptive", 1.0, "sweep",
                        (("ratio_coding", True), *MOMENT,
                         ("error_budget", {**REFERENCE_BUDGET, "exp_avg_sq": 0.1})), RATIO_SETUPS)
#: The adaptive default of session 19, before the step coding: exp_avg_sq by its ratio, exp_avg as
#: itself at half the reference budget. Its 106M runs (the GPU setup's only adaptive point then)
#: stay on that setup's curve under this name; no other setup runs it.
PRE_STEP_DEFAULT = ArmSpec("adaptive-ratio-m0.5", "adaptive", 1.0, "sweep",
                           (("ratio_coding", True), *MOMENT,
                            ("error_budget", {**REFERENCE_BUDGET,
                                              "exp_avg": REFERENCE_BUDGET["exp_avg"] / 2})),
                           ("gpt100m-adamw",))
#: exp_avg coded as Adam's step (``step_coding``, the default since session 22) with
#: exp_avg_sq's ratio coding, its budget as multiples of the default's (:data:`STEP_BUDGET`),
#: where the step coding applies: Adam with beta2 = 0.999 (under 0.95 both moments restart and
#: exp_avg is coded first; SGD has no second moment).
STEP_BUDGET = {"weight": DEFAULT_BUDGET["weight"], "exp_avg": STEP_EXP_AVG_BUDGET,
               "exp_avg_sq": DEFAULT_BUDGET["exp_avg_sq"]}
STEP_ARMS = tuple(ArmSpec(name, "adaptive", scale, "sweep",
                          (("step_coding", True),
                           ("error_budget", {k: v * scale for k, v in STEP_BUDGET.items()})),
                          RATIO_SETUPS)
                  for name, scale in (("adaptive-step-x1.5", 1.5), ("adaptive-step-x2", 2.0)))
#: Looser points of the same coding on the 106M GPU setup alone, where x2 is within noise with
#: 1.4 points of room on every seed (session 26; a lease runs two adaptive arms at 3 seeds): all
#: budgets at 2.5x, and the moments' at 3x with the weights' at 2.5x (1.875: a weight budget
#: of MAX_WEIGHT_BUDGET or more is refused). Both were within noise in session 30 (102.7x and
#: 113.3x, the gap unmoved), so the moments' at 5x comes next, towards ExCP's gap (+2%). At 5x
#: (session 33: 144.3x, -0.07%) the moments took 23% of the bytes; 2x ExCP's best point (86.1x
#: at +1.97%) needs 172x. The weights' 0.51 bits a parameter cap the setup near 187x, so next:
#: the moments at 10x, and at 20x with the weights at 2.6x (1.95, under MAX_WEIGHT_BUDGET). On
#: the 10.75M GPT one delta's moments took 0.057, 0.032 and 0.014 bits a parameter at 5x, 10x
#: and 20x, and its weights 3% fewer at 2.6x than at 2.5x (docs/journal/session33-2026-11-28.md):
#: scaled to the 106M setup's split, about 160x and 179x.
STEP_ARMS += tuple(ArmSpec(name, "adaptive", 1.0, "sweep",
                           (("step_coding", True),
                            ("error_budget", {"weight": weights * STEP_BUDGET["weight"],
                                              "exp_avg": moments * STEP_BUDGET["exp_avg"],
                                              "exp_avg_sq": moments * STEP_BUDGET["exp_avg_sq"]})),
                           ("gpt100m-adamw",))
                   for name, weights, moments in (("adaptive-step-x2.5", 2.5, 2.5),
                                                  ("adaptive-step-x3-w2.5", 2.5, 3.0),
                                                  ("adaptive-step-x5-w2.5", 2.5, 5.0),
                                                  ("adaptive-step-x10-w2.5", 2.5, 10.0),
                                                  ("adaptive-step-x20-w2.6", 2.6, 20.0)))
#: The step coding with the weights' budget at 1.5x (1.125) or 2.5x (1.875, near
#: MAX_WEIGHT_BUDGET), the step's at the default or, with the weights at 2.5x, 1.25x (0.83) and
#: 1.125x (0.75): on MiniLM and LoRA the first moment's budget is what moves the gap (session 22's
#: probes) and the weights' barely does (session 23's, docs/journal); LoRA is within noise at 2.2x
#: the best ExCP point's ratio at m1.25, MiniLM at 2.1x at m1.125. Session 25 added 1.1875x
#: (0.79), between the two, where MiniLM's gap crosses its floor.
STEP_ARMS += tuple(ArmSpec(f"adaptive-step-w{weight:g}" + (f"-m{step:g}" if step != 1 else ""),
                           "adaptive", 1.0, "sweep",
                           (("step_coding", True),
                            ("error_budget", {**STEP_BUDGET,
                                              "weight": weight * STEP_BUDGET["weight"],
                                              "exp_avg": step * STEP_BUDGET["exp_avg"]})),
                           RATIO_SETUPS)
                   for weight, step in ((1.5, 1), (2.5, 1), (2.5, 1.25), (2.5, 1.125), (2.5, 1.1875)))
QUICK_SWEEP = (ArmSpec("excp-s1", "excp", 1.0, "sweep"), ArmSpec("bitsnap-d0.4", "bitsnap", 0.4, "sweep"))
#: The cheap setups run first at each step of the order.
CHEAP = ("gpt-b095", "gpt-sgd", "minilm-lora")


def adaptive_budget(knob: Any) -> dict[str, float]:
    return {k: v * float(knob) for k, v in REFERENCE_BUDGET.items()}


@dataclass
class Job:
    setup: str
    seed: int
    arm: ArmSpec

    @property
    def key(self) -> str:
        return f"{self.setup}/{self.seed}/{self.arm.name}"


@dataclass
class Keyframe:
    path: Path
    val_loss: float
    raw_bytes: int
    trainable_raw_bytes: int
    trained_weight_bytes: int
    v_scales: list[float] = field(default_factory=list)


def tensors(state: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(state, torch.Tensor):
        return [("", state)]
    items = state.items() if isinstance(state, dict) else (
        enumerate(state) if isinstance(state, (list, tuple)) else ())
    out = []
    for key, value in items:
        out += [(f"{key}.{n}" if n else str(key), t) for n, t in tensors(value)]
    return out


def raw_bytes(state: dict[str, Any], frozen: set[str]) -> tuple[int, int, int]:
    """(all, trainable, trained weights): fp32 bytes of the weights (tied once) and per-parameter
    optimizer states."""
    seen: set[int] = set()
    total = trainable = weights = 0
    for name, t in tensors({"model": state["model"], "optimizer": state["optimizer"]["state"]}):
        if not t.is_floating_point() or t.dim() == 0 or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += 4 * t.numel()
        if name not in frozen:
            trainable += 4 * t.numel()
            weights += 4 * t.numel() if name.startswith("model.") else 0
    return total, trainable, weights


def keyframe(setup: Setup, seed: int, work: Path) -> Keyframe:
    """The seed's lossless prefix and its keyframe, made once (a file lock keeps two workers
    from making it twice)."""
    path = work / f"{setup.name}-s{seed}-key.ckz"
    meta = path.with_suffix(".json")
    with open(work / f"{setup.name}-s{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not meta.exists():
            task = setup.build(seed, setup.total)
            task.train(setup.prefix)
            state = task.state()
            ckptzip.save(state, path, mode="lossless")
            total, trainable, weights = raw_bytes(state, task.frozen())
            optim = state["optimizer"]["state"]
            scales = [float(optim[i]["exp_avg_sq"].double().mean().sqrt())
                      for i in task.pairing().values()
                      if "exp_avg_sq" in optim.get(i, {}) and optim[i]["exp_avg_sq"].numel() >= 16]
            meta.write_text(json.dumps({"val_loss": task.evaluate(), "raw_bytes": total,
                                        "trainable_raw_bytes": trainable,
                                        "trained_weight_bytes": weights, "v_scales": scales}))
    data = json.loads(meta.read_text())
    return Keyframe(path, data["val_loss"], data["raw_bytes"], data["trainable_raw_bytes"],
                    data["trained_weight_bytes"],
                    data["v_scales"])


def arm_options(arm: ArmSpec, key: Keyframe, task: Task) -> dict[str, Any]:
    if arm.mode == "lossless":
        return {}
    options: dict[str, Any] = {"pairing": task.pairing()}
    if arm.mode == "adaptive":
        if arm.knob != "default":  # the default arm passes none: exp_avg's default budget
            options["error_budget"] = adaptive_budget(arm.knob)  # depends on the restart
        options.update(arm.extra)
    elif arm.mode == "bitsnap":
        options["density"] = float(arm.knob)
    elif arm.knob == "published" or not key.v_scales:
        options["alpha"] = EXCP_ALPHA
    elif arm.knob == "fair":
        options["alpha"] = EXCP_CAP * max(key.v_scales)
    else:
        options["alpha"] = float(arm.knob) * statistics.median(key.v_scales)
    if arm.mode != "adaptive":
        options.update(arm.extra)  # adaptive's are set in its branch above
    return options


def leaf_bytes(path: Path, names: set[str] | None) -> int:
    """Stored bytes of the leaves named (None: of the optimizer's)."""
    with ckptzip.open(path) as checkpoint:
        return sum(chunk.length for leaf in checkpoint.leaves
                   if (leaf.name.startswith("optimizer.") if names is None else leaf.name in names)
                   for chunk in leaf.chunks)


def setup_named(name: str, quick: bool, shape: dict[str, int] | None) -> Setup:
    """The setup ``name`` (``shape``: its prefix, every or deltas replaced, a smoke test)."""
    setup = QUICK if quick else {**SETUPS, **GPU_SETUPS}[name]
    if not shape:
        return setup
    return replace(setup, prefix=shape.get("prefix", setup.prefix),
                   every=shape.get("every", setup.every), deltas=shape.get("deltas", setup.deltas))


def trained_on(task: Task) -> str:
    """What the task's model trained on: the GPU's name, or "cpu"."""
    device = next(task.model.parameters()).device
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


#: The lists a run keeps per delta checkpoint, which an arm's progress file carries.
PER_DELTA = ("stored", "frozen_bytes", "optimizer_bytes", "weights_kept", "moments_kept",
             "train_loss")


def progress_path(job: Job, work: Path) -> Path:
    """Where an arm records what it has done after each delta checkpoint (removed when it ends)."""
    return work / f"{job.setup}-s{job.seed}-{job.arm.name}.progress.json"


def load_progress(path: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """An arm's progress from an earlier, stopped process: the delta files written, the per-delta
    figures and the seconds spent; empty where there is none, or where it was made for another
    ``plan`` (the setup's shape, the options) or a file of its chain is missing."""
    fresh: dict[str, Any] = {"plan": plan, "chain": [], "seconds": 0.0, "resumes": 0,
                             **{name: [] for name in PER_DELTA}}
    if not path.exists():
        return fresh
    try:
        progress = json.loads(path.read_text())
    except ValueError:
        return fresh
    if progress.get("plan") != plan or not all(Path(p).exists() for p in progress["chain"]):
        return fresh
    return progress


def save_progress(path: Path, progress: dict[str, Any]) -> None:
    """Write ``progress`` atomically: a process killed mid-write leaves the previous one."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(progress))
    partial.replace(path)


def run_job(job: Job, work: Path, quick: bool,
            shape: dict[str, int] | None = None) -> dict[str, Any]:
    """One arm at one seed: the keyframe's training resumed from each of ``deltas`` decoded
    checkpoints. It picks up where a stopped process left it (a lease's call that ended
    mid-arm): the delta files it wrote are decoded again in order, and training goes on from the
    last, as it would have (each checkpoint holds the optimizer, scheduler and random states, and
    training always resumes from the decoded one)."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    setup = setup_named(job.setup, quick, shape)
    key = keyframe(setup, job.seed, work)
    started = time.perf_counter()
    task = setup.build(job.seed, setup.total)
    options = arm_options(job.arm, key, task)
    record_path = progress_path(job, work)
    plan = {"prefix": setup.prefix, "every": setup.every, "deltas": setup.deltas,
            "options": json.loads(json.dumps(options, default=str))}
    progress = load_progress(record_path, plan)
    # each checkpoint's base as decoded comes from holding what loading it gave (ckptzip.held,
    # copies: training changes the optimizer's tensors in place), not from decoding it again
    # through every delta under it: a chain of d deltas in d decodes instead of d**2 / 2
    decoded = ckptzip.load(key.path)
    held = hold_loaded(str(key.path), decoded)
    previous = key.path
    for done in progress["chain"]:  # a stopped process's checkpoints, decoded as it did
        decoded = ckptzip.load(done, base=open_held_base(previous, held))
        held = hold_loaded(str(done), decoded)
        previous = Path(done)
    if progress["chain"]:
        progress["resumes"] += 1
    task.restore(decoded)
    frozen = task.frozen()
    trained = [f"model.{n}" for n in task.param_names()]
    for d in range(len(progress["chain"]) + 1, setup.deltas + 1):
        before = {n: t.detach().to("cpu", copy=True) for n, t in task.model.state_dict().items()
                  if f"model.{n}" in trained}
        progress["train_loss"] += task.train(setup.every)
        path = work / f"{job.setup}-s{job.seed}-{job.arm.name}-{d:02d}.ckz"
        report = ckptzip.save(task.state(), path, mode=job.arm.mode,
                              base=open_held_base(previous, held), resumed=True, **options)
        decoded = ckptzip.load(path, base=open_held_base(previous, held))
        held = hold_loaded(str(path), decoded)
        progress["stored"].append(report.stored_bytes)
        progress["frozen_bytes"].append(leaf_bytes(path, frozen) if frozen else 0)
        progress["optimizer_bytes"].append(leaf_bytes(path, None))
        changed = sum(int((decoded["model"][n] != t).sum()) for n, t in before.items())
        progress["weights_kept"].append(changed / sum(t.numel() for t in before.values()))
        moments = [t for s in decoded["optimizer"]["state"].values() for k, t in s.items()
                   if k in ("exp_avg", "momentum_buffer")]
        progress["moments_kept"].append(sum(int((t != 0).sum()) for t in moments)
                                        / max(1, sum(t.numel() for t in moments)))
        task.restore(decoded)  # closed loop: training goes on from what was stored
        previous = path
        progress["chain"].append(str(path))
        if d < setup.deltas:
            save_progress(record_path, {**progress, "seconds": progress["seconds"]
                                        + time.perf_counter() - started})
    val = task.evaluate()
    for chained in progress["chain"]:  # a delta's decoding reads the chain before it: removed
        Path(chained).unlink()
    record_path.unlink(missing_ok=True)
    stored, frozen_bytes = progress["stored"], progress["frozen_bytes"]
    train_loss, optimizer_bytes = progress["train_loss"], progress["optimizer_bytes"]
    deltas = len(stored)
    mean_stored = sum(stored) / deltas
    mean_frozen = sum(frozen_bytes) / deltas
    return {
        "key": job.key, "setup": job.setup, "seed": job.seed, "arm": job.arm.name,
        "mode": job.arm.mode, "knob": job.arm.knob, "tier": job.arm.tier,
        "options": {k: v for k, v in options.items() if k != "pairing"},
        "keyframe_val_loss": key.val_loss, "val_loss": val,
        "train_loss_last": sum(train_loss[-setup.every:]) / setup.every,
        "stored_bytes": stored, "frozen_bytes": frozen_bytes,
        "full_state_ratio": key.raw_bytes / mean_stored,
        "trainable_ratio": key.trainable_raw_bytes / max(1.0, mean_stored - mean_frozen),
        # trained weights' raw fp32 bytes over what is stored for them (all but the optimizer's
        # leaves and the frozen weights: headers and a mode's added leaves included)
        "model_state_ratio": key.trained_weight_bytes / max(1.0, mean_stored - mean_frozen - (
            sum(optimizer_bytes) / deltas)),
        "bits_per_param": 8 * mean_stored / (key.raw_bytes / 12),  # Adam; the report corrects it
        "weights_kept": sum(progress["weights_kept"]) / deltas,
        "moments_kept": sum(progress["moments_kept"]) / deltas,
        "excp_strength": (None if job.arm.mode != "excp" or not key.v_scales else statistics.median(
            min(EXCP_CAP, options["alpha"] / s) for s in key.v_scales)),
        # the processes' seconds together, the chain's decoding again after a stop included
        "seconds": progress["seconds"] + time.perf_counter() - started,
        "resumes": progress["resumes"],
        "device": trained_on(task),
    }


def _worker(args: tuple[Job, Path, bool, dict[str, int] | None]) -> dict[str, Any]:
    return run_job(*args)


def _keyframe_worker(args: tuple[str, int, Path, bool, dict[str, int] | None]) -> str:
    name, seed, work, quick, shape = args
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    keyframe(setup_named(name, quick, shape), seed, work)
    return f"{name}-s{seed}"


def make_keyframes(names: list[str], seeds: int, work: Path, workers: int, quick: bool,
                   shape: dict[str, int] | None, log: Any) -> None:
    """Train each setup's lossless prefix and write its keyframe, ``workers`` at a time, and
    nothing else: a new machine's prefix can be compared with the one an earlier machine trained
    before any arm's run is reused (``gpu_check.sh``)."""
    import contextlib
    import multiprocessing

    tasks = [(name, seed, work, quick, shape) for name in names for seed in range(seeds)]
    with (multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) if workers > 1
          else contextlib.nullcontext()) as pool:
        made = map(_keyframe_worker, tasks) if pool is None else pool.imap_unordered(
            _keyframe_worker, tasks)
        for key in made:
            print(f"{datetime.now(timezone.utc):%H:%M:%S} keyframe {key}", file=log, flush=True)


def done_runs(work: Path) -> dict[str, dict[str, Any]]:
    path = work / "runs.jsonl"
    if not path.exists():
        return {}
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in runs}


def jobs_for(setups: list[str], seeds: int, sweep_seeds: int, quick: bool,
             arms: list[str] | None = None, arm_major: bool = False) -> list[Job]:
    """In priority order: the default arms at seed 0 everywhere, then at the other seeds (cheap
    setups first), then each sweep point at all its seeds, setup by setup (cheap first), so that
    every arm a cut-short matrix finished has all its seeds; :data:`RATIO_ARMS` where they apply,
    three before the sweep and one before its last point. ``arms``: only those named."""
    order = sorted(setups, key=lambda s: s not in (*CHEAP, QUICK.name))
    sweep = QUICK_SWEEP if quick else SWEEP_ARMS
    jobs = [Job(s, 0, a) for s in order for a in DEFAULT_ARMS]
    jobs += [Job(s, seed, a) for s in order for seed in range(1, seeds) for a in DEFAULT_ARMS]
    ratio = () if quick else (*STEP_ARMS, RATIO_ARMS[0], RATIO_TIGHT_V, *RATIO_ARMS[1:],
                              PRE_STEP_DEFAULT)
    # the step coding's points first, then the ratio coding's first three, its last before the
    # value coding's last
    cut = len(STEP_ARMS) + 3
    for arm in (*ratio[:cut], *sweep[:-1], *ratio[cut:], *sweep[-1:]):
        jobs += [Job(s, seed, arm) for s in order if s in (arm.setups or (s,))
                 for seed in range(seeds if arm in ratio else sweep_seeds)]
    if arms:
        jobs = [j for j in jobs if j.arm.name in arms]
        if arm_major:  # each arm at all its seeds before the next, in the order named
            jobs.sort(key=lambda j: (arms.index(j.arm.name), j.seed))
    return jobs


def run_matrix(jobs: list[Job], work: Path, workers: int, quick: bool,
               shape: dict[str, int] | None, stop_at: datetime | None, log: Any) -> None:
    done = done_runs(work)
    todo = [j for j in jobs if j.key not in done]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} arms already done", file=log, flush=True)
    out = open(work / "runs.jsonl", "a")  # noqa: SIM115 (appended to as arms finish)

    def record(run: dict[str, Any]) -> None:
        out.write(json.dumps(run) + "\n")
        out.flush()
        print(f"{datetime.now(timezone.utc):%H:%M:%S} {run['key']}: ratio "
              f"{run['full_state_ratio']:.1f}x, val {run['val_loss']:.4f}, kept w "
              f"{run['weights_kept']:.3f} m {run['moments_kept']:.3f}, {run['seconds']:.0f}s",
              file=log, flush=True)

    def stopped() -> bool:
        return stop_at is not None and datetime.now(timezone.utc) >= stop_at

    if workers <= 1:
        for job in todo:
            if stopped():
                print(f"--stop-at reached: {job.key} and later not run", file=log, flush=True)
                break
            record(run_job(job, work, quick, shape))
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, maxtasksperchild=1) as pool:
        pending = list(todo)
        running: list[tuple[Job, Any]] = []
        while pending or running:
            while pending and len(running) < workers and not stopped():
                job = pending.pop(0)
                running.append((job, pool.apply_async(_worker, ((job, work, quick, shape),))))
            if stopped() and pending:
                print(f"--stop-at reached: {len(pending)} arms not started: "
                      + ", ".join(j.key for j in pending), file=log, flush=True)
                pending = []
            time.sleep(1)
            for item in [r for r in running if r[1].ready()]:
                running.remove(item)
                try:
                    record(item[1].get())
                except Exception as error:  # report and go on with the others
                    print(f"{item[0].key} failed: {error!r}", file=log, flush=True)


# --- the report ------------------------------------------------------------------------------

def summarize(runs: list[dict[str, Any]], setups: list[Setup]) -> dict[str, Any]:
    """Per setup: noise floor, per arm the gap over seeds and the ratios, the matched-gap
    comparison."""
    result: dict[str, Any] = {}
    for setup in setups:
        mine = [r for r in runs if r["setup"] == setup.name]
        lossless = {r["seed"]: r for r in mine if r["arm"] == "lossless"}
        vals = [r["val_loss"] for r in lossless.values()]
        floor = (100 * (max(vals) - min(vals)) / statistics.mean(vals)) if len(vals) >= 2 else None
        arms: dict[str, Any] = {}
        for name in dict.fromkeys(r["arm"] for r in mine):
            rs = sorted((r for r in mine if r["arm"] == name), key=lambda r: r["seed"])
            gaps = [100 * (r["val_loss"] / lossless[r["seed"]]["val_loss"] - 1)
                    for r in rs if r["seed"] in lossless]
            if not gaps:
                continue
            within = (None if floor is None else all(abs(g) <= floor for g in gaps))
            arms[name] = {
                "mode": rs[0]["mode"], "knob": rs[0]["knob"], "tier": rs[0]["tier"],
                "options": rs[0]["options"], "seeds": [r["seed"] for r in rs],
                "gaps_pct": gaps, "gap_mean_pct": statistics.mean(gaps),
                "gap_min_pct": min(gaps), "gap_max_pct": max(gaps),
                "within_noise": within,
                "full_state_ratio": statistics.mean(r["full_state_ratio"] for r in rs),
                "trainable_ratio": statistics.mean(r["trainable_ratio"] for r in rs),
                "model_state_ratio": statistics.mean(r["model_state_ratio"] for r in rs),
                "bits_per_param": statistics.mean(r["bits_per_param"] for r in rs),
                "weights_kept": statistics.mean(r["weights_kept"] for r in rs),
                "moments_kept": statistics.mean(r["moments_kept"] for r in rs),
                "excp_strength": rs[0]["excp_strength"],
                "val_loss": statistics.mean(r["val_loss"] for r in rs),
                "seconds": statistics.mean(r["seconds"] for r in rs),
            }
        best: dict[str, Any] = {}
        for mode in MODES:
            # an arm cut short (fewer seeds than the lossless arm's) is no evidence either way
            # (ratio, default arm first on a tie: two arms may share their runs, docs/BENCHMARKS.md §5)
            ok = [(a["full_state_ratio"], a["tier"] == "default", n) for n, a in arms.items()
                  if a["mode"] == mode and a["within_noise"] and len(a["seeds"]) >= len(lossless)]
            best[mode] = ({"arm": max(ok)[2], "full_state_ratio": max(ok)[0]} if ok else None)
        matched = None
        if best["adaptive"] and best["excp"]:
            matched = best["adaptive"]["full_state_ratio"] / best["excp"]["full_state_ratio"]
        result[setup.name] = {"description": setup.description, "prefix": setup.prefix,
                              "every": setup.every, "deltas": setup.deltas,
                              "lossless_val": vals, "noise_floor_pct": floor, "arms": arms,
                              "best_within_noise": best, "adaptive_over_best_excp": matched}
    return result


def _fmt_ratio(a: dict[str, Any]) -> str:
    text = f"{a['full_state_ratio']:.1f}x"
    if abs(a["trainable_ratio"] / a["full_state_ratio"] - 1) > 0.01:
        text += f" ({a['trainable_ratio']:.1f}x)"
    return text


def where_trained(runs: list[dict[str, Any]]) -> str:
    """Which devices the runs trained on, for the report (the machine line above it is the one
    that rendered the report)."""
    # a CPU setup trains on the CPU by construction (runs before the field existed lack it)
    devices = sorted({r.get("device", "cpu" if r["setup"] in SETUPS else "not recorded")
                      for r in runs})
    if devices == ["cpu"]:
        return "Every run trained on the CPU of the machine above."
    return ("The runs trained on: " + ", ".join(devices) + " (the machine above rendered this "
            "report; runs made before the runs recorded their device say \"not recorded\": "
            "their log names it).")


def markdown(summary: dict[str, Any], info: dict[str, Any], seeds: int, sweep_seeds: int,
             missing: list[str], runs: list[dict[str, Any]]) -> str:
    lines = [
        "## Fidelity matrix: training resumed from every decoded checkpoint", "",
        info_markdown(info), "",
        where_trained(runs), "",
        f"Per setup and seed: a lossless training prefix shared by the seed's arms, a lossless "
        f"keyframe, then 10 delta checkpoints; every arm resumes training from each checkpoint as "
        f"decoded (10 resumes). Default arms at {seeds} seeds, sweep points at {sweep_seeds}. "
        f"**Gap**: the final validation loss (of the last decoded checkpoint, "
        f"on a validation set fixed per setup) against the lossless arm of the same seed, "
        f"percent; mean [min, max] over seeds. **Noise floor**: the lossless arm's "
        f"seed-to-seed spread of the final validation loss, 100 * (max - min) / mean. **Within "
        f"noise**: every seed's |gap| <= the floor. **Full-state ratio**: raw fp32 weights (tied "
        f"once, frozen included) + per-parameter optimizer states (Adam's two moments, SGD's "
        f"momentum) over the stored bytes, mean over the delta checkpoints; in brackets the "
        f"ratio without frozen weights where they differ. **Bits/param**: stored bits per model "
        f"parameter (frozen ones included). **Model-state ratio**: trained weights' "
        f"raw fp32 bytes over the stored bytes that are not the optimizer's or frozen weights'. "
        f"**Kept**: fraction of trained weight "
        f"elements whose decoded value changed / of exp_avg (momentum) elements decoded non-zero. "
        f"Lossy modes get the optimizer's pairing passed explicitly.", "",
    ]
    if missing:
        lines += [f"**Not run (time)**: {len(missing)} arms: " + ", ".join(missing), ""]
    resumed = [r["key"] for r in runs if r.get("resumes")]
    if resumed:
        lines += [f"**Resumed after a stop**: {len(resumed)} runs, their seconds the parts' sum "
                  "(decoding the chain again included): " + ", ".join(resumed), ""]
    for name, s in summary.items():
        floor = s["noise_floor_pct"]
        floor_text = (f"**noise floor {floor:.3f}%**." if floor is not None
                      else "noise floor n/a (one seed).")
        lines += [
            f"### {name}", "", f"{s['description']}. Prefix {s['prefix']} steps, then a "
            f"checkpoint every {s['every']} steps. Lossless final val loss per seed: "
            + ", ".join(f"{v:.4f}" for v in s["lossless_val"]) + "; " + floor_text, "",
            "| arm | knob | seeds | full-state ratio | model-state ratio | bits/param | "
            "gap % mean [min, max] | within noise | kept w / m | ExCP strength | s/arm |",
            "|---|---|---:|---:|---:|---:|---|---|---|---:|---:|",
        ]
        for arm, a in s["arms"].items():
            knob = ("" if a["mode"] == "lossless" else
                    f"alpha={a['options'].get('alpha'):.3g}" if a["mode"] == "excp" else
                    f"density={a['knob']:g}" if a["mode"] == "bitsnap" else
                    f"budget x{a['knob']:g}" if not isinstance(a["knob"], str)
                    else DEFAULT_TEXT if a["knob"] == "default" else f"budget {a['knob']}")
            knob += _variant(a)
            within = {None: "n/a", True: "yes", False: "no"}[a["within_noise"]]
            strength = "" if a["excp_strength"] is None else f"{a['excp_strength']:.2f}"
            lines.append(
                f"| {arm} | {knob} | {len(a['seeds'])} | {_fmt_ratio(a)} | "
                f"{a['model_state_ratio']:.1f}x | "
                f"{a['bits_per_param']:.3f} | {a['gap_mean_pct']:+.3f} [{a['gap_min_pct']:+.3f}, "
                f"{a['gap_max_pct']:+.3f}] | {within} | {a['weights_kept']:.3f} / "
                f"{a['moments_kept']:.3f} | {strength} | {a['seconds']:.0f} |")
        best = s["best_within_noise"]
        parts = [f"{m}: {b['full_state_ratio']:.1f}x ({b['arm']})" if b else f"{m}: none"
                 for m, b in best.items()]
        lines += ["", "Highest full-state ratio within noise: " + "; ".join(parts) + "."]
        if s["adaptive_over_best_excp"] is not None:
            lines.append(f"At a matched gap (both within noise) adaptive stores "
                         f"{s['adaptive_over_best_excp']:.2f}x fewer bytes than the best ExCP "
                         f"point.")
        lines.append("")
    return "\n".join(lines)


#: What the default adaptive arm runs (the library's defaults).
DEFAULT_TEXT = (f"defaults: budget w {DEFAULT_BUDGET['weight']:g} / m {STEP_EXP_AVG_BUDGET:g} "
                f"of Adam's step where exp_avg_sq is kept (step_coding="
                f"{AdaptivePolicy().step_coding}), {RESTART_EXP_AVG_BUDGET:g} of the moment where "
                f"both moments restart, {DEFAULT_BUDGET['exp_avg']:g} of it without the step "
                f"coding / v {DEFAULT_BUDGET['exp_avg_sq']:g}, ratio_coding="
                f"{AdaptivePolicy().ratio_coding}")


def coding(arm: dict[str, Any]) -> str:
    """How an adaptive sweep arm codes its moments: ``"value"`` (exp_avg_sq as values, exp_avg
    as itself), ``"ratio"`` (exp_avg_sq against the base, exp_avg as itself: the runs from
    before the step coding name no ``step_coding``) or ``"step"`` (exp_avg as Adam's step as
    well, where it applies)."""
    options = arm["options"]
    if options.get("ratio_coding") is False:
        return "value"
    return "step" if options.get("step_coding") is True else "ratio"


def _variant(arm: dict[str, Any]) -> str:
    """How an adaptive arm differs from its budget's scale: the ratio or step coding, and its
    own exp_avg_sq budget."""
    if arm["mode"] != "adaptive" or arm["knob"] == "default" or coding(arm) == "value":
        return ""
    if coding(arm) == "step":  # and any state's budget off the default's scaled by the knob
        budget = arm["options"].get("error_budget", {})
        scaled = {k: v * float(arm["knob"]) for k, v in STEP_BUDGET.items()}
        return ", step_coding" + "".join(f", {k} {budget[k]:g}" for k in scaled
                                         if k in budget and abs(budget[k] - scaled[k]) > 1e-9)
    budget = arm["options"].get("error_budget", {})
    scaled = adaptive_budget(arm["knob"])
    return ", ratio_coding" + "".join(f", {k} {budget[k]:g}" for k in scaled
                                      if k in budget and abs(budget[k] - scaled[k]) > 1e-9)


def plot(name: str, s: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    floor = s["noise_floor_pct"]
    for ax, mode in zip(axes, MODES):
        points = [a for a in s["arms"].values() if a["mode"] == mode]
        # adaptive: the value-coded budget curve (a line); off it, as squares, its default and
        # the ratio coding's points; the step coding's points (triangles, a line of their own)
        adaptive = [a for a in points if mode == "adaptive"]
        variants = [a for a in adaptive if a["knob"] == "default" or coding(a) == "ratio"]
        steps = sorted((a for a in adaptive if a not in variants and coding(a) == "step"),
                       key=lambda a: a["full_state_ratio"])
        points = sorted((a for a in points if a not in variants and a not in steps),
                        key=lambda a: a["full_state_ratio"])
        if floor is not None:
            ax.axvspan(-floor, floor, color="0.9", label=f"noise floor ±{floor:.2f}%")
        ax.axvline(0, color="0.6", lw=0.8)
        for a in (*points, *variants, *steps):
            lo, hi = a["gap_mean_pct"] - a["gap_min_pct"], a["gap_max_pct"] - a["gap_mean_pct"]
            color = ("C0" if a["tier"] == "default" else "C2" if a in variants
                     else "C4" if a in steps else "C1")
            ax.errorbar(a["gap_mean_pct"], a["full_state_ratio"], xerr=[[lo], [hi]],
                        fmt="s" if a in variants else "^" if a in steps else "o", ms=5,
                        capsize=3, color=color)
            label = (f"a={a['options']['alpha']:.3g}" if mode == "excp" else
                     f"d={a['knob']:g}" if mode == "bitsnap" else
                     f"x{a['knob']:g}" if not isinstance(a["knob"], str) else a["knob"])
            label += _variant(a).replace("_coding", "") if a in (*variants, *steps) else ""
            ax.annotate(f"{label} ({len(a['seeds'])}s)", (a["gap_mean_pct"], a["full_state_ratio"]),
                        fontsize=7, xytext=(4, 3), textcoords="offset points")
        for line, shade in ((points, "0.5"), (steps, "C4")):
            ax.plot([a["gap_mean_pct"] for a in line], [a["full_state_ratio"] for a in line],
                    "-", color=shade, lw=0.8)
        ax.set(title=mode, xlabel="val-loss gap to lossless, % (mean, range over seeds)",
               yscale="log")
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("full-state ratio (raw fp32 weights + states / stored)")
    figure.suptitle(f"{name}: ratio against gap (blue: each mode's default, orange: sweep "
                    f"points;\nsquares: exp_avg_sq coded against the base, ratio_coding=True; "
                    f"triangles: exp_avg as Adam's step too, step_coding=True, the default's "
                    f"coding)",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def report(jobs: list[Job], work: Path, out: Path, png_out: Path, setups: list[Setup],
           info: dict[str, Any], seeds: int, sweep_seeds: int) -> None:
    runs = list(done_runs(work).values())
    wanted = {j.key for j in jobs}
    runs = [r for r in runs if r["key"] in wanted]
    for r in runs:  # bits per model parameter (frozen ones included), from the keyframe's sizes
        meta = json.loads((work / f"{r['setup']}-s{r['seed']}-key.json").read_text())
        params = (meta["raw_bytes"] - meta["trainable_raw_bytes"] + meta["trained_weight_bytes"]) / 4
        r["bits_per_param"] = 8 * statistics.mean(r["stored_bytes"]) / params
    missing = [j.key for j in jobs if j.key not in {r["key"] for r in runs}]
    summary = summarize(runs, setups)
    text = markdown(summary, info, seeds, sweep_seeds, missing, runs)
    print(text)
    png_out.mkdir(parents=True, exist_ok=True)
    for name, s in summary.items():
        if s["arms"]:
            plot(name, s, png_out / f"fidelity-{name}.png")
    write_results("fidelity-matrix", text, {"machine": info, "seeds": seeds,
                                            "sweep_seeds": sweep_seeds, "not_run": missing,
                                            "summary": summary, "runs": runs}, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny GPT only (the tests)")
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated, from: "
                        + ", ".join(SETUPS) + "; on a GPU: " + ", ".join(GPU_SETUPS))
    parser.add_argument("--seeds", type=int, help="seeds of the default arms (default 3; quick 2)")
    parser.add_argument("--sweep-seeds", type=int, help="seeds of the sweep points (default: "
                        "--seeds; quick 1)")
    parser.add_argument("--workers", type=int, default=1, help="processes (one torch thread each)")
    parser.add_argument("--stop-at", help="HH:MM UTC: start no arm after this time")
    parser.add_argument("--stop-after", type=float,
                        help="seconds from now: start no arm after then (a lease's budget)")
    parser.add_argument("--work", type=Path, help="keyframes and runs.jsonl (default: "
                        "<out>/fidelity-matrix-work)")
    parser.add_argument("--deltas", type=int, help="delta checkpoints per arm (default 10; a "
                        "smoke test of the harness only)")
    parser.add_argument("--prefix", type=int, help="lossless steps before the keyframe "
                        "(default: the setup's; a smoke test of the harness only)")
    parser.add_argument("--every", type=int, help="steps between checkpoints (likewise)")
    parser.add_argument("--arms", help="comma-separated: only these arms (default: all)")
    parser.add_argument("--arm-major", action="store_true", help="with --arms: run each arm at "
                        "all its seeds before the next, in the order named (the seeds of an "
                        "arm then run side by side on --workers)")
    parser.add_argument("--report-only", action="store_true", help="re-render from runs.jsonl")
    parser.add_argument("--keyframes-only", action="store_true", help="train the setups' "
                        "prefixes and write their keyframes (and metadata) into --work, then stop")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the md/json go")
    parser.add_argument("--png-out", type=Path, help="where the PNGs go (default: --out)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = args.seeds or (2 if args.quick else 3)
    sweep_seeds = args.sweep_seeds if args.sweep_seeds is not None else 1 if args.quick else seeds
    names = [QUICK.name] if args.quick else [n for n in args.setups.split(",") if n]
    unknown = [n for n in names if n not in SETUPS and n not in GPU_SETUPS and not args.quick]
    if unknown:
        parser.error(f"unknown setups {unknown}")
    if any(n in GPU_SETUPS for n in names) and not args.report_only and not torch.cuda.is_available():
        parser.error(f"{', '.join(n for n in names if n in GPU_SETUPS)} trains on a GPU, and this "
                     "machine has no CUDA device: run it on a GPU host, or pick CPU setups")
    shape = {k: v for k, v in (("prefix", args.prefix), ("every", args.every),
                               ("deltas", args.deltas)) if v}
    setups = [setup_named(n, args.quick, shape) for n in names]
    work = args.work or args.out / "fidelity-matrix-work"
    work.mkdir(parents=True, exist_ok=True)
    stop_at = None
    if args.stop_at:
        hour, minute = (int(x) for x in args.stop_at.split(":"))
        stop_at = datetime.now(timezone.utc).replace(hour=hour, minute=minute, second=0)
    if args.stop_after:
        stop_at = datetime.fromtimestamp(time.time() + args.stop_after, timezone.utc)
    if args.arm_major and not args.arms:
        parser.error("--arm-major orders the arms that --arms names: name them")
    if args.keyframes_only:
        make_keyframes(names, seeds, work, args.workers, args.quick, shape or None, sys.stderr)
        return
    jobs = jobs_for(names, seeds, sweep_seeds, args.quick,
                    args.arms.split(",") if args.arms else None, args.arm_major)
    info = machine_info()
    if not args.report_only:
        run_matrix(jobs, work, args.workers, args.quick, shape or None, stop_at, sys.stderr)
    report(jobs, work, args.out, args.png_out or args.out, setups, info, seeds, sweep_seeds)


if __name__ == "__main__":
    main()
