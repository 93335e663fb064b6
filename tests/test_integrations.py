"""The framework adapters, each with a tiny model for a few steps on CPU (skipped where the
framework is not installed: ``pip install -e ".[examples]"``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip

from .tiny_trainer import tiny_gpt_trainer


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- Hugging Face transformers ---------------------------------------------------------------
def hf_trainer(output_dir: Path, max_steps: int) -> Any:
    pytest.importorskip("transformers")
    return tiny_gpt_trainer(str(output_dir), max_steps=max_steps, save_total_limit=2)


def test_hf_trainer_checkpoints_are_ckz_rotate_and_resume(tmp_path: Path) -> None:
    full = hf_trainer(tmp_path, 6)
    full.train()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2
    files = set(os.listdir(tmp_path / "checkpoint-4"))
    assert {"model.ckz", "optimizer.ckz", "scheduler.ckz", "rng_state.ckz"} <= files
    assert not files & {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"}
    resumed = hf_trainer(tmp_path, 6)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert resumed.state.global_step == 6
    assert same_weights(full.model.state_dict(), resumed.model.state_dict())
    latest = hf_trainer(tmp_path, 6)
    latest.train(resume_from_checkpoint=True)  # the newest, checkpoint-6: nothing left to train
    assert same_weights(full.model.state_dict(), latest.model.state_dict())


def base_of(path: Path) -> str | None:
    with ckptzip.open(path) as checkpoint:
        ref = checkpoint.header.base
    return None if ref is None else ref.path


def test_hf_trainer_deltas_resume_bit_for_bit_and_rotation_keeps_their_chains(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    options = {"ckptzip_keyframe_every": 3}  # lossless deltas: 2 keyframe, 4 -> 2, 6 -> 4, 8 keyframe, ...
    full = tiny_gpt_trainer(str(tmp_path), options, max_steps=12, save_total_limit=2)
    full.train()
    # the newest two, and checkpoint-8, the keyframe checkpoint-12's chain needs
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", "checkpoint-12", "checkpoint-8"]
    files = set(os.listdir(tmp_path / "checkpoint-10"))
    assert {"state.ckz", "scheduler.ckz", "rng_state.ckz"} <= files
    assert not files & {"model.ckz", "optimizer.ckz", "model.safetensors", "optimizer.pt"}
    assert [base_of(tmp_path / f"checkpoint-{n}" / "state.ckz") for n in (8, 10, 12)] == [
        None, "../checkpoint-8/state.ckz", "../checkpoint-10/state.ckz"]
    resumed = tiny_gpt_trainer(str(tmp_path), options, max_steps=12, save_total_limit=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-8"))
    assert same_weights(full.model.state_dict(), resumed.model.state_dict())


def test_hf_trainer_resumed_from_an_older_checkpoint_drops_the_deltas_it_writes_over(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Resumed from checkpoint-4 of a run that went on to 10, the run saves checkpoint-6 anew;
    the old 8 and 10 were deltas through the old 6 and would no longer load (and
    resume_from_checkpoint=True would pick 10): they go, with a log line each, newest first."""
    pytest.importorskip("transformers")
    options = {"ckptzip_keyframe_every": None}  # deltas only: 2 <- 4 <- 6 <- 8 <- 10
    tiny_gpt_trainer(str(tmp_path), options, max_steps=10).train()
    assert base_of(tmp_path / "checkpoint-10" / "state.ckz") == "../checkpoint-8/state.ckz"
    with caplog.at_level("WARNING", logger="ckptzip"):
        tiny_gpt_trainer(str(tmp_path), options, max_steps=6).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    dropped = [r.getMessage() for r in caplog.records if "delta chain goes through" in r.getMessage()]
    assert [m.split(":")[1].strip().rsplit("/", 1)[-1] for m in dropped] == ["checkpoint-10", "checkpoint-8"]
    for step in (2, 4, 6):  # every checkpoint left loads
        assert ckptzip.load(tmp_path / f"checkpoint-{step}" / "state.ckz").keys() == {"model", "optimizer"}


