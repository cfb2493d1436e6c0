#!/usr/bin/env bash
# Issue 6's benchmark in ONE device call: build the engine for this GPU, write the `full` synthetic model
# (exact 27B shapes, 17.1 GB; `synth --codes random`: random k-quant codes with the init's mean and std, which
# stream through the kernels as fast as quantised weights) to $MODEL unless it is there, run
# native/bench/bench_decode.py on it (decode T = 1..8 at contexts 0, 4K, 32K; prefill 512, 4096, 16384, 32768
# with TFLOP/s against the tensor cores' rate measured in the same run (torch fp16 matmul); memory and the 32K
# q8_0 footprint; q8_0 then f16 KV). Results in $OUT: bench-engine.json (copy it to bench/results/),
# bench-engine.log, build.log, synth.json, synth.err.
#
#   run(carry=[".whl", ".cache/openjet/llama_cpp_python-0.3.36"], timeout_s=600,
#       command="OPENJET_COMMIT=<the hash of `git rev-parse HEAD`, written out> bash scripts/gpu_bench_engine.sh")
#
# .whl/   the wheels the bare image lacks (gguf, platformdirs, ...): scripts/fetch_device_wheels.sh
# .cache/ OPENJET_CACHE holding llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf (the
#         full preset's vocabulary, 5.9 MB); both are git-ignored, hence carried. Make it here with
#         OPENJET_CACHE=$PWD/.cache/openjet python -c "from openjet_launcher.model.vocab import full_vocab; full_vocab()"
#         and carry only that folder: the sdist archive beside it (77 MB) would pass the 64 MiB limit.
#
# Time on the 16-core H200 machine: the synth with random codes 20.5 s (measured at 69f5e29, 12 workers beside the
# build; ~10 s of it reading the vocabulary and writing the header; all 16 cores:
# synthesize() uses min(cpus, 16) worker processes; SYNTH_CODES=quantised writes the quantised init as before,
# 242 s measured), the build ~20 s running beside it, then the bench: ~10-30 s per load and
# ~100-150 s per KV type if a decode step costs 10-20 ms (`bench_decode.py --preset full --dry-run` prints the
# plan with its estimates). The bench is given a deadline BUDGET_S (570) seconds after this script started:
# it skips the parts that would end later (listed under "skipped" in the JSON, f16's 32K part first) and
# rewrites the JSON after every part, so a run stopped at the 600 s limit still leaves its results.
#
# /tmp does not survive between calls: a fresh machine is bare and a warm one is given back ~30 s after a
# call returns, so a second call nearly always writes the model again (well under a minute with random codes).
# The model is far too large to carry (64 MiB limit). Options through the environment: MODEL=/path.gguf,
# SYNTH_CODES=random (or quantised), BUDGET_S=570,
# BENCH_ARGS="--kv q8_0 --steps 20" (appended to the bench's arguments), WHILE_SYNTH="python3 -m pytest -q -m gpu
# tests/test_gpu_gemv.py" (a command run on the idle GPU while the model is written, on WHILE_SYNTH_CPUS (4) cores
# of its own, the synth on the others, where taskset exists: on 2026-12-02 the GPU tests sharing all 16 cores with
# the synth did not finish in 290 s against ~205 s alone; keep its output out of pipes, a timeout kills them; at
# most WHILE_SYNTH_S = 200 s, its output in $OUT/while-synth.log; only when the model is being written; with
# random codes the model is written before the build ends, so the command mostly runs alone before the bench),
# BENCH_CMD="python3 native/bench/bench_prefill_turns.py \$MODEL > \$OUT/turns.json" (run instead of bench_decode),
# VARIANTS="OPENJET_PDL=0
# OPENJET_PDL=1" (bench each environment in turn, the time left shared: bench-engine-<i>.json), TRACE=1 (first, one
# T=1 and one T=5 step kernel by kernel on the GPU's clock, native/bench/trace_step.py: $OUT/trace.json, ~40 s of
# the budget; TRACE_ARGS="--top-k 32": its steps on the server's path, no rows of logits copied). The device returns
# at most 8 files: build.log, nvidia-smi.txt, synth.*, wheels.log and the benches' logs (their figures are in the
# JSON and this script's output) come back packed in $OUT/misc.tgz, so that four variants' JSON, the while-synth
# log and report and misc.tgz fit (on 2026-12-02 four variants' logs crowded out the while-synth results).
set -o pipefail
START=$(date +%s)
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-570}
SYNTH_CODES=${SYNTH_CODES:-random}
MODEL=${MODEL:-/tmp/full-$SYNTH_CODES.gguf}  # the bench JSON's model path says which codes it measured
export PYTHONUNBUFFERED=1
say() { echo "[gpu_bench_engine +$(( $(date +%s) - START ))s] $*"; }

