#!/usr/bin/env bash
# The GPU figures, on a CUDA host with PyTorch installed (run from the repository's root).
#
#   bash benchmarks/gpu_check.sh check OUT      build the extension, the CUDA tests, the lossy
#                                               modes' device speed and memory (benchmarks/
#                                               lossy_speed.py --device cuda), and a smoke run
#                                               of the 106M fidelity setup
#   bash benchmarks/gpu_check.sh profile OUT    where the device transforms' time goes
#                                               (benchmarks/probes/device_profile.py)
#   bash benchmarks/gpu_check.sh all OUT [DEADLINE]
#                                               one lease's call (timeout_s 600): the CUDA
#                                               tests, the 106M fidelity setup on 6 workers,
#                                               then the device speed, all done within DEADLINE
#                                               seconds (default 570); a failed arm does not stop
#                                               the others, so no smoke run gates the matrix
#   bash benchmarks/gpu_check.sh verify OUT     a short lease's call (at most about 200 s): the
#                                               CUDA tests, the device speed in 2 rounds, and
#                                               where the adaptive transforms' time goes
#   bash benchmarks/gpu_check.sh next OUT [DEADLINE]
#                                               what session 19 left, in one call (timeout_s
#                                               600): the CUDA tests, the square state's device
#                                               memory, then the 106M setup's remaining arms (a
#                                               looser adaptive point, BitSnap, the published
#                                               ExCP) on 6 workers, the runs already made taken
#                                               from the scoreboard's raw output (the
#                                               setup is deterministic on an H100: two machines
#                                               gave the same losses to the digit), by DEADLINE
#                                               (default 570)
#   bash benchmarks/gpu_check.sh matched OUT [DEADLINE]
#                                               the 106M setup's points for a matched gap
#                                               (timeout_s 600): the 3 seeds' keyframes first
#                                               (the CUDA tests and the square state's device
#                                               memory beside them); the earlier leases' runs
#                                               reused only if these keyframes equal theirs
#                                               (else lossless runs here too); then today's
#                                               adaptive default, adaptive-step-x2, ExCP at
#                                               strength 1 and at half its published alpha, on
#                                               6 workers. Run it again on the still-warm
#                                               machine (a shorter DEADLINE): the finished arms
#                                               stay, the stopped ones resume from their last
#                                               checkpoint, and the keyframes are not trained
#                                               again
#   bash benchmarks/gpu_check.sh looser OUT [DEADLINE]
#                                               the next lease's calls, as matched's (timeout_s
#                                               590, then again at once on the warm machine): the
#                                               square state's device memory beside the
#                                               keyframes, then the 106M setup's looser adaptive
#                                               points, adaptive-step-x2.5 and
#                                               adaptive-step-x3-w2.5
#   bash benchmarks/gpu_check.sh loosest OUT [DEADLINE]
#                                               the lease after session 30, as looser's (timeout_s
#                                               590, then again at once on the warm machine): the
#                                               square state's device memory beside the keyframes
#                                               (BitSnap's survey under the gate since 3e4fb65),
#                                               then the 106M setup's BitSnap default (bitsnap-d1)
#                                               and the loosest adaptive point,
#                                               adaptive-step-x5-w2.5; once they are done, with
#                                               110 s left, the 1 GB state's device speed
#   bash benchmarks/gpu_check.sh loosest2 OUT [DEADLINE]
#                                               the lease after session 33, as loosest's: the
#                                               106M setup's adaptive points with the moments at
#                                               10x and 20x (adaptive-step-x10-w2.5, and -x20-w2.6
#                                               with the weights at 2.6x),
#                                               towards ExCP's gap; then the device speed and
#                                               the device profile in the time left
#   bash benchmarks/gpu_check.sh speed OUT      the device speed and memory alone (about 120 s):
#                                               the square state, then the 1 GB state, 1 round
#   bash benchmarks/gpu_check.sh fidelity OUT [SECONDS [LIMIT]]
#                                               the 106M fidelity setup (benchmarks/fidelity.py
#                                               --setups gpt100m-adamw): lossless, adaptive,
#                                               ExCP and BitSnap arms, 3 seeds each, 3 at a time
#                                               on the one GPU; no arm starts after SECONDS
#                                               (default 420), and the run is stopped
#                                               after LIMIT (default 500; finished arms stay)
#
# What it writes (logs, the results' md/json, the fidelity PNG, runs.jsonl and the keyframes'
# metadata, which fidelity.py --report-only re-renders) is packed after each phase into
# OUT/gpu-results.tgz, and the two result tables are copied beside it.
set -uo pipefail
what=${1:?check, profile, fidelity or all}
dest=${2:?an output folder}
out=/tmp/gpu-results
mkdir -p "$dest" "$out"

