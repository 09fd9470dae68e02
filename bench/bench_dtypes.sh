#!/bin/bash
# Batch-1 decode and prefill 512 for every dtype, side by side with llama.cpp at the same bits:
#   llama-bench tg128 (-p 0 -n 128) and pp512 (-p 512 -n 0) at F32, BF16, Q8_0, against
#   troupe generate 16 -> 128 (decode tok/s = 127 / its decode time) and 512 -> 1 (512 / its prefill time)
#   at fp32, bf16 (+ bf16 K/V), int8, int8_g32; 2 threads each, engines alternating, ROUNDS rounds.
# One line per run; the medians are the reader's (docs/benchmarks.md, "Every dtype beside llama.cpp").
#
#   bench/bench_dtypes.sh [ROUNDS]        # from the checkout's root, after scripts/setup.sh
#
# llama.cpp is built by hand in $PEERS_DIR (default /tmp/troupe-peers: llama.cpp/build/bin/llama-bench and
# gpt2-f32.gguf, gpt2-bf16.gguf, gpt2-q8_0.gguf; ../shared/peer-bench/README.md), never in the project;
# without it only troupe's lines are printed. TROUPE_CPU=avx2 forces troupe's AVX2 kernels (llama.cpp keeps its build's).
set -euo pipefail
ROUNDS=${1:-3}
P=${PEERS_DIR:-/tmp/troupe-peers}
LB=$P/llama.cpp/build/bin/llama-bench
T=${TROUPE:-build/troupe}
MODEL=${MODEL:-models/gpt2}
[ -x "$T" ] || { echo "bench_dtypes: $T not built (bash scripts/setup.sh)" >&2; exit 1; }
[ -d "$MODEL" ] || { echo "bench_dtypes: no model at $MODEL" >&2; exit 1; }
llama=1
[ -x "$LB" ] || { echo "bench_dtypes: no $LB: troupe only" >&2; llama=0; }
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange($2, 50000)) for _ in range($3)))"; }
IDS=$(ids 3 0 16)
IDS512=$(ids 11 256 512)
llama_ts() {  # gguf, llama-bench's -p/-n flags: tokens/s
  OMP_WAIT_POLICY=PASSIVE "$LB" -m "$1" "${@:2}" -t 2 -r 1 -o json 2>/dev/null |
    python3 -c "import json,sys; print('%.1f' % json.load(sys.stdin)[0]['avg_ts'])"
}
troupe_ts() {  # ids, max tokens, timing field, tokens it covers, dtype flags...
  "$T" --threads 2 generate --model "$MODEL" --prompt-ids "$1" --max-tokens "$2" --mode paged --ignore-eos \
    "${@:5}" --json 2>/dev/null |
    python3 -c "import json,sys; t=json.load(sys.stdin)['timing']; print('%.1f' % ($4e3 / t['$3']))"
}
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1); troupe kernels: $("$T" --version 2>&1 | sed -n 's/.*kernels: \([a-z0-9]*\).*/\1/p')"
for r in $(seq "$ROUNDS"); do
  if [ $llama = 1 ]; then
    for g in f32 bf16 q8_0; do
      echo "round $r llama.cpp $g tg128 $(llama_ts "$P/gpt2-$g.gguf" -p 0 -n 128) pp512 $(llama_ts "$P/gpt2-$g.gguf" -p 512 -n 0)"
    done
  fi
  for d in "--dtype float32" "--dtype bfloat16" "--quantization int8" "--quantization int8_g32"; do
    # shellcheck disable=SC2086
    echo "round $r troupe $d tg128 $(troupe_ts "$IDS" 128 decode_ms 127 $d) pp512 $(troupe_ts "$IDS512" 1 prefill_ms 512 $d)"
  done
done