. scripts/device_common.sh
device_wheels || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,clocks.max.sm \
  --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
say "cpus $(nproc), free disk in $(dirname "$MODEL"): $(df -h --output=avail "$(dirname "$MODEL")" | tail -1)"

# 1. the model, in the background (the long part)
SYNTH_PID=
if [ -s "$MODEL" ]; then
  say "reusing $MODEL ($(stat -c %s "$MODEL") bytes)"
else
  if ! ls .cache/openjet/llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf > /dev/null 2>&1; then
    say "no vocabulary for the full model: carry .cache/openjet/llama_cpp_python-0.3.36 (see the top of $0)"; exit 2
  fi
  say "writing the full synthetic model to $MODEL"
  PIN_SYNTH=() PIN_TESTS=()
  NCPU=$(nproc) TCPU=${WHILE_SYNTH_CPUS:-4}
  if [ -n "${WHILE_SYNTH:-}" ] && command -v taskset > /dev/null && [ "$NCPU" -gt $((TCPU + 2)) ]; then
    PIN_TESTS=(taskset -c "0-$((TCPU - 1))") PIN_SYNTH=(taskset -c "$TCPU-$((NCPU - 1))")
  fi
  "${PIN_SYNTH[@]}" python3 -m openjet_launcher synth --preset full --quiet --codes "$SYNTH_CODES" \
    ${PIN_SYNTH:+--workers $((NCPU - TCPU))} "$MODEL" > "$OUT/synth.json" 2> "$OUT/synth.err" &
  SYNTH_PID=$!
fi

# 2. the library for this GPU's architecture, meanwhile
read -r -a ENGINE_OPTS_A <<< "${ENGINE_OPTS:-}"  # CMake options of the library (a measurement's build)
if ! build_engine /tmp/b "$OUT/build.log" "${ENGINE_OPTS_A[@]}"; then
  [ -n "$SYNTH_PID" ] && kill "$SYNTH_PID"
  say "build failed"; exit 1
fi
say "library built for sm_$(gpu_arch)"

export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so
if [ -n "${WHILE_SYNTH:-}" ]; then  # (also when the model was reused, on a warm machine: then before the bench)
  say "while the model is written: $WHILE_SYNTH"
  OPENJET_REQUIRE_GPU=1 OPENJET_GPU_REPORT="$OUT/while-synth.jsonl" timeout -k 10 "${WHILE_SYNTH_S:-200}" \
    "${PIN_TESTS[@]}" bash -c "$WHILE_SYNTH" \
    > "$OUT/while-synth.log" 2>&1
  say "done (rc $?): $(tail -1 "$OUT/while-synth.log")"
fi

if [ -n "$SYNTH_PID" ]; then
  wait "$SYNTH_PID"; rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$MODEL" ]; then
    tail -30 "$OUT/synth.err"; say "synth failed (rc $rc)"; exit 1
  fi
  say "model written: $(cat "$OUT/synth.json")"
fi

# 3. the benchmark, until the deadline
DEADLINE=$((START + BUDGET_S))
if [ -n "${BENCH_CMD:-}" ]; then  # another benchmark on the model instead (MODEL in its environment)
  say "instead of bench_decode: $BENCH_CMD"
  MODEL=$MODEL timeout $((DEADLINE - $(date +%s) + 25)) bash -c "$BENCH_CMD"; say "done (rc $?)"
  (cd "$OUT" && tar -czf misc.tgz --remove-files build.log nvidia-smi.txt synth.json synth.err wheels.log 2>/dev/null)
  exit 0
fi
# VARIANTS: environment settings to bench in turn, one bench-engine-<i>.json each ("OPENJET_PDL=0 OPENJET_PDL=1";
# "A=1,B=2" sets two), the time left shared out evenly; unset: one run, bench-engine.json.
if [ "${TRACE:-0}" = 1 ]; then  # what each kind of kernel adds to the step, as PDL overlaps them
  # shellcheck disable=SC2086  # TRACE_ARGS: more of trace_step.py's arguments (gpu_pending.sh trace_bench)
  timeout -k 10 120 python3 native/bench/trace_step.py "$MODEL" --t 1,5 --steps 5 ${TRACE_ARGS:-} \
    --out "$OUT/trace.json" 2> "$OUT/trace.log"
  say "trace_step (rc $?)"; tail -27 "$OUT/trace.log"