pack() {
    cp /tmp/fid-gpu/runs.jsonl /tmp/fid-gpu/*.json "$out/" 2>/dev/null
    tar czf "$dest/gpu-results.tgz" -C "$out" .
    cp "$out"/lossy_speed.md "$out"/fidelity-matrix.md "$dest/" 2>/dev/null
    return 0
}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}

build() {
    if ! ls src/ckptzip/_native*"$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" \
            >/dev/null 2>&1; then
        $py setup.py -q build_ext -j 16 --inplace >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    fi
    $py -c 'import ckptzip, torch; print("ckptzip", ckptzip.__version__, "torch", torch.__version__,
        "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))'
}

check() {
    nvidia-smi -L
    build
    cuda_tests 300
    speed 300 2
    echo "== fidelity smoke (106M, 2 deltas) ($SECONDS s)"
    $py benchmarks/fidelity.py --setups gpt100m-adamw --prefix 30 --every 20 --deltas 2 \
        --seeds 1 --arms lossless,adaptive --arm-major --work /tmp/fid-smoke \
        --out /tmp/fid-smoke-out 2>&1 | grep -v "^|" | tail -8
    test -s /tmp/fid-smoke-out/fidelity-matrix.json && grep -q '"arm": "adaptive"' /tmp/fid-smoke/runs.jsonl
}

profile() {  # [MODES]
    echo "== device profile ($SECONDS s)"
    timeout 50 $py benchmarks/probes/device_profile.py --gb 0.3 --modes "${1:-adaptive,excp,bitsnap}" \
        >"$out/device-profile.txt" 2>&1
    grep "^===" "$out/device-profile.txt"
    pack
}

fidelity() {  # SECONDS LIMIT [WORKERS [ARMS]]
    echo "== fidelity, 106M ($SECONDS s)"
    timeout "$2" $py benchmarks/fidelity.py --setups gpt100m-adamw --seeds 3 \
        --arms "${4:-lossless,adaptive,excp,bitsnap-d1,excp-a2.5e-5}" --arm-major \
        --workers "${3:-3}" --stop-after "$1" --work /tmp/fid-gpu --out "$out" 2>&1 \
        | tee "$out/fidelity-gpu.log" | grep -v "^|" | tail -30
    # a run stopped at its limit leaves its pool's workers: they must not share the GPU with
    # what comes next
    pkill -9 -f multiprocessing.spawn; pkill -9 -f benchmarks/fidelity.py; sleep 2
    pack
}

cuda_tests() {
    echo "== CUDA tests ($SECONDS s)"
    timeout "$1" $py -m pytest -q -p no:cacheprovider -m cuda tests/test_device.py \
        tests/test_lossy.py 2>&1 | tee "$out/cuda-tests.log" | tail -5
}

speed() {  # LIMIT REPEAT
    echo "== lossy speed on the device ($SECONDS s)"
    timeout "$1" $py benchmarks/lossy_speed.py --device cuda --states synthetic \
        --synthetic-gb 1.0 --threads "$(nproc)" --repeat "$2" --out "$out" 2>&1 \
        | tee "$out/lossy_speed-cuda.log" | grep -v "^|" | tail -40
    pack
}

square_speed() {  # the square state's device speed and memory, 1 round
    echo "== lossy speed on the device, square state ($SECONDS s)"
    timeout 70 $py benchmarks/lossy_speed.py --device cuda --states square --threads "$(nproc)" \
        --repeat 1 --out "$out/square" 2>&1 | tee "$out/lossy_speed-square.log" | grep -v "^|" \
        | tail -8
}

# One call: the tests; the 106M matrix's arms in priority order, 6 processes sharing the GPU,
# none started that cannot end before the speed run's reserve; the speed run in what is left.
lease() {
    local deadline=$1 reserve=85 arm=120 limit
    nvidia-smi -L
    build
    cuda_tests 90
    limit=$((deadline - SECONDS - reserve))
    fidelity $((limit - arm)) "$limit" 6 lossless,adaptive,excp-fair,bitsnap-d1,excp
    speed $((deadline - SECONDS)) 1
}

# The 106M setup's keyframes, once per machine (the CUDA tests beside them, in the background:
# $tests): the earlier leases' runs are reused only when this machine trained the same prefix,
# the keyframes' metadata (validation loss to the last digit, every tensor's second-moment
# scale) equal to theirs; otherwise every arm, lossless too, runs here.
prefix_once() {
    mkdir -p /tmp/fid-gpu
    cuda_tests 150 >/dev/null 2>&1 &
    tests=$!
    echo "== keyframes, 106M, 3 seeds side by side ($SECONDS s)"
    $py benchmarks/fidelity.py --setups gpt100m-adamw --seeds 3 --keyframes-only --workers 3 \
        --work /tmp/fid-gpu 2>&1 | tail -3
    if $py - <<'PY'
import json, sys
from pathlib import Path
same = all(json.loads(Path(f"/tmp/fid-gpu/gpt100m-adamw-s{s}-key.json").read_text())
           == json.loads(Path(f"docs/scoreboard/raw/gpu/gpt100m-adamw-s{s}-key.json").read_text())
           for s in range(3))
print("prefix: the same keyframes as the earlier leases'" if same else
      "prefix: keyframes differ from the earlier leases': lossless runs again here")
sys.exit(0 if same else 1)
PY
    then
        cp docs/scoreboard/raw/gpu/fidelity-gpt100m-runs.jsonl /tmp/fid-gpu/runs.jsonl
    fi
    touch /tmp/fid-gpu/prefix-checked
}

# The square state's device memory (lossy_speed.py, 1 round) beside the 106M prefix: its peak
# memory is a figure, its speed is not (the prefix's processes share the GPU and the host cores).
square_beside_prefix() {
    timeout 120 $py benchmarks/lossy_speed.py --device cuda --states square \
        --threads "$(nproc)" --repeat 1 --out "$out/square" >"$out/lossy_speed-square.log" 2>&1 &
    local square=$!
    prefix_once
    wait "$square"
    cp "$out/square/lossy_speed.md" "$dest/lossy_speed-square.md" 2>/dev/null
    grep -A6 "^| state | mode | threads | transform" "$out/square/lossy_speed.md"
}

# The 106M arms ARMS (comma-separated, each at 3 seeds, 6 workers) until DEADLINE; then the
# CUDA tests' result, if this call started them.
arms_then_tests() {  # DEADLINE ARMS
    local limit=$(($1 - SECONDS - 15))
    fidelity "$limit" "$limit" 6 "$2"
    ls /tmp/fid-gpu/*.progress.json 2>/dev/null | sed 's/^/stopped mid-chain, resumes next call: /'
    if [ -n "$tests" ]; then
        wait "$tests"
        tail -3 "$out/cuda-tests.log"
    fi
    pack
}

tests=
SECONDS=0
case $what in
check) check ;;
profile) build; profile ;;
fidelity) build; fidelity "${3:-420}" "${4:-500}" ;;
all) lease "${3:-570}" ;;
next)
    deadline=${3:-570}
    nvidia-smi -L
    build
    cuda_tests 80
    square_speed
    mkdir -p /tmp/fid-gpu
    # the runs already made (the scoreboard's raw output), not run again; their keyframes are
    # trained again (the prefix), to the same bytes
    cp docs/scoreboard/raw/gpu/fidelity-gpt100m-runs.jsonl /tmp/fid-gpu/runs.jsonl
    limit=$((deadline - SECONDS - 10))
    fidelity $((limit - 150)) "$limit" 6 adaptive-ratio-x1.5,bitsnap-d1,excp
    ;;
matched)
    deadline=${3:-570}
    nvidia-smi -L
    build
    [ -e /tmp/fid-gpu/prefix-checked ] || square_beside_prefix  # a fresh machine
    arms_then_tests "$deadline" lossless,adaptive,adaptive-step-x2,excp-s1,excp-a2.5e-5
    ;;
looser)
    deadline=${3:-570}
    nvidia-smi -L
    build
    [ -e /tmp/fid-gpu/prefix-checked ] || square_beside_prefix  # a fresh machine
    arms_then_tests "$deadline" lossless,adaptive-step-x2.5,adaptive-step-x3-w2.5
    ;;
loosest)
    deadline=${3:-570}
    nvidia-smi -L
    build
    [ -e /tmp/fid-gpu/prefix-checked ] || square_beside_prefix  # a fresh machine
    arms_then_tests "$deadline" lossless,bitsnap-d1,adaptive-step-x5-w2.5
    # the arms done and room left (the second call): the device speed and memory, the 1 GB
    # state, 1 round, with the training processes gone
    if ! ls /tmp/fid-gpu/*.progress.json >/dev/null 2>&1 && [ $((deadline - SECONDS)) -gt 110 ]; then
        speed $((deadline - SECONDS - 5)) 1
    fi
    ;;
loosest2)
    deadline=${3:-570}
    nvidia-smi -L
    build
    [ -e /tmp/fid-gpu/prefix-checked ] || square_beside_prefix  # a fresh machine
    arms_then_tests "$deadline" lossless,adaptive-step-x10-w2.5,adaptive-step-x20-w2.6
    if ! ls /tmp/fid-gpu/*.progress.json >/dev/null 2>&1 && [ $((deadline - SECONDS)) -gt 110 ]; then
        speed $((deadline - SECONDS - 5)) 1
        # where the device's time goes, now that the unchanged check copies no changed moment (73697c9)
        [ $((deadline - SECONDS)) -gt 60 ] && profile
    fi
    ;;
speed)
    nvidia-smi -L
    build
    square_speed
    cp "$out"/square/lossy_speed.md "$dest/lossy_speed-square.md" 2>/dev/null
    speed 100 1
    ;;
verify)
    nvidia-smi -L
    build
    cuda_tests 80
    speed 150 2
    profile adaptive
    ;;
*)
    echo "usage: $0 check|verify|next|matched|looser|loosest|loosest2|speed|profile|fidelity|all OUT [SECONDS [LIMIT]] (all: [DEADLINE])" >&2
    exit 2
    ;;
esac
echo "== done ($SECONDS s)"
