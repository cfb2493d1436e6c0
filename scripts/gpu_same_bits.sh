#!/usr/bin/env bash
# Does a change keep every bit, and what does it gain? In ONE device call (~4 min): builds the library of the
# working tree and of a baseline source tree carried in .base/, dumps both libraries' outputs with
# native/bench/bits_dump.py (every GEMV type over the 27B shapes for T = 1..8, 40, 128 with both prefill
# kernels, the packs, and prefill + decode logits of the tiny and small synthetic models, f16 and q8_0 KV)
# and compares them bit for bit, then times decode steps of a 4-layer model of the 27B's widths
# (native/bench/step_kernels.py, T = STEP_TS) with each library, alternating, and runs the GEMV GPU tests
# on the new one.
#
#   git archive <baseline commit> CMakeLists.txt native pyproject.toml | (rm -rf .base && mkdir .base && tar -x -C .base)
#   run(carry=[".whl", ".cache/openjet/llama_cpp_python-0.3.36", ".base"], timeout_s=600,
#       command="BITS_MODES='OPENJET_PDL=0' TIME_PDL=1 bash scripts/gpu_same_bits.sh")
# (.base/ is git-ignored. `PREBUILD_SRC=.base bash scripts/prebuild_device.sh` here prebuilds its library into
# .base/.prebuilt, and `bash scripts/prebuild_device.sh` this tree's: carry .prebuilt too, and neither is built there.)
# BITS_MODES: environment settings under which the new library's dump is compared too (OPENJET_GDN_FUSED=0 takes
# the GDN step's fused projections out, OPENJET_GEMV_PAIRS=0 the paired projection launches, to bisect a
# difference); both libraries are timed under the engine's default (OPENJET_PDL as the
# caller's environment has it: PDL on sm_90+ where unset; until 2026-12-07 this script timed both with it off), and
# TIME_PDL=1 times the new library with OPENJET_PDL=0 too. Output: the comparison and the timings in
# the tail, $OUT/same-bits.json. PREFILL=N: also a prefill of N tokens of the 4-layer model with each library
# (wall time, then the per-phase profile; step_kernels.py --prefill). BENCH_GDN=1: native/bench/bench_gdn.py with
# each library. TESTS: the GPU test files run at the end (default: GEMV, PDL, attention). TIME_MODES: environment
# settings under which the new library's steps are timed too (each round). STEP_CTX: tokens prefilled before the timed steps (default 0).
# PREFILL_MODES: environment settings under which the new library's prefill is timed too (with PREFILL).
set -o pipefail
START=$(date +%s)
say() { echo "[same_bits +$(( $(date +%s) - START ))s] $*"; }
. scripts/device_common.sh
device_wheels || exit 2
[ -f .base/CMakeLists.txt ] || { echo ".base/ is missing: see the header of $0"; exit 2; }
export PYTHONUNBUFFERED=1
python3 -m openjet_launcher synth --preset tiny --quiet --force /tmp/tiny.gguf > /dev/null 2> "$OUT/synth.err" &
python3 -m openjet_launcher synth --preset small --quiet --force /tmp/small.gguf > /dev/null 2>> "$OUT/synth.err" &
python3 native/bench/step_kernels.py --model /tmp/full4.gguf --warmup 0 --steps 1 > /dev/null 2>> "$OUT/synth.err" &
SYNTH=$!
build_engine /tmp/b "$OUT/build.log" & B1=$!
(cd .base && build_engine /tmp/b_base "$OUT/build-base.log") & B2=$!
wait $B1 || { say "build failed"; exit 1; }
wait $B2 || { say "baseline build failed"; exit 1; }
say "both libraries built"
wait
[ -s /tmp/full4.gguf ] || { tail "$OUT/synth.err"; say "synth failed"; exit 1; }
say "models written"
NEW=/tmp/b/native/libopenjet.so BASE=/tmp/b_base/native/libopenjet.so
OPENJET_LIBRARY=$BASE python3 native/bench/bits_dump.py /tmp/base.npz --models /tmp/tiny.gguf,/tmp/small.gguf 2>&1 | tail -2
OPENJET_LIBRARY=$NEW python3 native/bench/bits_dump.py /tmp/new.npz --models /tmp/tiny.gguf,/tmp/small.gguf 2>&1 | tail -2
SAME=0
python3 native/bench/bits_dump.py --compare /tmp/base.npz /tmp/new.npz > "$OUT/compare.txt" || SAME=1
head -40 "$OUT/compare.txt"; tail -1 "$OUT/compare.txt"
for mode in ${BITS_MODES:-}; do  # e.g. BITS_MODES="OPENJET_DECODE_B=staged OPENJET_DECODE_B=global"
  env "$mode" OPENJET_LIBRARY=$NEW python3 native/bench/bits_dump.py /tmp/mode.npz --models /tmp/tiny.gguf,/tmp/small.gguf 2>&1 | tail -1
  python3 native/bench/bits_dump.py --compare /tmp/base.npz /tmp/mode.npz > "$OUT/compare-mode.txt" || SAME=1
  echo "$mode: $(head -20 "$OUT/compare-mode.txt")"
