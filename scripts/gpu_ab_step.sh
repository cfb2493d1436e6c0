#!/usr/bin/env bash
# A quick A/B of engine switches on the GPU machine: the decode step of a model of the 27B's widths with few layers
# (native/bench/step_kernels.py: LAYERS of them, written once), each variant in a process of its own, the variants in
# the order given and ROUNDS times over (alternating, so a drift of the GPU shows as one), one line a run, then the
# medians a variant. About a minute and a half for two variants over two rounds, where gpu_bench_engine.sh first
# writes the 17 GB `full` model (~150 s): a first look at a switch; the step's figures for the record still come
# from gpu_bench_engine.sh.
#   run(carry=[".whl", ".prebuilt", ".cache/openjet/llama_cpp_python-0.3.36"], timeout_s=300,
#       command="VARIANTS='OPENJET_GEMV_TMA=auto OPENJET_GEMV_TMA=1' BEFORE='python3 -m pytest -q -m gpu
#       tests/test_gpu_engine.py -k \"decode_experiments_keep_every_bit and GEMV_TMA\"' bash scripts/gpu_ab_step.sh")
# VARIANTS: a variant's environment assignments joined by commas, variants apart by spaces or newlines ('-': none);
# T: token rows, one or a list (step_kernels' --t; default 1,5); LAYERS (8: six Gated DeltaNet layers and two attention
# layers), ROUNDS (2), STEPS (300 a T); BEFORE: a command run first on the idle GPU (a switch's bit test, say), its
# output in $OUT/before.log and its last lines printed. Results: $OUT/ab-step.jsonl (a line a run, with its variant).
set -o pipefail
. scripts/device_common.sh
device_wheels || exit 2
build_engine /tmp/b "$OUT/build.log" || exit 1
export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so
LAYERS=${LAYERS:-8} ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-300} T=${T:-1,5}
MODEL=/tmp/ab-step-$LAYERS.gguf
if [ -z "${VARIANTS:-}" ]; then echo "VARIANTS is empty: nothing to compare" >&2; exit 2; fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
if [ -n "${BEFORE:-}" ]; then
  bash -c "$BEFORE" > "$OUT/before.log" 2>&1
  echo "before (rc $?):"; tail -4 "$OUT/before.log"
fi
# The model, written once (its own run's figures are left out: a first load warms the file cache).
python3 native/bench/step_kernels.py --model "$MODEL" --layers "$LAYERS" --t 1 --warmup 2 --steps 5 \
  > /dev/null 2> "$OUT/model.err" || { tail -5 "$OUT/model.err"; exit 1; }
mapfile -t variants < <(printf '%s\n' $VARIANTS)
: > "$OUT/ab-step.jsonl"
for round in $(seq "$ROUNDS"); do
  for v in "${variants[@]}"; do
    env_args=()
    [ "$v" != - ] && IFS=, read -r -a env_args <<< "$v"
    env "${env_args[@]}" python3 native/bench/step_kernels.py --model "$MODEL" --layers "$LAYERS" --t "$T" \
      --warmup 30 --steps "$STEPS" 2> "$OUT/run.err" |
      python3 -c 'import json, sys
for line in sys.stdin:
    r = json.loads(line); r["variant"] = sys.argv[1]; r["round"] = int(sys.argv[2]); print(json.dumps(r))' \
        "$v" "$round" | tee -a "$OUT/ab-step.jsonl" || { tail -5 "$OUT/run.err"; exit 1; }
  done
done
python3 - "$OUT/ab-step.jsonl" <<'EOF'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["variant"], r["t"])].append(r["step_ms_median"])
for (variant, t), ms in runs.items():
    print(f"T={t} {variant}: median {statistics.median(ms):.4f} ms over {len(ms)} runs {ms}")
EOF
