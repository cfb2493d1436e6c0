#!/usr/bin/env bash
# On the (offline) GPU machine: write the `full` synthetic model (exact 27B shapes, ~17.1 GB), time it,
# record its peak memory, and inspect it. Results go to $OUT (or ./out).
#
# Offline needs, carried from a developer machine (see scripts/README in the device notes):
#   .whl/    gguf and platformdirs wheels (pip download ... gguf platformdirs)
#   .cache/  OPENJET_CACHE with llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen35.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
[ -d .cache/openjet ] && export OPENJET_CACHE=$PWD/.cache/openjet
MODEL=${MODEL:-/tmp/openjet-full.gguf}

python3 - "$MODEL" "$OUT" <<'PY'
import json, os, resource, subprocess, sys, time
import threading
model, out = sys.argv[1], sys.argv[2]

def mem_used_gib():   # MemTotal - MemAvailable: all processes, page cache of the written file excluded
    info = dict(l.split(":") for l in open("/proc/meminfo"))
    kib = lambda k: int(info[k].split()[0])
    return (kib("MemTotal") - kib("MemAvailable")) / 2**20

base, peak, done = mem_used_gib(), [0.0], threading.Event()
def sample():
    while not done.wait(0.25):
        peak[0] = max(peak[0], mem_used_gib() - base)
threading.Thread(target=sample, daemon=True).start()
t0 = time.time()
r = subprocess.run([sys.executable, "-m", "openjet_launcher", "synth", "--preset", "full", "--force", model],
                   capture_output=True, text=True)
wall = time.time() - t0
done.set()
peak_children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(r.stderr[-2000:], file=sys.stderr)
summary = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-4000:]}
summary.update({"wall_s": round(wall, 1), "peak_rss_one_process_gib": round(peak_children_kib / 2**20, 2),
                "peak_memory_all_processes_gib": round(peak[0], 2),
                "cpus": os.cpu_count()})
t1 = time.time()
ins = subprocess.run([sys.executable, "-m", "openjet_launcher", "inspect", "--json", model],
                     capture_output=True, text=True)
summary["inspect_s"] = round(time.time() - t1, 1)
summary["inspect_rc"] = ins.returncode
if ins.returncode == 0:
    rep = json.loads(ins.stdout)
    summary["census"] = rep["recipe"]["census"]
    summary["recipe"] = rep["recipe"]["kind"]
    summary["is_qwen38_27b_shape"] = rep["is_qwen38_27b_shape"]
    summary["file_bytes"] = rep["file_bytes"]
    summary["vs_unsloth_17106775008"] = round(rep["file_bytes"] / 17106775008 - 1, 5)
else:
    summary["inspect_error"] = ins.stderr[-2000:]
json.dump(summary, open(os.path.join(out, "synth-full.json"), "w"), indent=2)
print(json.dumps(summary, indent=2))
PY
python3 -m openjet_launcher inspect "$MODEL" | tee "$OUT/inspect-full.txt"
