"""The ``ckptzip`` command line, with zstd's habits.

    ckptzip compress model.safetensors            -> model.safetensors.ckz
    ckptzip decompress model.safetensors.ckz      -> model.safetensors (the same bytes)
    ckptzip inspect run/step-100.ckz              per-tensor dtype, shape, codec, ratio
    ckptzip verify run/*.ckz                      exit 0 only if every checksum holds
    ckptzip compress --base step-100.ckz step-200.pt   a delta against an earlier checkpoint
    ckptzip flatten step-200.pt.ckz               rewrite a delta as a standalone keyframe
    ckptzip bench model.safetensors               ckptzip vs zstd, blosc2, zipnn on the same bytes
    ckptzip demo                                  train a small GPT with compressed checkpoints

zstd-style shortcuts: ``ckptzip FILE`` compresses, ``-d`` decompresses, ``-l`` lists, ``-t`` tests.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from .allocator import tune_malloc
from .chain import base_exists, relative_location, resolve_relative, same_file
from .container import LeafInfo, added_leaves
from .errors import BaseMismatchError, Error
from .modes.adaptive import DEFAULT_BUDGET, RESTART_EXP_AVG_BUDGET, STEP_EXP_AVG_BUDGET
from .objstore import ObjectStore, StorageOptions
from .parallel import resolve_threads
from .reader import CheckpointFile, open_base, refuse_writing_over_chain
from .sinks import open_sink
from .sources import (
    TORCH_SUFFIXES,
    read_source,
    write_directory,
    write_safetensors,
    write_torch,
)
from .storage import exists, is_url, local_path
from .writer import encode_state

SUFFIX = ".ckz"
COMMANDS = ("compress", "decompress", "inspect", "verify", "flatten", "bench", "demo")
SHORTCUTS = {"-d": "decompress", "--decompress": "decompress", "-l": "inspect", "--list": "inspect",
             "-t": "verify", "--test": "verify"}

EPILOG = """shortcuts, as zstd's: ckptzip FILE (compress), -d FILE (decompress), -l FILE (inspect),
-t FILE (verify).

Several SRCs are each done in turn; one that fails is reported and the others still run (exit
status 1). An output never overwrites its input, its --base or an existing file (without -f),
and never lands inside a SRC directory; it keeps SRC's permission bits. decompress --rm keeps a
SRC that a delta left compressed (beside it, or a SRC that failed) is still coded against.

examples:
  ckptzip compress model.safetensors               writes model.safetensors.ckz
  ckptzip compress -T 8 checkpoint-500/            a Hugging Face checkpoint directory
  ckptzip decompress model.safetensors.ckz         the original file, bit for bit
  ckptzip decompress step.ckz --to pt -o step.pt   as a torch.save file
  ckptzip inspect step.ckz                         what each tensor gained
  ckptzip verify *.ckz && echo all good            checksums and tree; exit status 1 on damage
  ckptzip compress --base step-100.ckz step-200.pt a delta: only what changed since step 100
  ckptzip flatten step-200.pt.ckz                  the delta rewritten as a standalone keyframe
  ckptzip bench model.safetensors                  against zstd, blosc2 and zipnn
  ckptzip compress step.pt -o s3://bucket/run/step.ckz \
      --storage-option client_kwargs.endpoint_url=http://127.0.0.1:8333
                                                   streamed to an S3 bucket (also FSSPEC_S3_* env)

Loading never runs code: .ckz holds no pickle. Inputs in torch.save format are read with
torch.load(weights_only=True).