def test_hf_trainer_deltas_refuse_a_hub_upload_of_the_last_folder_alone(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    hub = {"push_to_hub": True, "hub_model_id": "nobody/nothing", "max_steps": 1}
    with pytest.raises(ckptzip.ConfigError, match="all_checkpoints"):  # before any upload is tried
        tiny_gpt_trainer(str(tmp_path), {"ckptzip_mode": "adaptive"}, hub_strategy="checkpoint", **hub)


def test_a_bad_mode_or_option_fails_at_construction_not_at_the_first_checkpoint(
        tmp_path: Path) -> None:
    """A misspelt mode or mode option ran the training to its first checkpoint, then failed
    there, leaving a partial checkpoint folder (session 39's hunt)."""
    pytest.importorskip("transformers")
    for options in ({"ckptzip_mode": "adaptve"},
                    {"ckptzip_mode": "adaptive", "ckptzip_options": {"error_budgt": 0.1}}):
        with pytest.raises(ckptzip.ConfigError, match=r"unknown mode|bad options"):
            tiny_gpt_trainer(str(tmp_path), options, max_steps=2)
    assert not any(tmp_path.iterdir())
    pytest.importorskip("lightning")
    from ckptzip.integrations.lightning import CkptzipCheckpointIO

    with pytest.raises(ckptzip.ConfigError, match="bad options"):
        CkptzipCheckpointIO(bogus=1)


def test_hf_trainer_keeps_the_best_checkpoints_chain_at_the_end(tmp_path: Path) -> None:
    """Under save_total_limit=1 the Trainer deletes every checkpoint but the best when training
    ends; with deltas the best one's chain stays, and loads."""
    pytest.importorskip("transformers")
    held = [{"input_ids": x, "labels": x}
            for x in torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(5))]
    trainer = tiny_gpt_trainer(
        str(tmp_path), {"ckptzip_mode": "adaptive", "eval_dataset": held}, max_steps=10,
        save_total_limit=1, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
        metric_for_best_model="loss")
    trainer.train()
    best = Path(trainer.state.best_model_checkpoint)
    chain = [best.name]
    while (base := base_of(tmp_path / chain[-1] / "state.ckz")) is not None:
        chain.append(Path(base).parent.name)
    assert len(chain) > 1 and sorted(os.listdir(tmp_path)) == sorted(chain)  # nothing else
    decoded = ckptzip.load(best / "state.ckz")["model"]
    assert all(torch.equal(decoded[k], v) for k, v in trainer.model.state_dict().items())


def test_hf_trainer_lossy_mode_writes_deltas_marked_resumed_after_a_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    import ckptzip.integrations.hf as hf

    saves: list[tuple[str, str, bool]] = []

    def recording_save(state: Any, path: str, **options: Any) -> Any:
        if Path(path).name == "state.ckz":
            saves.append((Path(path).parent.name, options["mode"], options["resumed"]))
        return ckptzip.save(state, path, **options)

    monkeypatch.setattr(hf, "save", recording_save)
    full = tiny_gpt_trainer(str(tmp_path), {"ckptzip_mode": "adaptive"}, max_steps=6)
    full.train()
    sizes = {n: os.path.getsize(tmp_path / f"checkpoint-{n}" / "state.ckz") for n in (2, 4, 6)}
    assert base_of(tmp_path / "checkpoint-2" / "state.ckz") is None
    assert base_of(tmp_path / "checkpoint-6" / "state.ckz") == "../checkpoint-4/state.ckz"
    assert sizes[4] * 3 < sizes[2] and sizes[6] * 3 < sizes[2]  # lossy deltas against a keyframe
    # resumed from checkpoint-4 as decoded: its first delta says so, the next does not
    saves.clear()
    resumed = tiny_gpt_trainer(str(tmp_path), {"ckptzip_mode": "adaptive"}, max_steps=8)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert saves == [("checkpoint-6", "adaptive", True), ("checkpoint-8", "adaptive", False)]
    decoded = ckptzip.load(tmp_path / "checkpoint-8" / "state.ckz")
    assert decoded.keys() == {"model", "optimizer"} and resumed.state.global_step == 8