fi
read -r -d '' -a VARS <<< "${VARIANTS:-}" || true  # (-d '': spaces and newlines both separate them)
[ ${#VARS[@]} -gt 0 ] || VARS=("")
summarise() {  # the figures that matter, in the output's tail
python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no result: {e}")
print("commit", d.get("commit"), "source", d.get("source_sha256"), "copy GB/s", d.get("copy_gbps"),
      "tensor-core TFLOP/s", d.get("tensor_core_tflops"),
      "elapsed", d.get("elapsed_s"), "complete", d.get("complete"), "pdl", d.get("pdl"))
for kv, r in d["runs"].items():
    m = r.get("memory") or {}
    print(f"{kv}: load {r.get('load_s')} s, engine {m.get('total_bytes', 0) / 2**30:.2f} GiB, "
          f"device {r.get('device_memory')}, error {r.get('error')}")
    for x in r["decode"]:
        tk = x.get("top_k") or {}
        print(f"  ctx {x['context']:>6} T {x['t']}: {x['median_ms']:8.3f} ms {x['tok_s']:8.1f} tok/s "
              f"roofline {x['roofline_share'] * 100:5.1f} % x{x['cost_vs_t1']}"
              + (f"; top-k path {tk['median_ms']:8.3f} ms {tk['roofline_share'] * 100:5.1f} % x{tk['cost_vs_t1']}"
                 if tk else ""))
    for p in r["prefill"]:
        print(f"  prefill {p['tokens']:>6}: {p['seconds']:7.2f} s {p['tok_s']:8.1f} tok/s {p.get('tflops')} TFLOP/s "
              f"(tensor-core share {p.get('tensor_core_share')})")
    sp = r.get("speculation")
    if sp:
        g = sp.get  # (a part that failed has no figures: errors says why)
        print(f"  speculation at {g('context')}: draft {g('draft_ms_full')} ms full / {g('draft_ms_subset')} ms "
              f"{g('draft_rows')} rows, chained {g('draft_chain_ms_subset')}; verify {g('verify_ms')}, k = 1 "
              f"{g('verify_ms_k1')}; accept {g('accept_ms')} ms; greedy cycles {g('cycle_greedy_ms')}; plain "
              f"{g('tok_s_plain')} tok/s; no-draft cycle {g('cycle_greedy_0_roofline_share')} of its roofline; "
              f"best at acceptance 0.7: {g('best_at_acceptance_0.7')}; errors {g('errors')}")
    for x in r["decode"]:
        if x.get("topk_profile_ms_by_k"):
            print(f"  ctx {x['context']} T {x['t']}: device top-k ms a step by k {x['topk_profile_ms_by_k']}")
    for s in r["skipped"]:
        print("  skipped", s)
print("footprint", json.dumps({k: v for k, v in (d.get("footprint_32k_q8_0") or {}).items() if k != "assumption"}))
print("acceptance", json.dumps(d.get("acceptance")))
PY
}
for i in "${!VARS[@]}"; do
  v=${VARS[$i]}
  name=bench-engine; [ ${#VARS[@]} -gt 1 ] && name=bench-engine-$i
  left=$((DEADLINE - $(date +%s)))
  until_t=$(( $(date +%s) + left / (${#VARS[@]} - i) ))
  say "bench ${v:+($v) }until +$((until_t - START))s (${left} s left in all)"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  env ${v//,/ } timeout $(( until_t - $(date +%s) + 25 )) python3 native/bench/bench_decode.py --preset full \
    --model "$MODEL" --deadline "$until_t" --out "$OUT/$name.json" ${BENCH_ARGS:-} 2>&1 >/dev/null |
    tee "$OUT/$name.log"
  say "bench finished (rc $?)"
  echo "== ${v:-default settings}"
  summarise "$OUT/$name.json"
done
# (the files that exist: a reused model leaves no synth.*, and tar would fail on them)
(cd "$OUT" && ls -d build.log nvidia-smi.txt synth.json synth.err wheels.log bench-engine*.log trace.log 2>/dev/null |
  tar -czf misc.tgz --remove-files -T -)