The command sets glibc's malloc to keep and reuse the memory it frees (ckptzip.tune_malloc):
lossy saves of large tensors ran up to twice as fast for it. CKPTZIP_MALLOC=system does not.
"""


class Reporter:
    """Messages on stderr: ``info`` unless ``-q``, ``detail`` (per tensor) with ``-v``."""

    def __init__(self, verbosity: int) -> None:
        self.verbosity = verbosity

    @property
    def verbose(self) -> bool:
        return self.verbosity >= 2

    def info(self, message: str) -> None:
        if self.verbosity >= 1:
            print(message, file=sys.stderr)

    def detail(self, message: str) -> None:
        if self.verbose:
            print(message, file=sys.stderr)

    def tensors(self, ckpt: CheckpointFile) -> None:
        """With ``-v``: a line per stored tensor of ``ckpt`` (:func:`_leaf_line`)."""
        if self.verbose:
            for leaf in ckpt.leaves:
                self.detail(_leaf_line(_leaf_row(leaf)))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-T", "--threads", type=_count(0), default=0, metavar="N",
                        help="worker threads (default 0: all cores)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        dest="storage_option", type=parse_storage_option,
                        help="an option of the fsspec filesystem of URL paths (s3://...), as in "
                             "storage_options: key=..., secret=..., client_kwargs.endpoint_url=URL "
                             "(dots nest; a JSON value such as 20 or true is parsed; repeatable)")
    parser.add_argument("-q", "--quiet", action="count", default=0,
                        help="print nothing on stderr but errors (no progress, no per-file "
                             "lines); inspect and bench still print their listing")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="say more: a line per tensor (dtype, shape, raw and stored bytes, ratio, "
                             "pipeline, a lossy tensor's recorded error)")


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``, refused in the flag's words."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of {least} or more")
        return value

    return parse


def _output_options(parser: argparse.ArgumentParser, done: str) -> None:
    parser.add_argument("-f", "--force", action="store_true",
                        help="overwrite existing outputs (an -o URL is written without asking the "
                             "store first whether it exists: a write-only role needs -f)")
    parser.add_argument("--rm", action="store_true", help=f"remove each SRC after it is {done}")
    _common(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptzip",
        description="Compress PyTorch checkpoints: lossless and bit-exact by default.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"ckptzip {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("compress", help="compress .safetensors / torch.save files or HF directories",
                       description="Compress checkpoints to .ckz (bit-exact in lossless mode).")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", metavar="DST", help="output path (one SRC only; default SRC.ckz)")
    p.add_argument("--mode", default="lossless",
                   help="lossless (bit-exact), or with --base a lossy mode: excp, bitsnap, adaptive "
                        "(docs/LOSSY.md; default: lossless)")
    p.add_argument("--error-budget", metavar="E", type=parse_error_budget,
                   help="--mode adaptive: the relative error allowed, one number for all states or "
                        f"per state, e.g. {_BUDGET_TEXT}. The defaults: weight "
                        f"{DEFAULT_BUDGET['weight']:g}, exp_avg_sq {DEFAULT_BUDGET['exp_avg_sq']:g}, "
                        f"exp_avg {STEP_EXP_AVG_BUDGET:g} of Adam's step m/sqrt(v) where exp_avg_sq "
                        f"is kept beside it, else {DEFAULT_BUDGET['exp_avg']:g} of the moment "
                        f"({RESTART_EXP_AVG_BUDGET:g} where both moments restart); an exp_avg given "
                        "applies to every one. Each bounds the error as decoded; the weights' is "
                        "relative to the update training made since the base, below 2; 0 keeps a "
                        "state bit-exact")
    p.add_argument("--resumed", action="store_true",
                   help="lossy modes: the state was trained from B as decoded (training resumed "
                        "from a load of it), not from the true state B was saved from; leave it "
                        "off when unsure (a larger file, never a growing error)")
    p.add_argument("--scope", choices=("floats", "optimized"),
                   help="lossy modes: code every float tensor outside the optimizer's state lossy "
                        "(floats, the default), or only the weights Adam's moments pair with")
    p.add_argument("--keep-exact", action="append", metavar="GLOB", default=[],
                   help="lossy modes: keep the tensors whose names match GLOB bit-exact (repeatable; "
                        "names as `ckptzip inspect` lists them, e.g. 'model.ema.*')")
    p.add_argument("--base", metavar="B",
                   help="an earlier .ckz to code against: an incremental checkpoint, bit-exact, "
                        "that needs B (found beside it) to load")
    p.add_argument("--keyframe-every", type=_count(1), metavar="K",
                   help="with --base: write a standalone keyframe instead when B already heads a "
                        "chain of K-1 deltas")
    _output_options(p, "compressed")

    p = sub.add_parser("decompress", help="restore .ckz to safetensors, torch.save or a directory",
                       description="Restore a .ckz. By default it becomes what it was compressed "
                                   "from; --to picks a format.")
    p.add_argument("sources", nargs="+", metavar="SRC.ckz")
    p.add_argument("-o", "--output", metavar="DST", help="output path (one SRC only)")
    p.add_argument("--to", choices=("safetensors", "pt", "dir"), help="output format")
    p.add_argument("--base", metavar="B", help="the base of a delta, if not beside it")
    _output_options(p, "restored")

    p = sub.add_parser("inspect", help="list tensors: dtype, shape, codec, ratio; then totals")
    p.add_argument("sources", nargs="+", metavar="SRC.ckz")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _common(p)

    p = sub.add_parser("verify", help="check every checksum and the tree a load builds; exit "
                                      "status 0 only if all hold")
    p.add_argument("sources", nargs="+", metavar="SRC.ckz")
    p.add_argument("--base", metavar="B", help="the base of a delta, if not beside it")
    _common(p)

    p = sub.add_parser("flatten", help="rewrite a delta checkpoint as a standalone keyframe",
                       description="Load a delta with its whole chain of bases and write it "
                                   "standalone (in place unless -o), so that it no longer needs them.")
    p.add_argument("sources", nargs="+", metavar="SRC.ckz")
    p.add_argument("-o", "--output", metavar="DST", help="output path (one SRC only)")
    p.add_argument("-f", "--force", action="store_true",
                   help="overwrite an existing -o DST; flatten in place although deltas beside "
                        "SRC are coded against it (they will no longer load)")
    p.add_argument("--base", metavar="B", help="the base of the delta, if not beside it")
    _common(p)

    p = sub.add_parser("bench", help="ckptzip against zstd, blosc2 and zipnn on the same bytes")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--repeat", type=int, default=3, help="runs per tool, best is kept (default 3)")
    _common(p)

    sub.add_parser("demo", help="train a small GPT on CPU with compressed checkpoints", add_help=False)
    return parser


def _normalize(argv: list[str]) -> list[str]:
    """Map zstd-style invocations (``ckptzip FILE``, ``-d``, ``-l``, ``-t``) to subcommands."""
    if not argv or argv[0] in COMMANDS or argv[0] in ("-h", "--help", "-V", "--version"):
        return argv
    for i, arg in enumerate(argv):
        if arg in SHORTCUTS:
            return [SHORTCUTS[arg], *argv[:i], *argv[i + 1 :]]
    return ["compress", *argv]


def parse_storage_option(text: str) -> tuple[list[str], Any]:
    """``client_kwargs.endpoint_url=http://host:9000``: the key's path and the value (JSON where
    it parses as JSON, else the text: quote a secret of digits as '"123"')."""
    key, sep, value = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. "
                                         f"client_kwargs.endpoint_url=http://127.0.0.1:8333")
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key.split("."), parsed


def storage_options(args: argparse.Namespace) -> StorageOptions:
    """The ``--storage-option`` pairs as the nested dict fsspec takes (None: none given)."""
    options: dict[str, Any] = {}
    for path, value in args.storage_option:
        where = options
        for part in path[:-1]:
            where = where.setdefault(part, {})
            if not isinstance(where, dict):
                raise Error(f"--storage-option {'.'.join(path)}: {part} is set to a value already")
        where[path[-1]] = value
    return options or None


def _output_for(src: str, args: argparse.Namespace, default: str) -> str:
    """Where SRC's result goes: ``-o`` or ``default``; never over SRC, inside a SRC directory,
    over the ``--base`` the result is coded against, or over an existing file without -f."""
    out = args.output or default
    if same_file(out, src):
        raise Error(f"{out}: would overwrite its input {src}; pick another -o")
    if not is_url(src) and os.path.isdir(src) and not is_url(out) and _inside(out, src):
        raise Error(f"{out}: would be written inside the directory it is made from ({src}); "
                    f"pick an -o outside it")
    base = getattr(args, "base", None)
    if base and same_file(out, base):
        raise Error(f"{out}: is the --base this checkpoint is coded against; overwriting it "
                    f"would lose both. Write the new checkpoint to another -o")
    if not args.force and _output_exists(out, args):
        raise Error(f"{out}: already exists; use -f to overwrite")
    return out


def _output_exists(out: str, args: argparse.Namespace) -> bool:
    """Whether ``out`` is there already; a store that cannot answer (unreachable, credentials
    refused, or a role that may write but not read) is an Error saying so. ``-f`` asks nothing."""
    try:
        return exists(out, storage_options(args))
    except Error:
        raise
    except Exception as exc:
        raise Error(f"{out}: cannot check whether it exists ({type(exc).__name__}: {exc}); "
                    f"nothing was written. Check the endpoint and the credentials, or pass -f "
                    f"to overwrite without the check (a role that may write but not read "
                    f"needs it)") from exc


def _permissions(src: str) -> int | None:
    """A local file SRC's permission bits, for its output (as gzip and zstd keep them: a
    private checkpoint stays private); None for a directory or a URL."""
    if is_url(src) or not os.path.isfile(src):
        return None
    return stat.S_IMODE(os.stat(src).st_mode)


def _inside(path: str, directory: str) -> bool:
    root = os.path.realpath(directory)
    return os.path.realpath(path).startswith(root.rstrip(os.sep) + os.sep)


def _one_source_for_output(args: argparse.Namespace) -> None:
    if args.output and len(args.sources) > 1:
        raise Error("-o takes one SRC only; without -o each SRC gets its own output beside it")


def _each_source(args: argparse.Namespace, work: Callable[[str], None],
                 prefix: str = "ckptzip: error: ") -> int:
    """``work`` on every SRC, as zstd does: a SRC that fails is reported (after ``prefix``)
    and the others still run; the exit status is 1 if any failed."""
    failures = 0
    for src in args.sources:
        try:
            work(src)
        except Error as exc:
            failures += 1
            print(f"{prefix}{exc}", file=sys.stderr)
    return 1 if failures else 0


def _default_compressed_name(src: str) -> str:
    """``SRC.ckz`` beside SRC; for a directory given as ``.`` or ``..`` (or with a trailing
    slash), beside the directory it names, not inside it."""
    name = os.path.normpath(src) if not is_url(src) else src.rstrip("/")
    if os.path.basename(name) in (".", ".."):
        name = os.path.abspath(name)
    return name + SUFFIX


_BUDGET_TEXT = "weight=0.75,exp_avg=0.5,exp_avg_sq=0.4"  # the form; the defaults are in --help


def parse_error_budget(text: str) -> float | dict[str, float]:
    """``0.3`` or ``weight=1.5,exp_avg=0.75``: what ``--error-budget`` accepts."""
    try:
        if "=" not in text:
            return float(text)
        budget = {}
        for item in text.split(","):
            key, value = item.split("=")
            budget[key.strip()] = float(value)
        return budget
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number (0.3) or state=number pairs "
            f"({_BUDGET_TEXT})") from None


def _local_input(src: str) -> str:
    """A SRC to read a state from: a local path (a URL was reported as a missing file)."""
    if is_url(src):
        raise Error(f"{src}: the command line reads .safetensors, torch.save files and directories "
                    f"from local paths only; copy it here first, or load it in Python and call "
                    f"ckptzip.save (outputs, --base and .ckz inputs may be URLs)")
    return src


def cmd_compress(args: argparse.Namespace, say: Reporter) -> int:
    _one_source_for_output(args)
    if args.keyframe_every is not None and not args.base:
        raise Error("--keyframe-every needs --base")
    mode_options = {}
    if args.error_budget is not None:
        if args.mode != "adaptive":
            raise Error(f"--error-budget applies to --mode adaptive, not {args.mode}")
        mode_options["error_budget"] = args.error_budget
    lossy_options = {"scope": args.scope, "keep_exact": args.keep_exact or None,
                     "resumed": args.resumed or None}
    for flag, value in lossy_options.items():
        if value is not None and args.mode == "lossless":
            raise Error(f"--{flag.replace('_', '-')} applies to the lossy modes (--mode excp, "
                        f"bitsnap, adaptive), not lossless")
    if args.scope is not None:
        mode_options["scope"] = args.scope
    if args.keep_exact:
        mode_options["keep_exact"] = args.keep_exact

    def compress(src: str) -> None:
        if src.endswith(SUFFIX):
            raise Error(f"{src}: already a .ckz; nothing to do")
        _local_input(src)
        out = _output_for(src, args, _default_compressed_name(src))
        loaded = read_source(src)
        base = open_base(args.base, threads=args.threads, storage_options=storage_options(args))
        try:
            refuse_writing_over_chain(out, base, "the new checkpoint")
            with open_sink(out, storage_options(args), _permissions(src)) as sink:
                report = encode_state(
                    loaded.state, sink, mode=args.mode, threads=args.threads, path=out,
                    progress=args.quiet == 0, source=loaded.source, base=base,
                    base_location=relative_location(args.base, out) if args.base else None,
                    keyframe_every=args.keyframe_every, mode_options=mode_options,
                    resumed=args.resumed,
                )
        finally:
            if base is not None:
                base.close()
        say.info(f"{src} -> {out}: {report.raw_bytes:,} -> {report.stored_bytes:,} bytes "
                 f"({report.ratio:.3f}x, {report.raw_bytes / 1e6 / max(report.seconds, 1e-9):.0f} MB/s)")
        if say.verbose:
            with CheckpointFile.open(out, base=args.base,
                                     storage_options=storage_options(args)) as written:
                say.tensors(written)
        if args.rm:
            _remove(src)

    return _each_source(args, compress)


def _remove(path: str, options: StorageOptions = None) -> None:
    """--rm: remove a SRC (a directory whole, ``.`` included; an object for a URL) once its
    output is written."""
    if is_url(path):
        store, key = ObjectStore.open(path, options)
        try:
            store.remove(key)
        except Exception as exc:
            raise Error(f"{path}: written, but cannot delete it ({type(exc).__name__}: {exc}); "
                        f"delete it by hand") from exc
        return
    path = os.path.abspath(path)
    try:
        if os.path.isdir(path):
            import shutil

            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError as exc:
        raise Error(f"{path}: written, but cannot remove it ({exc.strerror or exc}); remove it "
                    f"by hand") from None


FORMAT_OF_SOURCE = {"safetensors": "safetensors", "directory": "dir"}
EXTENSION = {"safetensors": ".safetensors", "pt": ".pt", "dir": ""}
#: Extensions a decompressed name may carry already; another dotted part (``run.step1``) is the
#: name's own, and stays.
KNOWN_EXTENSIONS = (".safetensors", *TORCH_SUFFIXES)


def _decompressed_name(src: str, kind: str, same_format: bool) -> str:
    """SRC without ``.ckz``; where the format changes (or the file came from Python, not from
    a file), its checkpoint extension swapped for the new one."""
    stem = src[: -len(SUFFIX)] if src.endswith(SUFFIX) else src + ".restored"
    if same_format:
        return stem
    root, extension = os.path.splitext(stem)
    if extension.lower() in KNOWN_EXTENSIONS:
        stem = root
    return stem + EXTENSION[kind]


def cmd_decompress(args: argparse.Namespace, say: Reporter) -> int:
    _one_source_for_output(args)
    restored: list[tuple[str, str]] = []  # --rm: the SRCs restored, with their ids

    def decompress(src: str) -> None:
        with CheckpointFile.open(src, threads=args.threads, base=args.base,
                                 storage_options=storage_options(args)) as ckpt:
            file_id = ckpt.id
            source = ckpt.header.source or {}
            native_format = FORMAT_OF_SOURCE.get(str(source.get("kind")), "pt")
            kind = args.to or native_format
            out = _output_for(src, args, _decompressed_name(src, kind,
                                                            kind == native_format and bool(source)))
            state = ckpt.load(progress=args.quiet == 0)
            say.tensors(ckpt)
        if kind == "safetensors":
            # asked for by name: a damaged stored layout gives way to a fresh one (said below);
            # as the file's own format, the original bytes or an error
            advice = (f"decompress {src} with --to safetensors for the same tensors in a fresh "
                      f"layout, or with --to pt")
            original = write_safetensors(state, source, out, storage_options(args), _permissions(src),
                                         if_damaged=None if args.to == "safetensors" else advice)
            if not original and source.get("kind") == "safetensors":
                say.info(f"{src}: the safetensors layout stored in it is damaged; {out} holds the "
                         f"same tensors in a fresh layout, not the original file's bytes")
        elif kind == "dir":
            write_directory(state, source, out)
        else:
            write_torch(state, out, storage_options(args), _permissions(src))
        say.info(f"{src} -> {out}")
        if args.rm and all(src != done for done, _ in restored):
            restored.append((src, file_id))

    status = _each_source(args, decompress)
    return max(status, _remove_restored(restored, args)) if args.rm else status


def _beside(src: str, options: StorageOptions = None) -> list[str]:
    """The ``.ckz`` files in the directory of a local ``src``, or the ``.ckz`` objects under
    the prefix of a URL (listed through its fsspec filesystem), sorted; ``src`` among them."""
    if is_url(src):
        folder = src.rstrip("/").rpartition("/")[0]
        store, path = ObjectStore.open(folder, options)
        try:
            names = sorted(store.listing(path))
        except Exception as exc:
            raise Error(f"{folder}: cannot list the prefix to find the deltas coded against "
                        f"{src} ({type(exc).__name__}: {exc}); check the endpoint and the "
                        f"credentials") from exc
        found = [f"{folder}/{name}" for name in names if name.endswith(SUFFIX)]
    else:
        directory = os.path.dirname(os.path.abspath(local_path(src)))
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            raise Error(f"{directory}: cannot list it to find the deltas coded against {src} "
                        f"({exc.strerror or exc})") from None
        found = [os.path.join(directory, name) for name in names
                 if name.endswith(SUFFIX) and os.path.isfile(os.path.join(directory, name))]
    return found


#: What a ``.ckz`` header says of its base: where it lies, resolved, and the id it must have;
#: None for a keyframe, a base in memory or on another host, or a file that is no checkpoint.
BaseLink = tuple[str, Any] | None


def _base_link(path: str, options: StorageOptions = None) -> BaseLink:
    """The base the header of ``path`` names; None too where it cannot be read (not a
    checkpoint that loads from any base, then) or names a base on another host."""
    try:
        with CheckpointFile.open(path, storage_options=options) as other:
            ref = other.header.base
        if ref is None or ref.path is None:
            return None
        return resolve_relative(path, ref.path), ref.id
    except Error:
        return None


def _dependents(src: str, file_id: str, options: StorageOptions = None, among: Sequence[str] = (),
                links: dict[str, BaseLink] | None = None) -> list[str]:
    """The ``.ckz`` files coded against ``src`` (their header names it as their base, by path
    and id), of those of ``among`` (spelled as there) and those beside it (in its directory, or
    for a URL under its prefix): rewriting or removing ``src`` and they would no longer load.
    ``links`` keeps the headers read, for the next call."""
    links = {} if links is None else links
    found: list[str] = []
    for path in [*among, *_beside(src, options)]:
        if path not in links:
            links[path] = _base_link(path, options)
        link = links[path]
        if (link is not None and link[1] == file_id and same_file(link[0], src)
                and not same_file(path, src) and not any(same_file(path, f) for f in found)):
            found.append(path)
    return found


def _remove_restored(restored: list[tuple[str, str]], args: argparse.Namespace) -> int:
    """``decompress --rm``, once every SRC is done: remove each SRC restored, but only once no
    ``.ckz`` coded against it remains (a SRC that failed, or a delta beside it that was not
    named): it would no longer load. Dependents go first; a SRC kept is said on stderr with
    what needs it. The exit status: 1 if a removal failed."""
    options = storage_options(args)
    links: dict[str, BaseLink] = {}
    needed_by: dict[str, list[str]] = {}  # SRC: the files coded against it (SRCs as spelled)
    for src, file_id in restored:
        try:
            needed_by[src] = _dependents(src, file_id, options, args.sources, links)
        except Error as exc:
            print(f"ckptzip: {src}: restored but not removed: cannot tell whether deltas are "
                  f"coded against it ({exc})", file=sys.stderr)
    status = 0
    removed: set[str] = set()
    pending = list(needed_by)
    while ready := [src for src in pending if removed.issuperset(needed_by[src])]:
        for src in ready:
            pending.remove(src)
            try:
                _remove(src, options)
            except Error as exc:
                status = 1
                print(f"ckptzip: error: {exc}", file=sys.stderr)
            else:
                removed.add(src)
    for src in pending:
        waiting = [path for path in needed_by[src] if path not in removed]
        names = ", ".join(map(os.path.basename, waiting[:3])) + (", ..." if len(waiting) > 3 else "")
        print(f"ckptzip: {src}: restored but not removed: {len(waiting)} delta(s) coded against "
              f"it would no longer load without it ({names}); remove it once they are restored "
              f"and removed too, or flattened (ckptzip flatten)", file=sys.stderr)
    return status


def cmd_flatten(args: argparse.Namespace, say: Reporter) -> int:
    _one_source_for_output(args)

    def flatten(src: str) -> None:
        with CheckpointFile.open(src, threads=args.threads, base=args.base,
                                 storage_options=storage_options(args)) as ckpt:
            header = ckpt.header
            if header.base is None:
                say.info(f"{src}: already a keyframe; nothing to do")
                return
            if args.output:
                out = _output_for(src, args, args.output)
                refuse_writing_over_chain(out, ckpt.base(), src)
            else:
                out = src
                dependents = [] if args.force else _dependents(src, ckpt.id,
                                                                   storage_options(args))
                if dependents:
                    raise Error(
                        f"{src}: {len(dependents)} delta(s) beside it are coded against it "
                        f"({', '.join(os.path.basename(d) for d in dependents[:3])}"
                        f"{', ...' if len(dependents) > 3 else ''}); flattened in place it gets "
                        f"another id and they would no longer load. Write it to -o NEW, flatten "
                        f"them first, or pass -f to flatten it anyway")
            state = ckpt.load(progress=args.quiet == 0)
        with open_sink(out, storage_options(args), _permissions(src)) as sink:
            report = encode_state(
                state, sink, mode=header.mode,
                threads=args.threads, metadata=header.metadata, path=out,
                progress=args.quiet == 0, source=header.source,
            )
        say.info(f"{src} -> {out}: standalone, {report.stored_bytes:,} bytes ({report.ratio:.3f}x)")

    return _each_source(args, flatten)


def chain_of(ckpt: CheckpointFile) -> list[dict[str, Any]]:
    """The bases a checkpoint needs, nearest first, as far as they can be found: up to one
    that is missing, not followed, unreadable (damaged, not a .ckz) or another file than the
    one named (an id mismatch)."""
    chain: list[dict[str, Any]] = []
    name, ref = ckpt.name, ckpt.header.base
    while ref is not None and len(chain) < 10_000:
        location = ref.path
        entry: dict[str, Any] = {"path": location, "id": ref.id}
        chain.append(entry)
        if location is None:
            entry["status"] = "in-memory state"
            break
        try:
            path = resolve_relative(name, location)
        except BaseMismatchError:
            entry["status"] = "remote, not followed (pass --base to use it)"
            break
        if not base_exists(path):
            entry["status"] = "missing"
            break
        try:
            with CheckpointFile.open(path, storage_options=ckpt.storage_options) as base:
                if base.id != ref.id:
                    entry["status"] = f"id mismatch ({base.id})"
                    break  # another file than the base: what it names says nothing of the chain
                depth, name, ref = base.chain_depth, base.name, base.header.base
        except Error as exc:  # the link is listed as broken, as a missing one is
            entry["status"] = f"unreadable: {str(exc).removeprefix(f'{path}: ')}"
            break
        entry["status"] = "ok"
        entry["depth"] = depth
    return chain


def _format_version(version: Any) -> str:
    """The header's format version, ``[1, 0]`` as ``1.0``; anything else as the JSON it is."""
    if isinstance(version, list):
        return ".".join(map(str, version))
    return json.dumps(version)


