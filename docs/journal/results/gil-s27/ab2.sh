#!/bin/bash
# Interleaved A/B on the demo state: 83e74ef (before) against eb1d3e9 (after), each process one
# keyframe then 4 delta saves; 1 thread then 2 threads; 3 rounds.
cd /work/main; export CKPTZIP_MALLOC=system; S=docs/journal/results/gil-s26/demo_save.py  # the run used a copy of it that put /work/main/benchmarks on the path
echo "start $(date -u +%H:%M) load $(cut -d' ' -f1 /proc/loadavg)"
for r in 1 2 3; do for m in adaptive excp bitsnap; do
 for v in before after; do
  if [ $v = before ]; then src=/tmp/s27/base/src; else src=/tmp/s27/after/src; fi
  echo "round $r $m $v 1t: $(PYTHONPATH=$src .venv/bin/python $S 1 $m 4 | awk '{print $3}' | tr '\n' ' ')  2t: $(PYTHONPATH=$src .venv/bin/python $S 2 $m 4 | awk '{print $3}' | tr '\n' ' ')"
 done; done; done
echo "end $(date -u +%H:%M)"
