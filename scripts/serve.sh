#!/usr/bin/env bash
# Serve a model in the foreground (headless machines, services, containers): no tray, Ctrl-C stops.
#
#   scripts/serve.sh [PORT] [CTX]
#
# Environment overrides (the arguments win over OPENJET_PORT / OPENJET_CTX):
#   OPENJET_MODEL    a GGUF path, a Hugging Face REPO/FILE (downloaded first), or 'demo' (the tiny CPU model)
#                    (default: unsloth/Qwen3.8-27B-GGUF/Qwen3.8-27B-Q4_K_M.gguf, downloaded on first use)
#   OPENJET_PORT     port (default 8080)
#   OPENJET_CTX      context length in tokens (default: the server's)
#   OPENJET_HOST     address to listen on (default 127.0.0.1; 0.0.0.0 opens it to the network)
#   OPENJET_API_KEY  key clients must send (read by the server itself; never put on the command line)
#   OPENJET_ENGINE   reference | cuda (default: reference for demo, cuda otherwise)
#   OPENJET_LAUNCH   the launcher command (default: openjet-launch, else python3 -m openjet_launcher)
set -euo pipefail

port="${1:-${OPENJET_PORT:-8080}}"
ctx="${2:-${OPENJET_CTX:-}}"
host="${OPENJET_HOST:-127.0.0.1}"
model="${OPENJET_MODEL:-}"
if [[ -n "${OPENJET_LAUNCH:-}" ]]; then read -r -a launch <<<"$OPENJET_LAUNCH"
elif command -v openjet-launch >/dev/null 2>&1; then launch=(openjet-launch)
else launch=("${PYTHON:-python3}" -m openjet_launcher); fi

if [[ "$model" != demo && ! -f "$model" ]]; then  # the default or REPO/FILE: download (resumes) and use its path
  model="$("${launch[@]}" download ${model:+"$model"} | head -n 1)"
  [[ -n "$model" ]] || { echo "serve.sh: the download did not give a model path" >&2; exit 1; }
fi

if [[ -n "${OPENJET_ENGINE:-}" ]]; then engine="$OPENJET_ENGINE"
elif [[ "$model" == demo ]]; then engine=reference
else engine=cuda; fi

args=(serve "$model" --engine "$engine" --host "$host" --port "$port")
[[ -n "$ctx" ]] && args+=(--ctx "$ctx")

client_host="$host"
[[ "$host" == 0.0.0.0 || "$host" == "::" ]] && client_host=127.0.0.1
base="http://${client_host}:${port}/v1"
key_note="none"
[[ -n "${OPENJET_API_KEY:-}" ]] && key_note="the value of \$OPENJET_API_KEY"

cat >&2 <<MSG
OpenJet: serving ${model} on ${engine} at ${host}:${port}
  base URL     ${base}
  Open WebUI   Admin Panel > Settings > Connections > OpenAI API: URL ${base}, key ${key_note}
  more clients docs/CLIENTS.md
MSG
exec "${launch[@]}" "${args[@]}"
