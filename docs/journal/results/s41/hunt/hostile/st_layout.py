"""`ckptzip -d` of a safetensors-sourced .ckz whose stored safetensors header (source.header, which
decompress replays to restore the file "byte for byte") is malformed or lies. Expect: a clean
'ckptzip: error:' or a fallback to a plain safetensors write. Problem: a Python traceback, or a
restored file that safetensors cannot read / that holds other values, with exit status 0."""
import json, os, subprocess, sys, tempfile
import common, torch
from safetensors.torch import load_file, save_file

root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
t = {"a": torch.randn(4, 4), "b": torch.arange(6, dtype=torch.int64)}
save_file(t, f"{root}/m.safetensors")
env = {**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"}
cli = [sys.executable, "-m", "ckptzip.cli"]
subprocess.run(cli + ["compress", "-q", "-o", f"{root}/m.ckz", f"{root}/m.safetensors"], check=True, env=env)
h, data = common.split(open(f"{root}/m.ckz", "rb").read())
cases = {
    "entry lacks data_offsets": {"a": {"dtype": "F32", "shape": [4, 4]}, "b": {"dtype": "I64", "shape": [6]}},
    "entry lacks dtype": {"a": {"shape": [4, 4], "data_offsets": [0, 64]}, "b": {"dtype": "I64", "shape": [6], "data_offsets": [64, 112]}},
    "header is a JSON list": [1, 2],
    "entry is a string": {"a": "x", "b": "y"},
    "data_offsets is an int": {"a": {"dtype": "F32", "shape": [4, 4], "data_offsets": 64}, "b": {"dtype": "I64", "shape": [6], "data_offsets": [64, 112]}},
    "overlapping offsets": {"a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}, "b": {"dtype": "I64", "shape": [6], "data_offsets": [0, 48]}},
    "offset 2**40": {"a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}, "b": {"dtype": "I64", "shape": [6], "data_offsets": [2**40, 2**40 + 48]}},
}
problems = 0
for i, (name, header) in enumerate(cases.items()):
    hh = dict(h, source=dict(h["source"], header=json.dumps(header)))
    src = f"{root}/c{i}.ckz"; out = f"{root}/c{i}.safetensors"
    open(src, "wb").write(common.rebuild(hh, data))
    r = subprocess.run(cli + ["-d", "-q", "-o", out, src], capture_output=True, text=True, env=env, timeout=120)
    verdict = ""
    if r.returncode == 0:
        try:
            back = load_file(out)
            same = all(torch.equal(back[k], t[k]) for k in t)
            verdict = f"restored file loads, values {'equal' if same else 'DIFFER'}"
            bad = not same
        except Exception as e:
            verdict = f"restored file ({os.path.getsize(out):,} bytes) does NOT load: {str(e)[:80]}"
            bad = True
    else:
        bad = "Traceback" in r.stderr
        verdict = ("TRACEBACK " if bad else "") + (r.stderr.strip().splitlines() or [""])[-1][:160]
    problems += bad
    print(f"[{name}] rc={r.returncode}: {verdict}")
print("PROBLEMS:", problems)
sys.exit(1 if problems else 0)
