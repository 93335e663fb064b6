"""What every benchmark records beside its tables: machine, versions, command; and where it writes.

Each script writes ``<name>.md`` (the tables under a header naming the machine and versions) and
``<name>.json`` (the same figures, plus that header as data) to ``benchmarks/out/`` (ignored by git:
ad hoc runs), or with ``--out docs/scoreboard/raw`` to the committed raw outputs the scoreboard,
docs/BENCHMARKS.md, quotes (``make bench`` runs them so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy
import torch

from ckptzip import peers
from ckptzip._version import __version__

OUT_DIR = Path(__file__).resolve().parent / "out"
REPO = Path(__file__).resolve().parent.parent


def _run(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cpu_model() -> str:
    """``lscpu``'s model name (the platform's processor string where lscpu is missing)."""
    for line in _run("lscpu").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """The machine, the versions of everything measured, the commit and the exact command."""
    # a copy of the tree without its repository (a remote machine) names its commit in the env
    commit = os.environ.get("CKPTZIP_BENCH_COMMIT") or _run(
        "git", "-C", str(REPO), "rev-parse", "--short", "HEAD")
    if (commit and "CKPTZIP_BENCH_COMMIT" not in os.environ
            and _run("git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no")):
        commit += " (with uncommitted changes)"
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load_average": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "ckptzip": __version__,
        "commit": commit or "unknown",
        "peers": {p.name: f"{p.package} {p.version()}" for p in peers.PEERS.values()},
        "missing_peers": {p.name: p.unavailable_reason() for p in peers.PEERS.values() if not p.available()},
        "command": shlex.join(["python", os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
    }


def info_markdown(info: dict[str, Any]) -> str:
    """The header of a results file: machine, versions, command."""
    lines = [
        f"- Machine: {info['cpu']}, {info['cores']} cores "
        f"(load average {info['load_average']:.2f} at the start)"
        + (f", GPU {info['gpu']}" if info.get("gpu") else ""),
        f"- Python {info['python']}, torch {info['torch']}, numpy {info['numpy']}, "
        f"ckptzip {info['ckptzip']} (commit {info['commit']})",
        "- Peers: " + ", ".join(f"{name} ({ver})" for name, ver in info["peers"].items()),
        f"- Command: `{info['command']}` ({info['date']})",
    ]
    lines += [f"- **Missing peer** {name}: {why}" for name, why in info["missing_peers"].items()]
    return "\n".join(lines)


def write_results(name: str, markdown: str, data: dict[str, Any], out_dir: Path) -> None:
    """Write ``<name>.md`` and ``<name>.json`` under ``out_dir`` and say where."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".md", markdown), (".json", json.dumps(data, indent=2) + "\n")):
        path = out_dir / f"{name}{suffix}"
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)


def csv(choices: list[str] | None = None) -> Any:
    """An argparse ``type`` for comma-separated lists, checked against ``choices``."""

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if choices is not None and item not in choices]
        if unknown or not items:
            known = ", ".join(choices or [])
            what = ", ".join(unknown) or "empty list"
            raise argparse.ArgumentTypeError(f"unknown {what}; choose from {known}")
        return items

    return parse


def thread_counts(text: str) -> list[int]:
    """``--threads`` values: comma-separated positive ints, or ``all`` for every core."""
    counts = [(os.cpu_count() or 1) if item == "all" else int(item) for item in text.split(",")]
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError("thread counts must be positive")
    return sorted(set(counts))
