export WHILE_SYNTH='python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_gemv.py -k "pack or swiglu or gate_and_up or dense" 2>&1 | tail -4; python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_gdn.py 2>&1 | tail -4; python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_engine.py -k "swiglu or gate_and_up or dense or two_phase or checkpoint" 2>&1 | tail -6'
export WHILE_SYNTH_S=120
export VARIANTS="OPENJET_PREFILL_SWIGLU=split OPENJET_PREFILL_SWIGLU=epilogue"
export BENCH_ARGS="--kv q8_0 --ctx 0 --t 1 --prefill 4096,32768 --prefill-rows 4096 --prefill-profile 4096 --steps 5"
export BUDGET_S=270
bash scripts/gpu_bench_engine.sh
