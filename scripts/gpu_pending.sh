#!/usr/bin/env bash
# The device checks and timings of code written without a GPU (PLAN=graph, PLAN=attn and PLAN=cycle ran on an H100 on
# 2026-12-05, PLAN=pdl, steppack, fold and foldstep on 2026-12-06: NOTES_gemv.md. Next: graph and attn on an H200 for
# the acceptance figures), one device call per plan, each through scripts/gpu_bench_engine.sh (the build, the `full`
# synthetic model, the plan's GPU tests on the idle GPU while the model is written, then its benchmarks on the model):
#
#   run(carry=[".whl", ".cache/openjet/llama_cpp_python-0.3.36"], timeout_s=600, kind="nvidia-h200" where status
#       lists it (the 499afb1 figures are the H200's), command="OPENJET_COMMIT=<the hash, written out> PLAN=cycle bash
#       scripts/gpu_pending.sh")
#
# Carry ".prebuilt" too where `bash scripts/prebuild_device.sh` made it for this tree (the build skipped: ~1-2 minutes
# of each call; device_common.sh build_engine). Before the first call, here: `bash scripts/fetch_device_wheels.sh`
# (.whl) and the vocabulary (gpu_bench_engine.sh's
# header: OPENJET_CACHE=$PWD/.cache/openjet python -c "...full_vocab()"); both are git-ignored, a fresh checkout
# lacks them, and a missing carry path is not sent (the call then stops at once, saying so). Send the next plan within
# ~30 s of one returning to reuse the warm machine (its model is reused; the plan's tests still run).
#
# PLAN=graph the scratch rows test (prefill_rows below a step's 8 rows), then the T=1 / T=5 step as it is (the
#            baseline, OPENJET_BENCH_GRAPH=0), with OPENJET_BENCH_GRAPH=1 (the trunk replayed as a CUDA graph: what the
#            stream launches cost; its bit test runs first) and with OPENJET_BENCH_SKIP_NORM_PACKS=4 (the swiglu packs'
#            bound).
# PLAN=attn  OPENJET_ATTN_PIPE (attn_decode.cuh's planned tile pipeline): its bit tests (kernel and engine), one
#            attention layer of the 27B alone at 32K (pipe 0 / 1), the 32K step at T=1 / T=5 with pipe 0, 1 and
#            1 at two stages (the copies' part apart from the ring's), and issue 7's n_draft identity on the full
#            model. ~9 minutes.
# PLAN=cycle OPENJET_BENCH_GRAPH=1's graphs (the trunk, and whole greedy cycles, openjet_engine_cycle_greedy, replayed
#            at other lengths: the attention launches read the length on the device): their bit tests with the
#            one-call cycle's and the decode attention's (its kernels read the length through attn_cache_len now),
#            then native/bench/bench_cycle.py (cycles of 0..7 drafts with the graph off and on). ~4 minutes.
# PLAN=ffn   OPENJET_FFN_TMA (the persistent FFN on producer-warp blocks, written 2026-12-05 without a GPU): its bit
#            tests (-k FFN_TMA: =1..4 against 0; =4 on grids of 1, 46 and 82 SMs; the in-kernel profile in order at
#            =2 and =4), then the T=1 / T=5 step with it off, =1 (the FFN) and =4 (from the tail to the next layer's
#            input projections; the team kernel's level 1 was 12.7 against 9.3 ms: MEGAKERNEL.md), each JSON with
#            the launches' phase profile (persistent_ffn_us_per_launch); greedy cycles of 0 and 4 drafts at =0 and =4
#            (bench_cycle, in cycles.tgz: the MTP head's FFN takes it too); last, =3 (no projections) and the default
#            with OPENJET_GEMV_CARVEOUT=max (the producer-warp GEMVs asking for the largest carveout). ~7 minutes.
# PLAN=steppack OPENJET_GDN_STEP_PACK (the GDN step packs its own output: one launch fewer a GDN layer) and
#            OPENJET_ADD_NORM_MAX_EST (the add-norm cluster pack's scale from a bound where it pins the max's binade:
#            the max's own cluster exchange skipped), both written 2026-12-06: their bit tests
#            (test_decode_experiments_keep_every_bit, test_the_add_norm_packs_max_estimate_keeps_its_bits), the
#            T=1 / T=5 step with both off / on twice (alternating), then a trace with both on (each kernel's marginal
#            says which gained). ~4 minutes.
# PLAN=fold  the fold (gemv_fold.cuh: an add-norm pack made by the GEMVs on each side of it, a declared numerics change)
#            alone, no model (~1.5 minutes): tests/test_gpu_fold.py (Q4_K, Q5_K, Q6_K at t = 1, 5, 8) and the pack-chain
#            bench's test, then pack-chain.json with the fold among its middles (fold: A's epilogue and B's own pack at
#            T=1, launch_fold_pack at T=5; fold_out_only / fold_in_only: its halves). Ran on the H100 at 18cd7c9: T=1
#            15.12 us a chain (none 15.48, the add-norm pack 21.15).
# PLAN=foldstep OPENJET_FOLD=0 / 1 in the engine (the add-norms inside the trunk made by the GEMVs around them; the
#            default since ea1971a, which it timed on the H100): while the model is written, tests/test_gpu_fold.py
#            and the engine's fold cases
#            (the teacher-forced reference test, the n_draft identity on the small model) with the pack-chain bench's
#            test; then the T=1 / T=5 step with the fold off / on twice (alternating), a trace with it on (127 of the
#            129 add-norm packs should be gone, the GEMVs around them a little slower), and the n_draft
#            identity on the full model. ~7 minutes. (Run PLAN=fold first where its kernels changed: ~1.5 minutes.)
# PLAN=gdnprobe  where a T=1 GDN step's ~13 us go (the step's largest piece that is not a GEMV: 48 a step, ~630 us
#            of a 7.9 ms T=1 step on the H100 at 793a941; ran at eed174c: NOTES_gemv.md, forty-first session): no tests; the T=1 trace at the default, with
#            OPENJET_GDN_FUSED=0 (beta / alpha by their own F32 launches: the step without its projections) and with
#            OPENJET_GDN_STEP_PACK=0 (without its own pack's meeting), each in trace-<name>.json; then Nsight Compute
#            on three T=1 GDN steps of the default (speed of light, warp states, scheduler, memory; ncu-gdn.txt).
#            ~4 minutes.
# PLAN=gdnclock  the GDN step's phases on the GPU's clocks inside the step (OPENJET_BENCH_GDN_PROBE: written on
#            2026-12-06 without a GPU): its test, the staged form's and the own pack's bit tests (GDN_STAGED,
#            GDN_STEP_PACK) and the fused replay's, then native/bench/gdn_probe.py at T=1
#            and T=5 (gdn-probe.json: each phase's us, median and largest over the 48 blocks; when the blocks came and
#            passed their PDL wait), then the T=1 / T=5 trace. ~4 minutes.
# PLAN=bound what the GEMVs' arithmetic costs the step (OPENJET_BENCH_GEMV_NO_MATH=1: the producer-warp GEMVs stream
#            their weights and compute nothing; WRONG outputs): the T=1 / T=5 step with it off / on twice
#            (alternating), then a trace with it on. Ran on the H100 at 75138b2 (T=1 8.02 -> 7.43 ms); on an H200
#            it says how much of issue 6's gap any cut of the arithmetic could close (NOTES_gemv.md, forty-fourth
#            session). No tests. ~4 minutes.
# PLAN=introws  (ran on an H200 at 3bb4f85, one round: NOTES_gemv.md) OPENJET_GEMV_INT=3 (the Q4_K, Q5_K and Q6_K decode GEMVs on
#            the integer GEMV's producer-warp form, reading the integer pack the cluster packs write beside the fp16
#            one under the row's scale; the fold, the swiglu's and the GDN step's own packs off): its tests (teacher-
#            forced against the reference, the n_draft identity, the producer-warp form's bits, the refusal), then
#            the T=1 / T=5 step of the packs as launches with fp16 GEMVs (what =3 runs on), =3 and the default, once
#            (INTROWS_ROUNDS=2: the first two again and the no-math bound). ~5 minutes (~6.5 at two rounds). (It also
#            timed OPENJET_BENCH_GEMV_INT=1, the integer arithmetic inside the engine's forms, removed since.)
# PLAN=libab  a baseline library against this tree's on the `full` model: the T=1 / T=5 step with each, alternating
#            twice, then the new one under each of LIBAB_MORE's settings (e.g. "OPENJET_GEMV_TMA=1") once; LIBAB_TESTS
#            (pytest arguments, at most LIBAB_TESTS_S s) while the model is written. The baseline: `git archive <commit>
#            CMakeLists.txt native pyproject.toml` into .base/, then `PREBUILD_SRC=.base bash scripts/prebuild_device.sh`
#            (its library in .base/.prebuilt), carried with .prebuilt. Same-bits changes are checked by
#            gpu_same_bits.sh first. ~8 minutes. LIBAB_DRAFTS=N: then trace_step.py's chain of N greedy drafts (the new
#            library, context 64, a 32,768-row draft vocabulary) in trace-drafts.json.
# PLAN=drafts  that trace alone (DRAFTS=4 drafts), the model written or reused: ~4 minutes, ~1 on a warm machine;
#            DRAFTS_TESTS (pytest arguments, at most DRAFTS_TESTS_S s) while the model is written, as libab's.
# PLAN=gdnlate  OPENJET_GDN_LATE (gdn_decode.cuh kLateLaunch: the GDN step's state loads before its fused
#            projections, the next kernels let in past its first barrier): its bit test while the model is written, the
#            GDN probe (gdn_probe.py) with it off and on, then the T=1 / T=5 step off / on alternating twice. ~3.5 minutes
#            (ran on an H100 at 417fe8c, NOTES_gemv.md fifty-third session; the default since).
# PLAN=group  OPENJET_GEMV_GROUP (gemv_tma.cu launch_gemv_tma_group: a GDN layer's Q6_K qkv and Q4_K z, attention's q,
#            k and v, each in one launch): its bit test while the model is written, the T=1 / T=5 step off / on
#            alternating twice, a trace with it on. ~3.5 minutes (ran on an H100 at b1b38d2, NOTES_gemv.md fifty-fifth
#            session; the default since).
# PLAN=attnpack  OPENJET_ATTN_OWN_PACK (attn_decode.cu attn_combine_pack_kernel: the attention combine packs its own
#            output, no pack launch before the out projection): as PLAN=group (ran on an H100 at ab986ba, NOTES_gemv.md
#            fifty-fifth session; the default since).
# PLAN=foldrows  OPENJET_FOLD_ROWS and OPENJET_SWIGLU_ROWS (gemv_fold_device.cuh fold_rows_make, swiglu_rows_make,
#            written 2026-12-08 without a GPU: at t > 1 the fold's B makes its rows' pack itself, its first t blocks a
#            row each while the rest wait for their count, instead of the fold's pack launch before it; the down
#            projection makes its swiglu pack itself, its first 64 blocks meeting for the rows' maxima): their bit
#            tests (kernel-level in test_gpu_fold.py, on one SM's grid too; the engine's) while the model is written,
#            the T=1 / T=5 step off, with FOLD_ROWS, with both, a trace with both (a T=5 step's 127 fold_pack and 64
#            swiglu pack launches gone; TRACE_ARGS passed on), then the three steps again (not with ROUNDS=1). ~7
#            minutes (ROUNDS=1: ~5).
# PLAN=swigluprice  where the swiglu packs' cost lies (OPENJET_BENCH_SKIP_SWIGLU_PACK=1 took the H100's T=1 step 7.72-7.87
#            -> 7.38 ms and T=5 9.85-9.95 -> 9.55): the T=1 / T=5 trace as it is, then with that switch. ~3 minutes.
# PLAN=immastress  the integer GEMV's three forms (cp.async one block a tile, cp.async resident grid, producer warp),
#            then the fp16 GEMV's (cp.async, the producer-warp default and its forms 1 and 2), each called many times on
#            one input, every call against numpy's emulation and the others' bits (native/bench/imma_form_stress.py;
#            on an H100 at f851ef7 the integer producer-warp form was wrong in 22 of 30 Q6_K T=8 calls, before the
#            consumers' proxy fence of 8481f9f). No model. ~5 minutes (STRESS_REPS, STRESS_S).
# PLAN=boundary  the boundary benches alone (no model, ~3 minutes): their tests and test_gpu_pdl.py's (the cluster
#            packs' bits against the one-block packs: the add-norm pack copies its weights before its wait since
#            2026-12-06, passed on the H100 at 805fb4a), then boundary-pdl-{1,0}.json and pack-chain.json (bench_pack_chain: what an
#            add-norm pack between two decode GEMVs costs, against an empty kernel of one block, of a cluster, of 8
#            blocks) as PLAN=pdl's.
# PLAN=forms  OPENJET_GEMV_TMA=2 against auto (every producer-warp launch in form 2's four blocks a SM, the fold's,
#            the group and the swiglu pairs' too since the fifty-eighth session): its bit tests while the model is
#            written, the T=1 / T=4 / T=5 step alternating twice, then a trace of each (trace-auto.json,
#            trace-form2.json; TRACE_ARGS passed on, e.g. "--top-k 32"). For the H200, where the consumer warps bound
#            the GEMVs. ~7 minutes.
# PLAN=sampled  the sampled path's three changes of the fifty-ninth session (ran on an H100 at d6801d2; NOTES_gemv.md):
#            OPENJET_TOPK=warp (topk.cu's networks on shuffles over each warp's candidates, the default since) against
#            least; the step's small outputs through pinned memory (f9cf9f7); openjet_engine_cycle_sampled (a sampled
#            cycle in one call, the verdict on the device; CudaEngine.native_sampled_cycle, on since). While the model
#            is written: test_gpu_topk.py (every form) and the engine's top-k, decode_top / verify_top, profile,
#            bad-argument, sampled-cycle and sampled chi-square tests. Then the T=1 / T=5 step with each top-k form
#            (bench_decode's top-k path, and its speculation section's draft_chain_ms_sampled, cycle_sampled_ms and
#            cycle_sampled_one_call_ms: each sampled draft ranks its 32,768 rows with the form), a trace of each on the
#            server's path (trace-least.json, trace-warp.json: --top-k 32; at f96c0f1 on the H100 the top-k's chunks
#            ended ~75 us after the lm_head, and the T=5 step's GPU idled 82.5 us between the top-k and the MTP rows,
#            which the pinned outputs should remove), then the two timings again (last: the first round answers if time
#            runs out). ~7 minutes.
# PLAN=pdl   The GEMV tests (tests/test_gpu_gemv.py), test_gpu_pdl.py's and the boundary benches' while the model is
#            written; the boundary benches (bench_boundary.cu: a launch's hand-over under PDL against a grid barrier's
#            round, no work on either side, on several grids: boundary-pdl-{1,0}.json; bench_pack_chain:
#            pack-chain.json, both in boundary.tgz); the default T=1 / T=5 (OPENJET_PDL=1); trace.json (trace_step.py:
#            one T=1 and one T=5 step kernel by kernel on the GPU's clock, as PDL overlaps them, and what each kind of
#            kernel adds to the step); then T=1 / T=5 with programmatic dependent launch off, OPENJET_FFN_TMA=0 and =1:
#            whether the persistent FFN's loss (=1: 10.62 against 8.99 ms at 9aad5a6 on an H100) is in the kernel or
#            in how it overlaps its neighbours (its in-kernel profile counts from the first block's start, which PDL
#            moves before the previous kernel's end). ~7 minutes.
# Results in $OUT: the JSON of each timing, logs.tgz (every log and test report: the device returns at most 8 files),
# misc.tgz (the build's); copy the JSON worth keeping to bench/results.
# Internal: `bash scripts/gpu_pending.sh graph-bench|attn-bench|cycle-bench` is the plan's BENCH_CMD (MODEL and OUT set).
set -o pipefail
cd "$(dirname "$0")/.."