def test_hf_trainer_holds_the_newest_state_decoded_and_writes_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the newest state.ckz held as decoded (after a save, and after a resume), a delta's
    save reads no earlier checkpoint's file; every file is the same bytes as without it."""
    pytest.importorskip("transformers")
    import ckptzip.integrations.hf as hf
    from ckptzip.reader import CheckpointFile

    saving: list[str] = []
    reads: list[tuple[str, str]] = []
    read_leaves = CheckpointFile.read_leaves

    def recording_save(state: Any, path: str, **options: Any) -> Any:
        saving[:] = [str(Path(path).parent.name)] if Path(path).name == "state.ckz" else []
        return ckptzip.save(state, path, **options)

    def recording_read(file: CheckpointFile, *args: Any, **kwargs: Any) -> Any:
        if saving and Path(file.name).name == "state.ckz":
            reads.append((saving[0], Path(file.name).parent.name))
        return read_leaves(file, *args, **kwargs)

    monkeypatch.setattr(hf, "save", recording_save)
    monkeypatch.setattr(CheckpointFile, "read_leaves", recording_read)
    files = {}
    for cache in (False, True):
        reads.clear()
        options = {"ckptzip_mode": "adaptive", "ckptzip_keyframe_every": None,
                   "ckptzip_cache_decoded": cache}
        directory = tmp_path / str(cache)
        tiny_gpt_trainer(str(directory), options, max_steps=8).train()
        resumed = tiny_gpt_trainer(str(directory / "resumed"), options, max_steps=8)
        resumed.args.output_dir = str(directory)
        saving.clear()
        resumed.train(resume_from_checkpoint=str(directory / "checkpoint-4"))
        others = [(saved, read) for saved, read in reads if saved != read]
        assert (others == []) == cache, others  # without it, each delta decodes its chain
        files[cache] = {n: (directory / f"checkpoint-{n}" / "state.ckz").read_bytes()
                        for n in (2, 4, 6, 8)}
    assert files[True] == files[False]


def test_hf_trainer_refuses_a_lossy_mode_where_it_writes_no_file_itself(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from ckptzip.integrations.hf import CkptzipTrainerMixin

    class Sharded(CkptzipTrainerMixin, transformers.Trainer):  # as under DeepSpeed, FSDP, XLA
        def _ckptzip_applies(self) -> bool:
            return False

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16,
                                                                 vocab_size=64, n_positions=16))
    args = transformers.TrainingArguments(str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(ckptzip.ConfigError, match="under DeepSpeed, FSDP"):
        Sharded(model=model, args=args, ckptzip_mode="excp")
    assert Sharded(model=model, args=args).ckptzip_mode == "lossless"


# -- Accelerate ------------------------------------------------------------------------------
def test_accelerate_hooks_write_and_read_model_ckz(tmp_path: Path) -> None:
    accelerate = pytest.importorskip("accelerate")
    from ckptzip.integrations.accelerate import register

    def prepared(seed: int) -> tuple[Any, torch.nn.Module]:
        accelerator = accelerate.Accelerator(cpu=True)
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 4)
        optimizer = torch.optim.AdamW(model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)
        register(accelerator)
        return accelerator, model

    accelerator, model = prepared(0)
    accelerator.save_state(str(tmp_path))
    assert (tmp_path / "model.ckz").exists() and not (tmp_path / "model.safetensors").exists()
    other_accelerator, other = prepared(1)
    assert not same_weights(model.state_dict(), other.state_dict())
    other_accelerator.load_state(str(tmp_path))
    assert same_weights(model.state_dict(), other.state_dict())