def _error_summary(error: Any) -> str:
    """A lossy tensor's recorded errors, e.g. ``mse=1.2e-09 rel=0.0031``."""
    if not isinstance(error, dict):
        return str(error)
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in error.items())


def _codec_summary(configs: list[dict[str, Any]]) -> str:
    """Stage ids with their scalar parameters (learned tables such as codebooks are left out)."""
    parts = []
    for config in configs:
        params = ",".join(str(v) for k, v in config.items()
                          if k != "id" and not isinstance(v, (list, dict)))
        parts.append(f"{config['id']}({params})" if params else config["id"])
    return "+".join(parts) or "raw"


def _leaf_row(leaf: LeafInfo) -> dict[str, Any]:
    """What ``inspect`` and ``-v`` say of one stored tensor."""
    return {
        "name": leaf.name, "dtype": leaf.dtype.name, "shape": list(leaf.shape),
        "codec": _codec_summary(leaf.pipeline.get_config()),
        "raw_bytes": leaf.nbytes, "stored_bytes": leaf.stored_bytes,
        "ratio": leaf.nbytes / leaf.stored_bytes if leaf.stored_bytes else None,
        "chunks": len(leaf.chunks), "error": leaf.error,
    }


def _leaf_line(row: dict[str, Any]) -> str:
    """One tensor in a line: ``name: dtype shape, raw -> stored bytes (ratio), pipeline[, error]``."""
    shape = "x".join(map(str, row["shape"])) or "()"
    ratio = f"{row['ratio']:.3f}x" if row["ratio"] else "-"
    error = f", error {_error_summary(row['error'])}" if row["error"] else ""
    return (f"  {row['name']}: {row['dtype']} {shape}, {row['raw_bytes']:,} -> "
            f"{row['stored_bytes']:,} bytes ({ratio}), {row['codec']}{error}")


