#!/usr/bin/env bash
# Issue 9 on the GPU machine, one device call: the release wheel (wheelhouse/*.whl from packaging/build-wheel.sh)
# installed into a fresh venv and run from outside the source tree: --help, probe, doctor --json, then
# `serve demo --engine cuda` answering a chat request; and doctor with an engine built without this GPU's
# architecture (.prebuilt/libopenjet-no-sm90.so, through OPENJET_LIBRARY). Results in $OUT.
#   run(carry=[".whl", "wheelhouse", ".prebuilt"], command="bash scripts/gpu_wheel_check.sh")
# .whl/ holds the dependency wheels the offline image lacks (scripts/fetch_device_wheels.sh; installed with
# --no-deps next to the system ones). On 2026-11-30 the first attempt lacked anyio, so the CLI could not import.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SRC=$PWD
python3 -m venv --system-site-packages /tmp/venv || exit 1
# The image's own packages (numpy, jinja2, tokenizers, ...) sit in folders a venv does not see even with
# --system-site-packages (on 2026-12-01 jinja2 was missing there): list the system interpreter's package folders in
# a .pth so the venv sees what the image has, then let pip resolve the wheel's dependencies against that and .whl/;
# a dependency found in neither fails the install with its name.
python3 -c "import sys, os; print('\n'.join(p for p in sys.path if p.endswith(('-packages',)) and os.path.isdir(p)))" \
  | tee "$OUT/system-site.txt" > "$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image-packages.pth"
/tmp/venv/bin/pip install -q --no-index --find-links "$SRC"/.whl "$SRC"/wheelhouse/*.whl > "$OUT/install.log" 2>&1 ||
  { cat "$OUT/install.log"; exit 1; }
/tmp/venv/bin/pip list 2>/dev/null > "$OUT/pip-list.txt"
cd /tmp   # nothing of the source tree on the path from here
OJ=/tmp/venv/bin/openjet-launch
/tmp/venv/bin/python -c "import openjet_launcher, sys; print(openjet_launcher.__file__)" | tee "$OUT/package.txt"
$OJ --help > "$OUT/help.txt" 2>&1; echo "help rc=$?"
$OJ probe > "$OUT/probe.json" 2>&1; echo "probe rc=$?"; head -c 1200 "$OUT/probe.json"; echo
$OJ doctor --json > "$OUT/doctor.json" 2>&1; echo "doctor rc=$?"
OPENJET_LIBRARY=$SRC/.prebuilt/libopenjet-no-sm90.so $OJ doctor --json > "$OUT/doctor-no-sm90.json" 2>&1
echo "doctor (no sm_90) rc=$?"; head -c 1500 "$OUT/doctor-no-sm90.json"; echo
OPENJET_LIBRARY=$SRC/.prebuilt/libopenjet-no-sm90.so $OJ doctor > "$OUT/doctor-no-sm90.txt" 2>&1; cat "$OUT/doctor-no-sm90.txt"
$OJ serve demo --engine cuda --port 8011 > "$OUT/serve.log" 2>&1 &
pid=$!
for i in $(seq 1 90); do
  curl -sf localhost:8011/health > "$OUT/health.json" 2>/dev/null && grep -q '"ok"' "$OUT/health.json" && break; sleep 1
  kill -0 $pid 2>/dev/null || break
done
cat "$OUT/health.json"; echo
curl -s localhost:8011/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"demo","messages":[{"role":"user","content":"Hi, who are you?"}],"max_tokens":160,"temperature":0}' \
  > "$OUT/chat.json"; echo "chat:"; cat "$OUT/chat.json"; echo
kill $pid; wait $pid 2>/dev/null; tail -5 "$OUT/serve.log"
