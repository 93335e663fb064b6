"""Check the native core's layering (src/ckptzip/_native/README.md): no include or call circle.

Every C file of ``_native`` has a layer below; a file may include a header, and call a function,
of its own layer or of a lower one only; headers must not include each other in a circle, nor
must the .c files call each other in one.  ``core/`` never includes ``Python.h`` or ``python/``'s headers.

    python fuzz/native_layers.py            # includes (what ``make -C fuzz layers`` runs)
    python fuzz/native_layers.py --symbols  # and calls: each core file compiled (CC, default cc)
                                            # and its undefined ckz_ symbols matched to their file
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parent.parent / "src" / "ckptzip" / "_native"

#: layer of each file stem, lowest first (README.md draws the same order)
LAYERS: dict[str, int] = {
    "common": 0,
    "memory": 1, "hist": 1, "crc32c": 1, "planes": 1, "residual": 1, "dither": 1,
    "quantize": 1, "sparse": 1, "ratio": 1, "masks": 1, "search": 1,
    "huff": 2, "rans": 2,
    "stream": 3,
    "ctx": 4, "ctx_internal": 4, "ctx_encode": 4, "ctx_decode": 4, "ctx_format2": 4,
    "chunk": 5,
    "module": 6, "pymemory": 6,
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def files() -> list[Path]:
    return sorted(p for d in ("core", "python") for p in (NATIVE / d).glob("*.[ch]"))


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle in a directed graph of file names, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def check(edges: dict[str, set[str]], what: str) -> list[str]:
    """Errors for edges that go up a layer, and for a circle among the rest."""
    errors = []
    for src, dsts in sorted(edges.items()):
        for dst in sorted(dsts):
            if LAYERS[Path(dst).stem] > LAYERS[Path(src).stem]:
                errors.append(f"{src} {what} {dst}, a higher layer")
    cycle = find_cycle(edges)
    if cycle:
        errors.append(f"{what} circle: " + " -> ".join(cycle))
    return errors


def include_errors() -> list[str]:
    errors, edges = [], {}
    for path in files():
        name = f"{path.parent.name}/{path.name}"
        if path.stem not in LAYERS:
            errors.append(f"{name} has no layer in {Path(__file__).name}")
            continue
        edges.setdefault(path.name, set())
        for kind, header in INCLUDE.findall(path.read_text()):
            if path.parent.name == "core" and (header == "Python.h" or (NATIVE / "python" / header).exists()):
                errors.append(f"{name} includes {header}: core/ is plain C")
            if kind == '"':
                if Path(header).stem not in LAYERS:
                    errors.append(f"{name} includes {header}, which has no layer")
                else:
                    edges[path.name].add(header)
    return errors + check(edges, "includes")


def symbol_errors() -> list[str]:
    """Calls between core files, from the compiled objects' defined and undefined symbols."""
    cc = os.environ.get("CC", "cc")
    defined: dict[str, str] = {}
    needs: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src in sorted((NATIVE / "core").glob("*.c")):
            obj = Path(tmp) / (src.stem + ".o")
            subprocess.run([cc, "-c", "-O1", "-std=c11", f"-I{NATIVE / 'core'}", str(src), "-o", str(obj)],
                           check=True)
            out = subprocess.run(["nm", "-P", str(obj)], check=True, capture_output=True, text=True)
            needs[src.stem] = set()
            for line in out.stdout.splitlines():
                sym, kind = line.split()[:2]
                if not sym.startswith("ckz_"):
                    continue
                if kind == "U":
                    needs[src.stem].add(sym)
                elif kind.isupper():
                    defined[sym] = src.stem
    edges = {src: {defined[s] for s in syms if s in defined} - {src} for src, syms in needs.items()}
    missing = sorted({s for syms in needs.values() for s in syms} - defined.keys())
    return [f"undefined in core/: {s}" for s in missing] + check(edges, "calls into")


def main() -> int:
    errors = include_errors()
    if "--symbols" in sys.argv[1:]:
        errors += symbol_errors()
    for error in errors:
        print(error)
    if not errors:
        order = sorted(set(LAYERS.values()))
        print(" -> ".join("/".join(s for s, layer in LAYERS.items() if layer == n) for n in order))
        print("layers: no include goes up a layer or round a circle"
              + (", nor any call" if "--symbols" in sys.argv[1:] else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