def cmd_inspect(args: argparse.Namespace, say: Reporter) -> int:
    def inspect(src: str) -> None:
        with CheckpointFile.open(src, threads=args.threads,
                                     storage_options=storage_options(args)) as ckpt:
            header = ckpt.header
            rows = [_leaf_row(leaf) for leaf in ckpt.leaves]
            added = added_leaves(ckpt.leaves)  # parts of tensors, not of the state
            raw_total = sum(r["raw_bytes"] for i, r in enumerate(rows) if i not in added)
            summary: dict[str, Any] = {
                "path": src, "format": header.version, "creator": header.creator,
                "mode": header.mode, "id": header.id, "metadata": header.metadata,
                "source": (header.source or {}).get("kind"),
                "tensors": len(rows) - len(added), "added_leaves": len(added),
                "raw_bytes": raw_total, "file_bytes": ckpt.source.size,
                "ratio": raw_total / ckpt.source.size if ckpt.source.size else None,
                "chain_depth": ckpt.chain_depth, "chain": chain_of(ckpt),
            }
        if args.json:
            print(json.dumps({**summary, "leaves": rows}, indent=2))
            return
        print(f"{src}: ckz format {_format_version(summary['format'])}, "
              f"{summary['creator']}, mode {summary['mode']}, id {summary['id']}")
        if summary["metadata"]:
            print(f"metadata: {json.dumps(summary['metadata'])}")
        for depth, link in enumerate(summary["chain"], 1):
            print(f"base {depth}: {link['path'] or '<in-memory state>'} (id {link['id']}): "
                  f"{link['status']}")
        width = max([len(r["name"]) for r in rows] + [6])
        chunks = f" {'chunks':>6}" if say.verbose else ""
        print(f"{'tensor':<{width}}  {'dtype':<14} {'shape':<18} {'codec':<28} {'raw':>12} "
              f"{'stored':>12} {'ratio':>7}{chunks}")
        for r in rows:
            ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
            error = "  " + _error_summary(r["error"]) if r["error"] else ""
            chunks = f" {r['chunks']:>6}" if say.verbose else ""
            print(f"{r['name']:<{width}}  {r['dtype']:<14} {'x'.join(map(str, r['shape'])) or '()':<18} "
                  f"{r['codec']:<28} {r['raw_bytes']:>12,} {r['stored_bytes']:>12,} {ratio:>7}{chunks}"
                  f"{error}")
        total_ratio = f"{summary['ratio']:.3f}" if summary["ratio"] else "-"
        counted = f"{summary['tensors']} tensors"
        if summary["added_leaves"]:
            counted += f" (+{summary['added_leaves']} added: low-rank factors, change masks)"
        print(f"{'total':<{width}}  {counted:<52} {raw_total:>12,} "
              f"{summary['file_bytes']:>12,} {total_ratio:>7}")

    return _each_source(args, inspect)