# One timing of bench_decode on $MODEL under the environment $1 (e.g. "OPENJET_BENCH_GRAPH=1"; "," joins two),
# the rest of the arguments its own; $OUT/<name>.json, and a line a T in the output.
timing() {
  local env=$1 name=$2; shift 2
  # shellcheck disable=SC2086  # env is a list of assignments
  env ${env//,/ } timeout -k 10 100 python3 native/bench/bench_decode.py --preset full --model "$MODEL" --kv q8_0 \
    --prefill none --prefill-profile 0 --steps 10 --profile-steps 2 --budget-s 75 --out "$OUT/$name.json" "$@" \
    > /dev/null 2> "$OUT/$name.log"
  echo "== $env (rc $?)"
  python3 - "$OUT/$name.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no result: {e}")
if d.get("skipped"):
    print(f"  skipped: {d['skipped']}")
for r in d["runs"].values():
    for x in r["decode"]:
        top = (x.get("top_k") or {}).get("median_ms")
        prof = {k: v for k, v in (x.get("profile_ms_per_step") or {}).items() if k in ("norm", "ffn", "attn.core")}
        print(f"  ctx {x['context']} T {x['t']}: {x['median_ms']} ms (top-k path {top}, enqueue "
              f"{x.get('enqueue_ms')} ms) {prof}")
PY
}