done
say "compared (rc $SAME)"
: > "$OUT/same-bits.json"
for round in 1 2; do
  for lib in base new ${TIME_PDL:+nopdl}; do  # TIME_PDL=1: also the new library with OPENJET_PDL=0
    L=$BASE; [ $lib != base ] && L=$NEW
    OPENJET_PDL=$([ $lib = nopdl ] && echo 0 || echo "${OPENJET_PDL:-}") OPENJET_LIBRARY=$L python3 native/bench/step_kernels.py --model /tmp/full4.gguf --t "${STEP_TS:-1,4,8}" \
      --ctx "${STEP_CTX:-0}" 2>/dev/null |
      sed "s/^{/{\"lib\": \"$lib\", \"round\": $round, /" | tee -a "$OUT/same-bits.json"
  done
  for mode in ${TIME_MODES:-}; do  # e.g. TIME_MODES="OPENJET_PACK_CLUSTER=1": the new library (PDL on) under it
    env "$mode" OPENJET_LIBRARY=$NEW python3 native/bench/step_kernels.py --model /tmp/full4.gguf --t "${STEP_TS:-1,4,8}" \
      --ctx "${STEP_CTX:-0}" 2>/dev/null | sed "s/^{/{\"lib\": \"new $mode\", \"round\": $round, /" | tee -a "$OUT/same-bits.json"
  done
done
for lib in ${PREFILL:+base new}; do
  L=$BASE; [ $lib = new ] && L=$NEW
  OPENJET_LIBRARY=$L python3 native/bench/step_kernels.py --model /tmp/full4.gguf --prefill "$PREFILL" 2>/dev/null |
    sed "s/^{/{\"lib\": \"$lib\", /" | tee -a "$OUT/same-bits.json"
done
for mode in ${PREFILL:+${PREFILL_MODES:-}}; do  # e.g. PREFILL_MODES="OPENJET_ATTN_SMEM_LIMIT=100000"
  env "$mode" OPENJET_LIBRARY=$NEW python3 native/bench/step_kernels.py --model /tmp/full4.gguf --prefill "$PREFILL" \
    2>/dev/null | sed "s/^{/{\"lib\": \"new $mode\", /" | tee -a "$OUT/same-bits.json"
done
for lib in ${BENCH_GDN:+base new}; do
  L=$BASE; [ $lib = new ] && L=$NEW
  echo "bench_gdn $lib"; OPENJET_LIBRARY=$L python3 native/bench/bench_gdn.py 2>&1 > "$OUT/gdn-$lib.json" | tail -8
done
say "timed"
OPENJET_LIBRARY=$NEW OPENJET_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q -m gpu \
  ${TESTS:-tests/test_gpu_gemv.py tests/test_gpu_pdl.py tests/test_gpu_attn.py} 2>&1 | tail -5
say "done; bit-identical: $([ $SAME = 0 ] && echo yes || echo NO)"
