#!/usr/bin/env bash
# Every GPU figure of benchmarks/RESULTS.md ("GPU"), in one command: `make bench-gpu` (PY=python with a CUDA torch;
# OUT=folder for the logs, JSON and the study's sweep directory). Each part is bounded by its own timeout so that a
# slow one cannot eat the others' time; PARTS chooses which run (default: all four, in this order).
#   tests    tests/trainables/test_gpu.py (pytest -m gpu)
#   bench    benchmarks/bench_gpu.py: trial / bare examples/s, GNS cost, host input, MFU, peak memory
#   compile  benchmarks/bench_trial_input.py --compile --compile-only: compiled vs eager, bare and trial
#   study    benchmarks/gpu_study.py: a DiT-S/2 sweep of 4 batch sizes on synthetic latents, 4 trials at once,
#            ended at STUDY_BUDGET_S -> $OUT/study (`make gpu-proof`, benchmarks/gpu_proof.py, runs it with the GPU tests,
#            the bench and `bcrit analyze` in one 8-minute command)
set -u
PY=${PY:-python3}
OUT=${OUT:-gpu-results}
PARTS=${PARTS:-tests bench compile study}
STUDY_BUDGET_S=${STUDY_BUDGET_S:-200}
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rc=0
for part in $PARTS; do
  echo "=== $part ($(date -u +%H:%M:%S))"
  case $part in
    tests) timeout 170 "$PY" -m pytest -m gpu tests/trainables/test_gpu.py -q -p no:cacheprovider || rc=1 ;;
    bench) timeout 120 "$PY" benchmarks/bench_gpu.py --device cuda --preset DiT-S/2 --batch 256 --steps 60 \
             --reps 3 --n 8192 --json "$OUT/bench.json" || rc=1 ;;
    compile) timeout 130 "$PY" benchmarks/bench_trial_input.py --device cuda --preset DiT-S/2 --batch 256 \
               --steps 40 --reps 1 --n 4096 --compile --compile-only || rc=1 ;;
    study) timeout $((STUDY_BUDGET_S + 60)) "$PY" benchmarks/gpu_study.py --out "$OUT/study" --device cuda \
             --deadline-s "$STUDY_BUDGET_S" ${STUDY_FLAGS:-} || rc=1 ;;
    *) echo "unknown part $part (tests bench compile study)"; rc=2 ;;
  esac
done
echo "=== done ($(date -u +%H:%M:%S)), rc $rc"
exit $rc
