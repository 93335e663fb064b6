#!/bin/bash
# usage: ab.sh MODE ROUNDS  -- interleaved processes, base vs work, 2 threads then 1 thread
MODE=$1; ROUNDS=${2:-3}
for r in $(seq $ROUNDS); do
  for b in base work; do
    if [ $b = base ]; then SRC=/tmp/s28/base/src; else SRC=/work/main/src; fi
    CKPTZIP_MALLOC=system PYTHONPATH=$SRC /work/main/.venv/bin/python /tmp/s28/abrun.py $MODE $b
  done
done