# -- Lightning -------------------------------------------------------------------------------
def lightning_fit(root: Path, max_steps: int, *, use_async: bool, ckpt_path: str | None = None) -> Any:
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from torch.utils.data import DataLoader, TensorDataset

    from ckptzip.integrations.lightning import CkptzipCheckpointIO

    class Regression(lightning.LightningModule):
        def __init__(self, width: int = 8, lr: float = 1e-2) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Linear(width, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2)}

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 8), torch.randn(16, 1))  # 2 steps per epoch
    plugin = CkptzipCheckpointIO()
    trainer = lightning.Trainer(
        max_steps=max_steps, default_root_dir=root, logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
        plugins=[AsyncCheckpointIO(plugin) if use_async else plugin],
        callbacks=[ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=2, monitor="step",
                                   mode="max")],
    )
    module = Regression()
    trainer.fit(module, DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize("use_async", [False, True])
def test_lightning_plugin_saves_prunes_and_resumes(tmp_path: Path, use_async: bool) -> None:
    full = lightning_fit(tmp_path, 6, use_async=use_async)
    names = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert names == ["epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]  # save_top_k=2 removed step 2
    with ckptzip.open(tmp_path / names[0]) as checkpoint:
        assert checkpoint.load()["global_step"] == 4
    resumed = lightning_fit(tmp_path / "again", 6, use_async=use_async, ckpt_path=str(tmp_path / names[0]))
    assert same_weights(full.state_dict(), resumed.state_dict())


def lightning_deltas_fit(root: Path | str, max_steps: int, mode: str, *,
                         ckpt_path: str | None = None, storage_options: Any = None,
                         workdir: Path | None = None) -> Any:
    """A 64-wide MLP (lossy modes code tensors of 16 elements and more) fitted with
    CkptzipCheckpoint every 2 steps into ``root`` (a bucket prefix with ``storage_options``,
    Lightning's own directory then ``workdir``), resumed from ``ckpt_path``."""
    lightning = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    from ckptzip.integrations.lightning import CkptzipCheckpoint, CkptzipCheckpointIO

    class Regression(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                           torch.nn.Linear(64, 1))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 64), torch.randn(32, 1))  # 4 steps an epoch
    callback = CkptzipCheckpoint(root, every_n_train_steps=2, mode=mode, async_save=True,
                                 storage_options=storage_options)
    trainer = lightning.Trainer(
        max_steps=max_steps, default_root_dir=workdir or root, logger=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        enable_checkpointing=False, plugins=[CkptzipCheckpointIO(storage_options=storage_options)],
        callbacks=[callback])
    module = Regression()
    trainer.fit(module, DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    assert callback.manager is None  # closed at teardown
    return module


def record_resumed_flags(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool | None]]:
    """The (step, resumed) of every CheckpointManager.save from here on, in order."""
    from ckptzip.manager import CheckpointManager

    flags: list[tuple[int, bool | None]] = []
    real_save = CheckpointManager.save

    def recording_save(manager: Any, step: int, state: Any, **options: Any) -> None:
        flags.append((step, options.get("resumed")))
        real_save(manager, step, state, **options)

    monkeypatch.setattr(CheckpointManager, "save", recording_save)
    return flags


