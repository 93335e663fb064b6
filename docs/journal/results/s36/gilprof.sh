#!/bin/bash
# usage: gilprof.sh mode saves seconds
cd /work/main
rm -f /tmp/s36/ready; CKPTZIP_MALLOC=system .venv/bin/python /work/main/docs/journal/results/s36/loop.py $1 $2 > /tmp/s36/loop.out 2>&1 &
while [ ! -f /tmp/s36/ready ]; do sleep 1; done; PID=$(pgrep -f "s36/loop.py" | head -1)
.venv/bin/py-spy record --gil --format raw -r 250 -d $3 -p $PID -o /tmp/s36/gil.txt > /dev/null 2>&1
.venv/bin/py-spy record --format raw -r 250 -d $3 -p $PID -o /tmp/s36/all.txt > /dev/null 2>&1
wait; cat /tmp/s36/loop.out
python3 - <<'PY'
import collections
def load(p):
    tot=0; leaf=collections.Counter(); incl=collections.Counter()
    for line in open(p):
        stack, _, c = line.rstrip().rpartition(' ')
        c=int(c); tot+=c
        frames=stack.split(';')
        leaf[frames[-1]]+=c
        for f in set(frames): incl[f]+=c
    return tot, leaf, incl
g, gl, gi = load('/tmp/s36/gil.txt'); a, al, ai = load('/tmp/s36/all.txt')
print("gil samples", g, "all samples", a, "gil share ~", g/a)
for k,v in gl.most_common(20): print(" ", v, k[:140])
print("inclusive (gil):")
for k,v in gi.most_common(40): print(" ", v, k[:140])
PY
