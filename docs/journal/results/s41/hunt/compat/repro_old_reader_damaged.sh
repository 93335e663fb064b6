#!/bin/bash
# A lossless delta written by the CURRENT ckptzip, read by ckptzip at 265e18e (2026-11-22, which
# knows context-stream format 2 only): refused as "the file is damaged; restore it from another
# copy" (CorruptError), although the file is intact (the current version loads it). The format
# version in the prelude is 1.0 in both, so nothing tells the old reader the file is newer.
# Exit 1 when the old reader blames damage.
set -u
cd "$(dirname "$0")"; export CKPTZIP_MALLOC=system; PY=/work/main/.venv/bin/python
D=$(mktemp -d "$PWD/tmp-old-damaged.XXXX")
$PY - "$D" <<'PY'
import sys, torch, ckptzip
d = sys.argv[1]; g = torch.Generator().manual_seed(0); w = torch.randn(256, 256, generator=g)
ckptzip.save({"w": w}, f"{d}/k0.ckz")
ckptzip.save({"w": w + 1e-4 * torch.randn(256, 256, generator=g)}, f"{d}/d1.ckz", base=f"{d}/k0.ckz")
print("current version loads it:", ckptzip.load(f"{d}/d1.ckz")["w"].shape)
PY
echo "--- ckptzip 265e18e:"
PYTHONPATH=$PWD/v-265e18e/src $PY -c "import ckptzip, ckptzip.cli, sys; print(ckptzip.__file__); sys.exit(ckptzip.cli.main(['verify', '$D/d1.ckz']))" 2>&1 | tail -3
out=$(PYTHONPATH=$PWD/v-265e18e/src $PY -c "import ckptzip; ckptzip.load('$D/d1.ckz')" 2>&1 | tail -1); echo "$out"
case "$out" in *damaged*) exit 1;; *) exit 0;; esac