# timing for each environment after `--`, the arguments before it its own; the JSON named after the environment and
# the suffix $1.
each_timing() {
  local suffix=$1 args=() v; shift
  while [ "$1" != -- ]; do args+=("$1"); shift; done; shift
  for v; do timing "$v" "$(echo "$v" | tr 'A-Z=,' 'a-z--')$suffix" "${args[@]}"; done
}

pack_logs() {  # the device returns at most 8 files: every log and test report in one archive, the JSON apart
  (cd "$OUT" && ls ./*.log ./*.jsonl 2>/dev/null | tar -czf logs.tgz --remove-files -T -)
}

gpu_tests() {  # pytest -m gpu with the report and log in $OUT/<name>.*
  local name=$1 limit=$2; shift 2
  OPENJET_GPU_REPORT=$OUT/$name.jsonl timeout -k 10 "$limit" python3 -m pytest -q -m gpu "$@" > "$OUT/$name.log" 2>&1
  echo "== $name (rc $?): $(tail -1 "$OUT/$name.log")"
}

# A plan's call: gpu_bench_engine.sh with the GPU tests $2 (at most $1 s) while the model is written, then the
# plan's benchmarks ($3: `bash scripts/gpu_pending.sh $3`) instead of bench_decode's default set.
plan() {
  export WHILE_SYNTH_S=$1 WHILE_SYNTH="python3 -m pytest -q -m gpu $2" BENCH_CMD="bash scripts/gpu_pending.sh $3"
  exec bash scripts/gpu_bench_engine.sh
}

# A boundary with no work on either side: a launch's hand-over under PDL against a grid barrier's round, on the
# producer-warp FFN's grid (3 blocks a SM of 160 threads, 4 warps arriving) and others, then on that grid with every
# warp reading the same row after the boundary (10 and 60 KB, from its start or each warp from a piece of its own),
# and with one poller a block (bench_boundary.cu):
# $OUT/boundary-pdl-1.json, and -pdl-0 with PDL off.
boundary_bench() {
  local pdl
  for pdl in 1 0; do  # (the hand-over with PDL and without: a plain launch boundary)
    OPENJET_PDL=$pdl timeout -k 10 60 python3 - > "$OUT/boundary-pdl-$pdl.json" 2> "$OUT/boundary-pdl-$pdl.log" <<'PY'
import json, os, statistics
from openjet_launcher.engine import kernels_test as kt
rows = []
# (blocks a SM, threads, arrivals a block, bytes every warp reads after the boundary, one poller a block, rotated reads)
shapes = [(1, 160, 1, 0, 0, 0), (1, 160, 4, 0, 0, 0), (3, 160, 1, 0, 0, 0), (3, 160, 4, 0, 0, 0),
          (4, 128, 4, 0, 0, 0), (2, 512, 16, 0, 0, 0)]
for rot in (0, 1):  # (then every warp reads a row: T=1's fp16 x; the removed fold's ~60 KB)
    shapes += [(3, 160, 4, b, 0, rot) for b in (10240, 61440)]
shapes += [(3, 160, 4, 0, 1, 0), (3, 160, 1, 0, 1, 0), (3, 160, 4, 10240, 1, 1)]  # (one poller a block)
for per_sm, threads, arrive, read, block_wait, rot in shapes:
    r = kt.bench_boundary(per_sm, threads, arrive, 200, 5, read, block_wait, rot)
    rows.append({"blocks_per_sm": per_sm, "threads": threads, "arrivals_per_block": arrive, "read_bytes": read,
                 "block_wait": block_wait, "rotated": rot, "handover_us": statistics.median(r["handover_us"]),
                 "barrier_us": statistics.median(r["barrier_us"])})
print(json.dumps({"bench": "bench_boundary", "pdl": os.environ["OPENJET_PDL"] != "0", "rows": rows}, indent=1))
PY
    echo "== bench_boundary OPENJET_PDL=$pdl (rc $?)"
    python3 -c "import json, sys; [print(' ', r) for r in json.load(open(sys.argv[1]))['rows']]" "$OUT/boundary-pdl-$pdl.json"
  done
}

# What the work between two decode GEMVs costs (bench_pack_chain: graphs of GEMV -> middle -> GEMV, Q4_K 5120 x 5120,
# T=1 and T=5; the middle none, the engine's add-norm pack, an empty kernel of one block, of a cluster of 8, of 8
# blocks): the pack's marginal cost split into its launch (a cluster's or not) and its work. $OUT/pack-chain.json.
pack_chain_bench() {
  timeout -k 10 120 python3 - > "$OUT/pack-chain.json" 2> "$OUT/pack-chain.log" <<'PY'
import json, statistics
import numpy as np
from openjet_launcher.engine import kernels_test as kt
from openjet_launcher.model.quants import quantize
k = 5120
raw = quantize(np.random.default_rng(5).standard_normal((k, k), dtype=np.float32), kt.QTYPES["Q4_K"])
rows = []
for t in (1, 5):
    for middle in kt.PACK_CHAIN_MODES:
        us = kt.bench_pack_chain(kt.QTYPES["Q4_K"], raw, k, t, middle, 8, 100, 5)
        rows.append({"t": t, "middle": middle, "us_per_chain": statistics.median(us)})
print(json.dumps({"bench": "bench_pack_chain", "qtype": "Q4_K", "k": k, "rows": rows}, indent=1))
PY
  echo "== bench_pack_chain (rc $?)"
  python3 -c "import json, sys; [print(' ', r) for r in json.load(open(sys.argv[1]))['rows']]" "$OUT/pack-chain.json"
}

# The T=1 / T=5 step with the switch $1 off, on, off, on (alternating: the JSON suffixed -a, -b), then a trace (it on).
alternate_twice() {
  each_timing -a --ctx 0 --t 1,5 -- "$1=0" "$1=1"
  each_timing -b --ctx 0 --t 1,5 -- "$1=0" "$1=1"
  (export "$1=1"; trace_bench)
}

# A chain of $1 greedy MTP drafts of $MODEL (context 64, a 32,768-row draft vocabulary) on the GPU's clock, kernel by
# kernel (native/bench/trace_step.py --drafts): $OUT/trace-drafts.json.
drafts_trace() {
  timeout -k 10 90 python3 native/bench/trace_step.py "$MODEL" --t 1 --ctx 64 --drafts "$1" --steps 3 \
    --out "$OUT/trace-drafts.json" 2> "$OUT/trace-drafts.log"
  echo "== trace_step --drafts $1 (rc $?)"; tail -28 "$OUT/trace-drafts.log"
}

# One T=1 and one T=5 step of $MODEL on the GPU's clock, kernel by kernel as they overlap (native/bench/trace_step.py:
# CUPTI through torch.profiler): what each kind of kernel adds to the step. $OUT/trace.json.
# TRACE_ARGS: more of trace_step.py's arguments (e.g. "--top-k 32": the server's path, without the ~0.46 ms of idle
# that copying T=5's rows of logits to the host puts in the T=5 step; the traces before 2026-12-07 copy them).
# $1: the files' name (default trace).
trace_bench() {
  local name=${1:-trace}
  # shellcheck disable=SC2086  # TRACE_ARGS is a list of arguments
  timeout -k 10 120 python3 native/bench/trace_step.py "$MODEL" --t 1,5 --steps 5 ${TRACE_ARGS:-} \
    --out "$OUT/$name.json" 2> "$OUT/$name.log"
  echo "== trace_step $name (rc $?)"; tail -28 "$OUT/$name.log"
}

case "${1:-${PLAN:-}}" in
  graph)
    plan 150 "tests/test_gpu_engine.py tests/test_gpu_gdn.py -k 't_tokens_in_one_call or producer_warp_gemv_keeps or prefill_chunk_below or seeded_sampled_answer or trunk_graph_replays'" graph-bench ;;
  graph-bench)
    trap pack_logs EXIT  # also when the outer timeout ends this part: loose logs would crowd out the JSON
    each_timing "" --ctx 0 --t 1,5 -- OPENJET_BENCH_GRAPH=0 OPENJET_BENCH_GRAPH=1 OPENJET_BENCH_SKIP_NORM_PACKS=4 ;;
  attn)
    plan 150 "tests/test_gpu_attn.py tests/test_gpu_engine.py -k 'planned_tile_pipeline or decode_experiments and ATTN_PIPE'" attn-bench ;;
  attn-bench)
    trap pack_logs EXIT
    for pipe in 0 1; do  # one attention layer of the 27B (24 q heads, 4 kv heads, q8_0) at 32K, alone
      OPENJET_ATTN_PIPE=$pipe timeout -k 10 60 python3 - <<'PY' 2>&1 | tail -4
import os, statistics
from openjet_launcher.engine import kernels_test_attn as ka
for t in (1, 5, 8):
    us = statistics.median(ka.bench_attn_decode(ka.KV_TYPES["Q8_0"], 24, 4, 32768, t, 4, 20, 5))
    kv_mb = ka.kv_bytes_read(ka.KV_TYPES["Q8_0"], 4, 32768 + t) / 1e6
    print(f"OPENJET_ATTN_PIPE={os.environ['OPENJET_ATTN_PIPE']} 32K T={t}: {us:.1f} us, {kv_mb / us:.2f} TB/s")
PY
    done
    # (--assume-step-ms: the 32K fill's estimate before any step is timed; 15 ms made it ~99 s, past the budget,
    # so the fill and every 32K row were skipped; the fill took 3.9 s at 3e2051f)
    each_timing -32k --ctx 32768 --t 1,5 --assume-step-ms 3 -- \
      OPENJET_ATTN_PIPE=0 OPENJET_ATTN_PIPE=1 OPENJET_ATTN_PIPE=1,OPENJET_ATTN_STAGES=2
    OPENJET_FULL_MODEL=$MODEL gpu_tests n-draft-full 170 tests/test_gpu_engine.py \
      -k "greedy_ids_are_identical_for_every_draft_count and full" ;;
  cycle)
    plan 150 "tests/test_gpu_engine.py tests/test_gpu_attn.py -k 'cycle_graph_replays or trunk_graph_replays or greedy_cycle_in_one_call or t_tokens_in_one_call or row_is_bit_identical or attn_decode_matches or reads_the_real_one'" cycle-bench ;;
  cycle-bench)
    trap pack_logs EXIT
    timeout -k 10 150 python3 native/bench/bench_cycle.py "$MODEL" --out "$OUT/cycle.json" > /dev/null \
      2> "$OUT/cycle.log"
    echo "== bench_cycle (rc $?)"; tail -2 "$OUT/cycle.log" ;;
  ffn)
    plan 170 "tests/test_gpu_engine.py -k FFN_TMA" ffn-bench ;;
  ffn-bench)
    trap pack_logs EXIT
    each_timing "" --ctx 0 --t 1,5 -- OPENJET_FFN_TMA=0 OPENJET_FFN_TMA=1 OPENJET_FFN_TMA=4
    for tma in 0 4; do  # the greedy cycle of 0 and 4 drafts, streamed, with its phase profile (the MTP head's FFN too)
      OPENJET_FFN_TMA=$tma timeout -k 10 90 python3 native/bench/bench_cycle.py "$MODEL" --drafts 0,4 --graph 0 \
        --steps 10 --warmup 2 --out "$OUT/cycle-ffn-tma-$tma.json" > /dev/null 2> "$OUT/cycle-ffn-tma-$tma.log"
      echo "== bench_cycle OPENJET_FFN_TMA=$tma (rc $?)"; tail -1 "$OUT/cycle-ffn-tma-$tma.log"
    done
    # (the device returns at most 8 files: five timings' JSON, these, logs.tgz and misc.tgz)
    (cd "$OUT" && ls cycle-*.json 2>/dev/null | tar -czf cycles.tgz --remove-files -T -)
    each_timing "" --ctx 0 --t 1,5 -- OPENJET_FFN_TMA=3 OPENJET_GEMV_CARVEOUT=max ;;  # (last: the first to go short)
  pdl)
    plan 200 "tests/test_gpu_pdl.py tests/test_gpu_gemv.py tests/test_gpu_engine.py::test_the_boundary_bench_counts_every_launch_and_arrival tests/test_gpu_engine.py::test_the_pack_chain_bench_runs_each_middle_between_two_decode_gemvs" pdl-bench ;;
  steppack)
    plan 150 "tests/test_gpu_engine.py tests/test_gpu_pdl.py -k 'GDN_STEP_PACK or max_estimate or pack_chain_bench_runs'" \
      steppack-bench ;;
  steppack-bench)
    trap pack_logs EXIT
    on=OPENJET_GDN_STEP_PACK=1,OPENJET_ADD_NORM_MAX_EST=1
    each_timing -a --ctx 0 --t 1,5 -- OPENJET_GDN_STEP_PACK=0 $on
    each_timing -b --ctx 0 --t 1,5 -- OPENJET_GDN_STEP_PACK=0 $on
    OPENJET_GDN_STEP_PACK=1 OPENJET_ADD_NORM_MAX_EST=1 trace_bench ;;
  foldstep)
    plan 200 "tests/test_gpu_fold.py tests/test_gpu_engine.py -k 'fold or pack_chain_bench_runs'" foldstep-bench ;;
  foldstep-bench)
    trap pack_logs EXIT
    alternate_twice OPENJET_FOLD
    OPENJET_FULL_MODEL=$MODEL gpu_tests n-draft-full-fold 150 tests/test_gpu_engine.py \
      -k "greedy_ids_are_identical_for_every_draft_count and full-fold" ;;
  bound)
    plan 30 "tests/test_gpu_engine.py -k no_such_test" bound-bench ;;
  bound-bench)
    trap pack_logs EXIT
    alternate_twice OPENJET_BENCH_GEMV_NO_MATH ;;
  introws)
    plan 170 "tests/test_gpu_gemv_imma.py tests/test_gpu_engine.py -k 'producer_warp_form or int-rows or makers_integer_pack'" \
      introws-bench ;;
  introws-bench)  # the packs as launches (what =3 runs on) with fp16 GEMVs, =3, and the default
    trap pack_logs EXIT
    plain=OPENJET_FOLD=0,OPENJET_SWIGLU_SELF=0,OPENJET_GDN_STEP_PACK=0
    each_timing -a --ctx 0 --t 1,5 -- "$plain" OPENJET_GEMV_INT=3 OPENJET_GEMV_INT=0
    [ "${INTROWS_ROUNDS:-1}" -ge 2 ] && each_timing -b --ctx 0 --t 1,5 -- "$plain" OPENJET_GEMV_INT=3 \
      OPENJET_BENCH_GEMV_NO_MATH=1
    (cd "$OUT" && tar -czf timings.tgz --remove-files ./*.json) ;;  # (the device returns 8 files)
  gdnclock)
    plan 150 "tests/test_gpu_engine.py -k 'gdn_probe or (decode_experiments_keep_every_bit and GDN_S) or fused_gdn_replay'" \
      gdnclock-bench ;;
  gdnclock-bench)
    trap pack_logs EXIT
    timeout -k 10 150 python3 native/bench/gdn_probe.py "$MODEL" --t 1,5 --steps 20 --out "$OUT/gdn-probe.json" \
      2> "$OUT/gdn-probe.log"
    echo "== gdn_probe (rc $?)"; tail -4 "$OUT/gdn-probe.log"
    trace_bench ;;
  gdnprobe)
    plan 30 "tests/test_gpu_engine.py -k no_such_test" gdnprobe-bench ;;
  gdnprobe-bench)
    trap pack_logs EXIT
    for v in default OPENJET_GDN_FUSED=0 OPENJET_GDN_STEP_PACK=0; do
      name=${v//=/-}
      (case $v in *=*) export "$v" ;; esac
       timeout -k 10 120 python3 native/bench/trace_step.py "$MODEL" --t 1 --steps 5 --out "$OUT/trace-$name.json" \
         2> "$OUT/trace-$name.log"
       echo "== trace_step $v (rc $?)"; grep -E "untraced|gdn|x gemv_tma_kernel<13|f32" "$OUT/trace-$name.log" | head -8)
    done
    timeout -k 10 200 ncu --clock-control none --kernel-name regex:gdn_step_kernel --launch-skip 96 --launch-count 3 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --section Occupancy --section MemoryWorkloadAnalysis python3 - "$MODEL" > "$OUT/ncu-gdn.txt" 2>&1 <<'PY'
import ctypes, sys
import numpy as np
from openjet_launcher.engine.cuda import CudaEngine
eng = CudaEngine.load(sys.argv[1], n_ctx=4096, kv_type="q8_0")
lib, h = eng._lib, eng._handle
n_vocab = eng.config.shape.n_vocab
logits = np.empty((8, n_vocab), np.float32)
rng = np.random.default_rng(0)
for _ in range(4):  # T=1 decode steps from an empty sequence: 48 GDN launches each at 27B
    ids = rng.integers(0, n_vocab, 1).astype(np.int32)
    if lib.openjet_engine_decode(h, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), 1,
                                 logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), None):
        raise SystemExit(lib.openjet_engine_last_error().decode(errors="replace"))
print("steps ok")
PY
    echo "== ncu (rc $?)"; grep -E "gdn_step_kernel|Duration|Throughput|Issue Slots|Warp Cycles Per Issued|No Eligible|Achieved Occupancy|Registers|Stall|steps ok|ERR|rror" "$OUT/ncu-gdn.txt" | head -60 ;;
  fold)  # the fold (gemv_fold.cuh) alone, no model: its tests, then bench_pack_chain with it among the middles
    trap pack_logs EXIT
    . scripts/device_common.sh
    device_wheels || exit 2
    build_engine /tmp/b "$OUT/build.log" || exit 1
    export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1
    gpu_tests fold-test 90 tests/test_gpu_fold.py tests/test_gpu_engine.py -k "fold or pack_chain_bench_runs"
    pack_chain_bench ;;
  libab)
    plan "${LIBAB_TESTS_S:-30}" "${LIBAB_TESTS:-tests/test_gpu_engine.py -k no_such_test}" libab-bench ;;
  libab-bench)  # the carried baseline library against this tree's, alternating (then LIBAB_MORE's settings once)
    trap pack_logs EXIT
    . scripts/device_common.sh
    mkdir -p /tmp/base-lib
    prebuilt_library .base/.prebuilt /tmp/base-lib/libopenjet.so ||
      { echo "no baseline library in .base/.prebuilt: see PLAN=libab at the top of $0"; exit 2; }
    base=OPENJET_LIBRARY=/tmp/base-lib/libopenjet.so
    for round in a b; do
      timing "$base" "base-$round" --ctx 0 --t 1,5
      timing "" "new-$round" --ctx 0 --t 1,5
    done
    for v in ${LIBAB_MORE:-}; do timing "$v" "new-$(echo "$v" | tr 'A-Z=,' 'a-z--')" --ctx 0 --t 1,5; done
    (cd "$OUT" && tar -czf timings.tgz --remove-files ./*.json)
    if [ "${LIBAB_DRAFTS:-0}" -gt 0 ]; then drafts_trace "$LIBAB_DRAFTS"; fi ;;
  drafts)
    plan "${DRAFTS_TESTS_S:-30}" "${DRAFTS_TESTS:-tests/test_gpu_engine.py -k no_such_test}" drafts-bench ;;
  drafts-bench)
    trap pack_logs EXIT
    drafts_trace "${DRAFTS:-4}" ;;
  gdnlate)
    plan 120 "tests/test_gpu_engine.py -k 'decode_experiments_keep_every_bit and GDN_LATE'" gdnlate-bench ;;
  gdnlate-bench)
    trap pack_logs EXIT
    for v in 0 1; do
      OPENJET_GDN_LATE=$v timeout -k 10 60 python3 native/bench/gdn_probe.py "$MODEL" --t 1,5 --steps 20 \
        --out "$OUT/gdn-probe-late-$v.json" 2> "$OUT/gdn-probe-late-$v.log"
      echo "== gdn_probe OPENJET_GDN_LATE=$v (rc $?)"; tail -2 "$OUT/gdn-probe-late-$v.log"
    done
    each_timing -a --ctx 0 --t 1,5 -- OPENJET_GDN_LATE=0 OPENJET_GDN_LATE=1
    each_timing -b --ctx 0 --t 1,5 -- OPENJET_GDN_LATE=0 OPENJET_GDN_LATE=1 ;;
  group)
    plan 150 "tests/test_gpu_engine.py -k 'decode_experiments_keep_every_bit and GEMV_GROUP'" group-bench ;;
  group-bench)
    trap pack_logs EXIT
    alternate_twice OPENJET_GEMV_GROUP ;;
  forms)
    plan 170 "tests/test_gpu_engine.py -k 'forced_producer_warp_form or (decode_experiments_keep_every_bit and GEMV_TMA)'" forms-bench ;;
  forms-bench)
    trap pack_logs EXIT
    each_timing -a --ctx 0 --t 1,4,5 -- OPENJET_GEMV_TMA=auto OPENJET_GEMV_TMA=2
    each_timing -b --ctx 0 --t 1,4,5 -- OPENJET_GEMV_TMA=auto OPENJET_GEMV_TMA=2
    trace_bench trace-auto
    (export OPENJET_GEMV_TMA=2; trace_bench trace-form2) ;;
  sampled)
    plan 170 "tests/test_gpu_topk.py tests/test_gpu_engine.py -k 'topk or decode_top or verify_top or profile or refuse_bad_arguments or sampled_cycle or sampled_speculation'" sampled-bench ;;
  sampled-bench)
    trap pack_logs EXIT
    each_timing -a --ctx 0 --t 1,5 -- OPENJET_TOPK=least OPENJET_TOPK=warp
    TRACE_ARGS="--top-k 32" trace_bench trace-least
    (export OPENJET_TOPK=warp; TRACE_ARGS="--top-k 32" trace_bench trace-warp)
    each_timing -b --ctx 0 --t 1,5 -- OPENJET_TOPK=least OPENJET_TOPK=warp ;;
  foldrows)
    plan 170 "tests/test_gpu_fold.py tests/test_gpu_engine.py -k 'FOLD_ROWS or SWIGLU_ROWS or rows_made_by_b or own_swiglu_pack'" \
      foldrows-bench ;;
  foldrows-bench)
    trap pack_logs EXIT
    both=OPENJET_FOLD_ROWS=1,OPENJET_SWIGLU_ROWS=1
    each_timing -a --ctx 0 --t 1,5 -- OPENJET_FOLD_ROWS=0 OPENJET_FOLD_ROWS=1 $both
    (export OPENJET_FOLD_ROWS=1 OPENJET_SWIGLU_ROWS=1; trace_bench)
    [ "${ROUNDS:-2}" = 1 ] || each_timing -b --ctx 0 --t 1,5 -- OPENJET_FOLD_ROWS=0 OPENJET_FOLD_ROWS=1 $both ;;
  attnpack)
    plan 150 "tests/test_gpu_engine.py -k 'decode_experiments_keep_every_bit and ATTN_OWN_PACK'" attnpack-bench ;;
  attnpack-bench)
    trap pack_logs EXIT
    alternate_twice OPENJET_ATTN_OWN_PACK ;;
  swigluprice)  # no tests: the T=1 / T=5 trace as it is and without any swiglu pack (WRONG outputs)
    export BENCH_CMD="bash scripts/gpu_pending.sh swigluprice-bench" WHILE_SYNTH=""
    exec bash scripts/gpu_bench_engine.sh ;;
  swigluprice-bench)
    trap pack_logs EXIT
    trace_bench; mv "$OUT/trace.log" "$OUT/trace-default.log"; mv "$OUT/trace.json" "$OUT/trace-default.json"
    (export OPENJET_BENCH_SKIP_SWIGLU_PACK=1; trace_bench) ;;
  immastress)  # the integer GEMV's three forms, many calls each against numpy's emulation (no model, ~2 minutes)
    trap pack_logs EXIT
    . scripts/device_common.sh
    device_wheels || exit 2
    build_engine /tmp/b "$OUT/build.log" || exit 1
    export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1
    for family in imma fp16; do  # (each at most STRESS_S / 2)
      timeout -k 10 $(( ${STRESS_S:-300} / 2 )) python3 native/bench/imma_form_stress.py --family $family \
        --reps "${STRESS_REPS:-40}" --budget-s $(( ${STRESS_S:-300} / 2 - 40 )) --out "$OUT/stress-$family.json" \
        2> "$OUT/stress-$family.log"
      echo "== imma_form_stress --family $family (rc $?)"; grep -v 'calls a form' "$OUT/stress-$family.log" | tail -12
    done ;;
  boundary)  # the boundary bench alone (no model): its test, then the bench
    trap pack_logs EXIT
    . scripts/device_common.sh
    device_wheels || exit 2
    build_engine /tmp/b "$OUT/build.log" || exit 1
    export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so OPENJET_REQUIRE_GPU=1
    gpu_tests boundary-test 60 tests/test_gpu_engine.py -k "boundary_bench_counts or pack_chain_bench_runs"
    gpu_tests pdl-test 120 tests/test_gpu_pdl.py  # (the add-norm cluster pack's bits, its weights copied early)
    boundary_bench
    pack_chain_bench ;;
  pdl-bench)
    trap pack_logs EXIT
    boundary_bench
    pack_chain_bench
    (cd "$OUT" && tar -czf boundary.tgz --remove-files boundary-pdl-*.json pack-chain.json)  # (8 files at most)
    each_timing "" --ctx 0 --t 1,5 -- OPENJET_PDL=1  # (the default, on this card)
    trace_bench
    each_timing "" --ctx 0 --t 1,5 -- OPENJET_PDL=0,OPENJET_FFN_TMA=0 OPENJET_PDL=0,OPENJET_FFN_TMA=1 ;;
  *)
    echo "PLAN=graph, attn, cycle, ffn, pdl, steppack, fold, foldstep, bound, introws, gdnclock, gdnprobe, immastress," \
      "libab, drafts, gdnlate or boundary" \
      "(see the top of $0)" >&2
    exit 2 ;;
esac