@pytest.mark.parametrize("mode", ["lossless", "adaptive"])
def test_lightning_callback_writes_deltas_and_resumes(
        tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CkptzipCheckpoint: a chain of deltas in a CheckpointManager directory, resumed through
    the plugin (bit for bit, lossless), the first delta after a resume saved as resumed."""
    pytest.importorskip("lightning")
    from ckptzip.integrations.lightning import CkptzipCheckpoint

    resumed_flags = record_resumed_flags(monkeypatch)
    assert CkptzipCheckpoint.latest(tmp_path / "run") is None
    full = lightning_deltas_fit(tmp_path / "run", 8, mode)
    names = sorted(p.name for p in (tmp_path / "run").glob("step-*.ckz"))
    assert names == [f"step-{n:08d}.ckz" for n in (2, 4, 6, 8)]
    for name, depth in zip(names, range(4)):
        with ckptzip.open(tmp_path / "run" / name) as checkpoint:
            assert checkpoint.chain_depth == depth and checkpoint.mode == mode
            if depth:
                assert checkpoint.load()["global_step"] == 2 * (depth + 1)
    latest = CkptzipCheckpoint.latest(tmp_path / "run")
    assert latest is not None and latest.endswith(names[-1])
    resumed_flags.clear()
    again = lightning_deltas_fit(tmp_path / "run", 8, mode,
                                 ckpt_path=str(tmp_path / "run" / names[1]))  # step 4
    assert resumed_flags == [(6, True), (8, None)]
    if mode == "lossless":
        assert same_weights(full.state_dict(), again.state_dict())
    else:  # the deltas are lossy: a small way off (AdamW at lr 1e-3 moves a weight up to 4e-3
        # in these 4 steps), not far
        for key, value in full.state_dict().items():
            assert (again.state_dict()[key] - value).abs().mean() < 4e-3, key
    with pytest.raises(ckptzip.ConfigError, match="every_n_train_steps"):
        CkptzipCheckpoint(tmp_path, every_n_train_steps=0)
    sharded = types.SimpleNamespace(strategy=object(), is_global_zero=True)  # FSDP, DeepSpeed
    with pytest.raises(ckptzip.ConfigError, match="CompressedWriter"):
        CkptzipCheckpoint(tmp_path, every_n_train_steps=2).setup(sharded, None, "fit")


def test_lightning_callback_on_a_bucket_prefix_resumes_from_latest(
        s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket prefix as ``dirpath`` (docs/INTEGRATIONS.md): ``latest()`` returned None there
    (it asked ``os.path.isdir``), so a restarted run trained from scratch and wrote over the
    chain. It names the newest step's URL now, the plugin reads it with its storage_options, the
    resumed flag is set as on a directory, and a lossless resume ends bit for bit."""
    pytest.importorskip("lightning")
    from ckptzip.integrations.lightning import CkptzipCheckpoint, CkptzipCheckpointIO

    resumed_flags = record_resumed_flags(monkeypatch)
    monkeypatch.chdir(tmp_path)
    bucket, options = s3_server.bucket(), s3_server.storage_options()
    prefix = f"s3://{bucket}/run"
    assert CkptzipCheckpoint.latest(prefix, storage_options=options) is None
    full = lightning_deltas_fit(prefix, 8, "lossless", storage_options=options, workdir=tmp_path)
    names = [f"step-{n:08d}.ckz" for n in (2, 4, 6, 8)]
    assert sorted(p.rsplit("/", 1)[-1] for p in s3_server.filesystem().ls(f"{bucket}/run")) == names
    assert CkptzipCheckpoint.latest(prefix, storage_options=options) == f"{prefix}/{names[-1]}"
    resumed_flags.clear()
    again = lightning_deltas_fit(prefix, 8, "lossless", storage_options=options, workdir=tmp_path,
                                 ckpt_path=f"{prefix}/{names[1]}")  # step 4
    assert resumed_flags == [(6, True), (8, None)]
    assert same_weights(full.state_dict(), again.state_dict())
    assert os.listdir(tmp_path) == []  # nothing local: no directory named "s3:"

    plugin = CkptzipCheckpointIO(storage_options=options)  # Lightning's own files, in the bucket
    path = f"s3://{bucket}/plain/epoch=0-step=2.ckpt"
    plugin.save_checkpoint({"w": torch.arange(3.0)}, path)
    assert torch.equal(plugin.load_checkpoint(path)["w"], torch.arange(3.0))
    plugin.remove_checkpoint(path)
    assert not s3_server.filesystem().exists(path[len("s3://"):])


def test_lightning_callback_under_ddp_on_two_ranks(tmp_path: Path) -> None:
    """Under DDP (2 ranks, gloo) rank 0 writes the chain (one manager holds the directory), and
    a run resumed from step 4 ends bit for bit where the uninterrupted one did (lossless)."""
    pytest.importorskip("lightning")
    from .test_dcp import torchrun

    output = torchrun(2, str(tmp_path), "lossless",
                      worker=Path(__file__).with_name("lightning_ddp_worker.py"))
    assert sorted(re.findall(r"ok (\d)", output)) == ["0", "1"]
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*.ckz")) == [
        f"step-{n:08d}.ckz" for n in (2, 4, 6)]
    with ckptzip.open(tmp_path / "run" / "step-00000006.ckz") as last:
        assert last.chain_depth == 2 and last.load()["global_step"] == 6
    full, again = (torch.load(tmp_path / f"{run}.pt") for run in ("full", "again"))
    assert same_weights(full, again)


