# Sourced by the scripts/gpu_*.sh device scripts (run from the repository root on the GPU machine):
# $OUT, the carried wheels on PYTHONPATH, the carried vocabulary cache, and the engine built for this GPU.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"

# .whl/ and, where carried, .whl-sdk/ (scripts/fetch_device_wheels.sh) into /tmp/site, ahead of the image's
# own packages.
device_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
      $(ls .whl-sdk/*.whl 2>/dev/null) > "$OUT/wheels.log" 2>&1 || echo "warning: installing .whl/ failed (see wheels.log)"
  fi
  export PYTHONPATH=/tmp/site:$PWD
  if [ -d .cache/openjet ]; then export OPENJET_CACHE=$PWD/.cache/openjet; fi
  if ! python3 -c 'import gguf, platformdirs' 2>/dev/null; then  # stop before the build, not minutes later
    echo "error: gguf / platformdirs are missing: run scripts/fetch_device_wheels.sh here and carry .whl" >&2
    return 1
  fi
}

# Compute capability of GPU 0 as cmake spells it ("90").
gpu_arch() { nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .; }

# prebuilt_library FOLDER PATH: FOLDER's library (libopenjet.so.gz unzipped, or libopenjet.so) written to PATH.
prebuilt_library() {
  if [ -f "$1/libopenjet.so.gz" ]; then gunzip -c "$1/libopenjet.so.gz" > "$2"; else cp "$1/libopenjet.so" "$2"; fi
}

# build_engine DIR LOG [cmake options...]: the library for this GPU's architecture in DIR (outside the tree:
# build outputs inside it do not survive between calls), its log and time in LOG; the log's tail on failure.
# OPENJET_DEVICE_ARCH overrides the architecture (default: the GPU's, 90a-real on Hopper as the release wheels build
# it; CMake takes CUTLASS's headers for its dense prefill GEMM from .cache/cutlass-min: carry that folder, made here
# by `python scripts/fetch_cutlass.py --trim-to .cache/cutlass-min --build <a 90a build>` (16 MB; the full 27 MB
# with the tree passes the 64 MiB carry limit); OPENJET_DEVICE_ARCH=90-real builds without it).
# A library built on the developer machine (scripts/prebuild_device.sh: .prebuilt/, its library gzipped, ~3 MB,
# carried instead of .cache/cutlass-min) stands in for the build when its stamp matches: the same engine sources,
# architecture and options; it saves the build's minute or two of each call. Anything else (no stamp, another tree, a
# library that does not load here) builds as before. (An unzipped .prebuilt/libopenjet.so, as made before 2026-12-07,
# is taken too.)
build_engine() {
  local dir=$1 log=$2; shift 2
  local arch=${OPENJET_DEVICE_ARCH:-$(gpu_arch)-real}
  [ "$arch" = 90-real ] && [ -z "${OPENJET_DEVICE_ARCH:-}" ] && arch=90a-real  # Hopper as released: the dense GEMM
  local stamp
  stamp=$(engine_stamp "$arch" "$@")
  if [ -f .prebuilt/stamp ] && [ "$(cat .prebuilt/stamp)" = "$stamp" ]; then
    rm -rf "$dir"  # no build state of an earlier call beside it (ninja would take the copy as up to date)
    mkdir -p "$dir/native" && prebuilt_library .prebuilt "$dir/native/libopenjet.so" &&
      cp .prebuilt/build.log "$log" 2>/dev/null
    if python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$dir/native/libopenjet.so" 2>> "$log"; then
      echo "engine: the prebuilt library (.prebuilt, stamp $stamp) for $arch" | tee -a "$log"
      return 0
    fi
    echo "engine: the prebuilt library does not load here; building" | tee -a "$log"
    rm -rf "$dir"
  elif [ -f .prebuilt/stamp ]; then
    echo "engine: .prebuilt is stale (stamp $(cat .prebuilt/stamp), this tree $stamp): building"
  fi
  if ! { time { cmake -S . -B "$dir" -G Ninja -DOPENJET_CUDA_ARCHITECTURES="$arch" "$@" &&
                cmake --build "$dir"; }; } > "$log" 2>&1; then
    tail -50 "$log"
    return 1
  fi
  if [ "$arch" = 90a-real ] && ! grep -q "CUTLASS from" "$log"; then
    echo "warning: built without CUTLASS's headers (carry .cache/cutlass-min, or a fresh .prebuilt): no dense prefill" \
      "GEMM, so its tests skip and prefills take the fast kernel"
  fi
}

# engine_stamp ARCH [cmake options...]: one hash over the engine's sources (native/src, native/include, the CMake
# files, the linker map, pyproject.toml: the version compiled in) with the architecture and the options that change
# the library (OPENJET_PTXAS_VERBOSE only changes the log): what .prebuilt/stamp must equal for its library to stand
# in for a build of this tree.
engine_stamp() {
  local arch=$1 opts=() o; shift
  for o in "$@"; do [ "$o" = -DOPENJET_PTXAS_VERBOSE=ON ] || opts+=("$o"); done
  { echo "$arch ${opts[*]}"
    find native/src native/include native/CMakeLists.txt native/exports.map CMakeLists.txt pyproject.toml -type f \
      -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum; } | sha256sum | cut -c1-16
}

# The ncu scripts' start: the wheels, then ncu_engine.
ncu_setup() {
  device_wheels || exit 2
  ncu_engine
}

# The engine built in /tmp/b and loaded from there, and NCU, Nsight Compute's command line on this machine (or exit 2
# saying there is none). After device_wheels.
ncu_engine() {
  build_engine /tmp/b "$OUT/build.log" || exit 1
  export OPENJET_LIBRARY=/tmp/b/native/libopenjet.so
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$NCU" ]; then echo "no ncu on this machine"; exit 2; fi
}

# ncu_kernel LABEL REGEX COUNT CSV -- CMD...: Nsight Compute's sections (speed of light, compute and memory
# workload, occupancy, warp states, scheduler, launch) for the first COUNT launches of kernels matching REGEX while
# CMD runs, appended to CSV; the headline figures and the warp stall reasons per issued instruction (a second pass)
# printed. After ncu_setup.
ncu_kernel() {
  local label=$1 regex=$2 count=$3 csv=$4; shift 5
  local sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
    --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats"
  echo "== $label" | tee -a "$csv"
  # shellcheck disable=SC2086  # sections is a word list
  timeout 150 "$NCU" --clock-control none --kernel-name regex:"$regex" --launch-count "$count" $sections \
    --csv --page details "$@" > /tmp/ncu-one.csv 2> "$OUT/ncu-$label.err"
  cat /tmp/ncu-one.csv >> "$csv"
  grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Block Limit (Registers|Shared Mem)|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps Per Scheduler|Active Warps Per Scheduler|Warp Cycles Per Issued Instruction|Shared Memory Bandwidth|Executed Ipc Active|Grid Size)"' \
    /tmp/ncu-one.csv | awk -F'","' '{print "  " $(NF-2) " = " $NF " " $(NF-1)}'
  timeout 120 "$NCU" --clock-control none --kernel-name regex:"$regex" --launch-count "$count" --csv \
    --page raw --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    "$@" > /tmp/ncu-stalls.csv 2>> "$OUT/ncu-$label.err"
  cat /tmp/ncu-stalls.csv >> "$csv"
  python3 - /tmp/ncu-stalls.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next((i for i, r in enumerate(rows) if any("stalled" in c for c in r)), None)
if head is None:
    sys.exit("  no stall metrics")
names = rows[head]
for vals in rows[head + 1:]:
    pairs = sorted(((float(v), n.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""))
                    for n, v in zip(names, vals) if "stalled" in n and v.replace(".", "", 1).isdigit()), reverse=True)
    if pairs:
        print("  stalls per issued instruction:", ", ".join(f"{n} {v:.2f}" for v, n in pairs[:8]))
PY
}
