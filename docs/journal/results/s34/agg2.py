import sys, collections, re
inner = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); frames = stack.split(";")
    if not any("save (" in f and "api.py" in f for f in frames): continue
    total += n
    ck = [re.sub(r":\d+\)", ")", f) for f in frames if "ckptzip/" in f]
    inner[ck[-1] if ck else "?"] += n
print("total", total)
acc = 0
for f, v in inner.most_common(60):
    acc += v; print(f"{v:5d} {100*v/total:5.1f}% cum {100*acc/total:5.1f}% {f}")