def test_lightning_removal_asked_while_the_save_runs_is_carried_out_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under AsyncCheckpointIO, ModelCheckpoint may prune a checkpoint whose save still runs in
    the background; the atomic write makes its file appear only at the end, so the plugin
    removes it then instead of missing it (a leftover checkpoint save_top_k meant to delete)."""
    pytest.importorskip("lightning")
    import threading

    from ckptzip.integrations import lightning as plugin_module

    started, release = threading.Event(), threading.Event()
    real_save = plugin_module.save

    def slow_save(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(30)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(plugin_module, "save", slow_save)
    plugin = plugin_module.CkptzipCheckpointIO()
    path = tmp_path / "epoch=0-step=2.ckpt"
    saver = threading.Thread(target=plugin.save_checkpoint, args=({"w": torch.ones(3)}, path))
    saver.start()
    assert started.wait(30)
    plugin.remove_checkpoint(path)  # asked while the save runs: nothing there yet
    release.set()
    saver.join(30)
    assert not path.exists()
    kept = tmp_path / "epoch=1-step=4.ckpt"
    plugin.save_checkpoint({"w": torch.ones(3)}, kept)  # no removal asked: it stays
    assert kept.exists()
    plugin.remove_checkpoint(kept)
    assert not kept.exists()


# -- DeepSpeed -------------------------------------------------------------------------------
@pytest.mark.parametrize(("stage", "dtype"), [(0, "fp32"), (1, "fp32"), (2, "bf16"), (3, "bf16")])
def test_deepspeed_zero_saves_loads_and_resumes_on_two_ranks(tmp_path: Path, stage: int,
                                                             dtype: str) -> None:
    pytest.importorskip("deepspeed")
    from .test_dcp import torchrun

    output = torchrun(2, str(tmp_path), str(stage), dtype,
                      worker=Path(__file__).with_name("deepspeed_worker.py"))
    assert sorted(re.findall(r"ok (\d)", output)) == ["0", "1"]  # the ranks' lines may interleave
    files = sorted((tmp_path / "global_step5").iterdir())
    # stage 0 writes the whole model and optimizer once; ZeRO, each rank's partition of the
    # optimizer (and under stage 3 of the model)
    assert len(files) == (1 if stage == 0 else 3 if stage < 3 else 4), files
    for path in files:
        with ckptzip.open(path) as checkpoint:  # every file is a ckptzip container
            assert checkpoint.leaves
    if not stage:
        return
    from ckptzip.integrations.deepspeed import OBJECT_TAG, main

    # ckptzip.load alone gives DeepSpeed's objects as tagged dicts of their attributes
    optimizer = ckptzip.load(next(p for p in files if "optim_states" in p.name))
    scaler = optimizer["optimizer_state_dict"]["loss_scaler"]
    assert scaler[OBJECT_TAG].endswith(".LossScaler") and scaler["attributes"]["cur_scale"] == 1.0

    # exported as DeepSpeed writes it, the folder is what DeepSpeed's zero_to_fp32 reads
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    assert main([str(tmp_path), str(tmp_path / "torch")]) == 0
    assert (tmp_path / "torch" / "latest").read_text() == "global_step5"
    consolidated = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "torch"))
    reference = torch.load(tmp_path / "reference.pt")
    assert consolidated.keys() == reference.keys()
    for name, weight in reference.items():  # bf16 weights: the fp32 master weights rounded
        assert torch.equal(consolidated[name].to(weight.dtype), weight), name


def test_hf_trainer_under_deepspeed_writes_the_engine_files_through_ckptzip(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    from .test_dcp import torchrun

    output = torchrun(1, "hf", str(tmp_path), worker=Path(__file__).with_name("deepspeed_worker.py"))
    assert re.findall(r"ok (\d)", output) == ["0"]
    assert "checkpoint-4/global_step4/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt" in output


def test_accelerate_under_deepspeed_writes_the_engine_files_through_ckptzip(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    pytest.importorskip("accelerate")
    from .test_dcp import torchrun

    output = torchrun(1, "accelerate", str(tmp_path),
                      worker=Path(__file__).with_name("deepspeed_worker.py"))
    assert re.findall(r"ok (\d)", output) == ["0"]
    assert "pytorch_model/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt" in output


def test_deepspeed_objects_round_trip_and_nothing_else_is_built(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from ckptzip.integrations.deepspeed import OBJECT_TAG, CkptzipCheckpointEngine, from_plain

    scaler = DynamicLossScaler(init_scale=2.0**12, scale_window=100, min_scale=1.0,
                               delayed_shift=2, consecutive_hysteresis=False, dtype=torch.bfloat16)
    scaler.cur_iter = 7
    state = {"optimizer_state_dict": {
        "loss_scaler": scaler, "zero_stage": ZeroStageEnum.gradients,
        "param_slice_mappings": [{"w": fragment_address(numel=6, start=0)}],
        "exp_avg": torch.arange(6.0)}}
    engine = CkptzipCheckpointEngine()
    engine.save(state, str(tmp_path / "optim.pt"))
    assert state["optimizer_state_dict"]["loss_scaler"] is scaler  # the caller's state as it was
    loaded = engine.load(str(tmp_path / "optim.pt"))["optimizer_state_dict"]
    assert type(loaded["loss_scaler"]) is DynamicLossScaler and vars(loaded["loss_scaler"]) == vars(scaler)
    assert loaded["zero_stage"] is ZeroStageEnum.gradients
    assert loaded["param_slice_mappings"] == [{"w": fragment_address(numel=6, start=0)}]
    assert torch.equal(loaded["exp_avg"], torch.arange(6.0))

    # a file cannot name another class, nor a value the enum does not have
    for tagged, match in [({OBJECT_TAG: "os.system", "attributes": {}}, "does not rebuild"),
                          ({OBJECT_TAG: "builtins.dict", "attributes": {}}, "does not rebuild"),
                          ({OBJECT_TAG: "deepspeed.runtime.zero.config.ZeroStageEnum", "value": 9},
                           "not a value"),
                          ({OBJECT_TAG: "deepspeed.utils.tensor_fragment.fragment_address",
                            "attributes": [1, 2]}, "damaged")]:
        with pytest.raises(ckptzip.FormatError, match=match) as raised:
            from_plain({"optimizer_state_dict": {"x": [tagged]}})
        assert "optimizer_state_dict.x[0]" in str(raised.value)
    with pytest.raises(ckptzip.UnsupportedError, match=r"optimizer_state_dict\.odd"):
        engine.save({"optimizer_state_dict": {"odd": {1, 2}}}, str(tmp_path / "odd.pt"))

    # a file of DeepSpeed's own engine (a run that took ckptzip on midway) is read as DeepSpeed reads it
    torch.save({"module": {"w": torch.ones(2)}, "loss_scaler": scaler}, tmp_path / "plain.pt")
    plain = engine.load(str(tmp_path / "plain.pt"), map_location=lambda storage, loc: storage)
    assert vars(plain["loss_scaler"]) == vars(scaler) and torch.equal(plain["module"]["w"], torch.ones(2))


def test_deepspeed_engine_methods_directly(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from ckptzip.integrations.deepspeed import CkptzipCheckpointEngine

    engine = CkptzipCheckpointEngine()
    state = {"module": {"w": torch.arange(6.0)}, "global_steps": 3, "ds_version": "x"}
    engine.create(None)
    engine.save(state, str(tmp_path / "states.pt"))
    assert engine.commit(None) is True
    loaded = engine.load(str(tmp_path / "states.pt"), map_location=lambda storage, loc: storage)
    assert torch.equal(loaded["module"]["w"], state["module"]["w"]) and loaded["global_steps"] == 3


def test_import_ckptzip_needs_no_framework() -> None:
    frameworks = "{'transformers', 'lightning', 'accelerate', 'deepspeed'}"
    code = f"import sys, ckptzip; assert not {frameworks} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("framework", ["hf", "accelerate", "lightning", "deepspeed"])
def test_a_lossy_mode_is_refused_where_every_file_is_standalone(tmp_path: Path, framework: str) -> None:
    """Without a base a lossy mode writes lossless keyframes: asking for one there is a mistake
    to name at once, not a ratio to discover later."""
    if framework == "hf":
        pytest.importorskip("transformers")

        def make(mode: str) -> Any:
            return tiny_gpt_trainer(str(tmp_path), {"ckptzip_mode": mode, "ckptzip_keyframe_every": 1},
                                    max_steps=1)
    elif framework == "accelerate":
        accelerate = pytest.importorskip("accelerate")
        from ckptzip.integrations.accelerate import register

        def make(mode: str) -> Any:
            return register(accelerate.Accelerator(cpu=True), mode=mode)
    elif framework == "lightning":
        pytest.importorskip("lightning")
        from ckptzip.integrations.lightning import CkptzipCheckpointIO

        def make(mode: str) -> Any:
            return CkptzipCheckpointIO(mode=mode)
    else:
        pytest.importorskip("deepspeed")
        from ckptzip.integrations.deepspeed import CkptzipCheckpointEngine

        def make(mode: str) -> Any:
            return CkptzipCheckpointEngine(mode=mode)
    for mode in ("adaptive", "excp", "bitsnap"):
        with pytest.raises(ckptzip.ConfigError, match=f"mode='{mode}'.*CheckpointManager"):
            make(mode)
    with pytest.raises(ckptzip.ConfigError, match="unknown mode 'lossles'"):  # not "codes deltas"
        make("lossles")
    assert make("lossless") is not None
