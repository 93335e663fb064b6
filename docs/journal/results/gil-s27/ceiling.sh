#!/bin/bash
# Two processes at once (no shared GIL) against one process on 2 threads, the demo state.
cd /work/main; export CKPTZIP_MALLOC=system PYTHONPATH=src; S=docs/journal/results/gil-s26/demo_save.py
for round in 1 2; do
for mode in adaptive excp bitsnap; do
  echo "round $round $mode alone: $(.venv/bin/python $S 1 $mode 5 | awk '{print $3}' | tr '\n' ' ')"
  .venv/bin/python $S 1 $mode 5 | awk '{print $3}' | tr '\n' ' ' > /tmp/s27/pa.$mode & 
  .venv/bin/python $S 1 $mode 5 | awk '{print $3}' | tr '\n' ' ' > /tmp/s27/pb.$mode; wait
  echo "round $round $mode two processes: $(cat /tmp/s27/pa.$mode) | $(cat /tmp/s27/pb.$mode)"
  echo "round $round $mode 2 threads: $(.venv/bin/python $S 2 $mode 5 | awk '{print $3}' | tr '\n' ' ')"
done; done
