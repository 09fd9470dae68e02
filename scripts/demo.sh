#!/usr/bin/env bash
# The README's main job: a troupe cluster on this machine, end to end.
# Starts `troupe serve --workers 2` (the head: router + batcher, and two local
# workers sharing the CPUs) on the default model, streams a few jobs through
# `troupe submit`, prints `troupe status`, and stops the head with SIGTERM
# (it finishes what is in flight and exits 0). Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
TROUPE=${TROUPE:-./build/troupe}
MODEL=${MODEL:-models/gpt2}
RUN=$(mktemp -d)
trap 'kill $HEAD 2>/dev/null || true; rm -rf "$RUN"' EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "troupe serve --workers 2 (head + two local workers) on $MODEL"
"$TROUPE" serve --model "$MODEL" --workers 2 --listen 'tcp://127.0.0.1:*' --worker-listen 'tcp://127.0.0.1:*' \
  --kv-memory 512MiB --ready-file "$RUN/ready" &
HEAD=$!
for _ in $(seq 600); do [ -s "$RUN/ready" ] && break; kill -0 $HEAD 2>/dev/null || exit 1; sleep 0.2; done
[ -s "$RUN/ready" ] || { echo "the head did not start" >&2; exit 1; }
TO=$(sed -n 's/^listen=//p' "$RUN/ready")
# Wait until both local workers have joined.
for _ in $(seq 300); do
  [ "$("$TROUPE" status --to "$TO" --json | grep -o '"id":' | wc -l)" -ge 2 ] && break
  sleep 0.2
done

for prompt in "The actor model of computation" "Paged attention keeps the KV cache" "A distributed system is one in which"; do
  say "troupe submit --prompt \"$prompt\" (streamed)"
  "$TROUPE" submit --to "$TO" --prompt "$prompt" --max-tokens 32 --temperature 0.8 --seed 7
done

say "troupe submit --input (8 jobs in flight at once, results in input order)"
for i in $(seq 8); do
  printf '{"id": %d, "prompt": "Job %d of the demo:", "max_tokens": 24, "temperature": 0}\n' "$i" "$i"
done > "$RUN/jobs.jsonl"
"$TROUPE" submit --to "$TO" --input "$RUN/jobs.jsonl" --output "$RUN/results.jsonl"
head -c 600 "$RUN/results.jsonl"; echo " ..."

say "troupe status"
"$TROUPE" status --to "$TO"

say "stopping the head (SIGTERM: finish in-flight jobs, exit 0)"
kill -TERM $HEAD
wait $HEAD
echo "the head exited with status $?"