def cmd_verify(args: argparse.Namespace, say: Reporter) -> int:
    def verify(src: str) -> None:
        with CheckpointFile.open(src, threads=args.threads, base=args.base,
                                 storage_options=storage_options(args)) as ckpt:
            report = ckpt.verify()
            say.tensors(ckpt)
        say.info(f"{src}: OK ({report.tensors} tensors, {report.chunks} chunks, "
                 f"{report.raw_bytes:,} bytes)")

    return _each_source(args, verify, prefix="ckptzip: ")


def cmd_bench(args: argparse.Namespace, say: Reporter) -> int:
    from .benchtool import compare, format_table

    threads = resolve_threads(args.threads or None)  # 0: every core, as -T says

    def bench(src: str) -> None:
        state = read_source(_local_input(src)).state
        rows = compare(state, threads=threads, repeat=args.repeat, progress=args.quiet == 0)
        print(format_table(rows, f"{src} ({threads} thread{'s' if threads > 1 else ''})"))

    return _each_source(args, bench)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = _normalize(list(sys.argv[1:] if argv is None else argv))
    if os.environ.get("CKPTZIP_MALLOC", "tuned") != "system":
        tune_malloc()  # this process is ckptzip's own: see ckptzip.allocator
    if args_list and args_list[0] == "demo":
        from .demo.job import main as demo_main

        return demo_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    say = Reporter(1 + args.verbose - args.quiet)
    restore_sigterm = _terminate_as_interrupt()
    handler = {"compress": cmd_compress, "decompress": cmd_decompress, "inspect": cmd_inspect,
               "verify": cmd_verify, "flatten": cmd_flatten, "bench": cmd_bench}[args.command]
    try:
        return handler(args, say)
    except Error as exc:
        print(f"ckptzip: error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated) as stop:
        print("ckptzip: interrupted; outputs are written whole or not at all, so no partial "
              "one was left behind", file=sys.stderr)
        return 143 if isinstance(stop, _Terminated) else 130
    except BrokenPipeError:  # `ckptzip inspect x.ckz | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's flush does not fail again
        return 141
    finally:
        restore_sigterm()


class _Terminated(BaseException):
    """SIGTERM, raised where the process is, so that every write's clean-up runs as it does
    for Ctrl-C (the temporary file removed, the previous output intact)."""


def _terminate_as_interrupt() -> Callable[[], object]:
    """Have SIGTERM raise :class:`_Terminated` while a command runs; returns what puts the
    caller's handler back (``main`` may run inside another program, a test)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach the main thread only

    def terminate(signum: int, frame: object) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    return lambda: signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
