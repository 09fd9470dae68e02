#!/usr/bin/python3
"""Two troupe binaries side by side on the served HTTP workload of the peer benchmarks: `troupe serve --http`
(one worker, 2 threads) and `troupe bench --base-url`, 64 requests of 56-64 prompt ids and 128 output tokens,
greedy, all sent at once with at most C in flight. The binaries alternate (A B, then B A, ...), a fresh head
each run after a warm-up; output tokens/s per run and the ratio B / A of each pair.

  bench/bench_ab_http.py --a OLD/troupe --b build/troupe [--model models/gpt2] [--concurrency 16,64] [--reps 3]
                         [--client bench|loadgen] [--peer-bench ../shared/peer-bench]

`--client loadgen` sends the requests with the peer benchmarks' own client (peer-bench/loadgen_oai.py: a Python
thread per request in flight, http.client, the prompts of make_prompts.py) instead of `troupe bench`. Each run
also records the median TTFT and the serving process's CPU seconds per output token (/proc/PID/stat: the
worker's forward passes included).

Name the CPU beside the numbers.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import troupe_procs as procs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--a", required=True, help="the baseline binary")
ap.add_argument("--b", required=True, help="the binary measured against it")
ap.add_argument("--model", default="models/gpt2")
ap.add_argument("--concurrency", default="16,64")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--client", choices=["bench", "loadgen"], default="bench")
ap.add_argument("--peer-bench", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "peer-bench"))
ap.add_argument("--out", default=None)
a = ap.parse_args()
work = procs.work_dir(a.out, "bench-ab-http-")
WORKLOAD = ["--num-requests", "64", "--request-rate", "inf", "--random-input-len", "60", "--range-ratio", "0.07",
            "--random-output-len", "128", "--seed", "7"]


def served(binary, tag, concurrency):
    ready = work / f"ready-{tag}"
    ready.unlink(missing_ok=True)
    log = open(work / f"serve-{tag}.log", "w")
    p = subprocess.Popen([binary, "serve", "--model", a.model, "--listen", "tcp://127.0.0.1:*", "--worker-listen",
                          "tcp://127.0.0.1:*", "--http", "127.0.0.1:0", "--workers", "1", "--threads-per-worker",
                          "2", "--kv-memory", "1GiB", "--max-num-seqs", "64", "--max-queue", "1024",
                          "--ready-file", str(ready), "--quiet"], env=procs.ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(6000):
            if ready.exists() or p.poll() is not None:
                break
            time.sleep(0.1)
        url = "http://" + re.search(r"http=(\S+)", ready.read_text()).group(1)
        procs.run([binary, "bench", "--base-url", url, "--quiet", "--num-requests", "8", "--request-rate", "inf",
                   "--random-input-len", "60", "--random-output-len", "16", "--seed", "1"])  # warm-up
        out = work / f"bench-{tag}.json"
        cpu0 = procs.cpu_seconds(p.pid)
        if a.client == "loadgen":
            prompts = work / "prompts" / "prompts.json"
            if not prompts.exists():
                procs.run([sys.executable, str(Path(a.peer_bench) / "make_prompts.py"), str(prompts.parent)])
            procs.run([sys.executable, str(Path(a.peer_bench) / "loadgen_oai.py"), "--base", url, "--prompts",
                       str(prompts), "--concurrency", str(concurrency), "--max-tokens", "128", "--json", str(out)])
            r = json.load(open(out))
            tok_s, ttft, tokens = r["output_tok_s"], r["median_ttft_ms"], r["ok"] * 128
        else:
            procs.run([binary, "bench", "--base-url", url, "--quiet", "--max-concurrency", str(concurrency),
                       "--json", str(out)] + WORKLOAD)
            r = json.load(open(out))
            tok_s, ttft, tokens = r["output_throughput"], r["median_ttft_ms"], r["total_output_tokens"]
        cpu = procs.cpu_seconds(p.pid) - cpu0
        return dict(tok_s=tok_s, ttft_ms=ttft, cpu_ms_per_token=1e3 * cpu / max(tokens, 1))
    finally:
        p.terminate()
        p.wait(timeout=300)


rows = []
for c in [int(x) for x in a.concurrency.split(",")]:
    for rep in range(a.reps):
        order = [("a", a.a), ("b", a.b)] if rep % 2 == 0 else [("b", a.b), ("a", a.a)]
        got = {name: served(binary, f"{name}-c{c}-r{rep}", c) for name, binary in order}
        rows.append(dict(concurrency=c, rep=rep, a=got["a"], b=got["b"], ratio=got["b"]["tok_s"] / got["a"]["tok_s"],
                         ttft_ratio=got["b"]["ttft_ms"] / got["a"]["ttft_ms"]))
        procs.log(json.dumps(rows[-1]))

client = "peer-bench/loadgen_oai.py" if a.client == "loadgen" else "troupe bench"
print(f"CPU: {procs.cpu_name()}; A = {a.a}, B = {a.b}; 64 x (56-64 + 128) greedy streamed over HTTP by {client}, "
      f"serve --workers 1 --threads-per-worker 2; {a.reps} pairs, order alternating")
print("| in flight | A output tok/s | B output tok/s | B / A tok/s (median) | A median TTFT ms | B median TTFT ms "
      "| B / A TTFT (median) | A, B serve CPU ms per token |")
print("|---:|---|---|---:|---|---|---:|---|")
med = statistics.median
for c in sorted({r["concurrency"] for r in rows}):
    rs = [r for r in rows if r["concurrency"] == c]
    a_tok = ", ".join(f"{r['a']['tok_s']:.0f}" for r in rs)
    b_tok = ", ".join(f"{r['b']['tok_s']:.0f}" for r in rs)
    a_ttft = ", ".join(f"{r['a']['ttft_ms']:.0f}" for r in rs)
    b_ttft = ", ".join(f"{r['b']['ttft_ms']:.0f}" for r in rs)
    cpu = f"{med(r['a']['cpu_ms_per_token'] for r in rs):.2f}, {med(r['b']['cpu_ms_per_token'] for r in rs):.2f}"
    print(f"| {c} | {a_tok} | {b_tok} | {med(r['ratio'] for r in rs):.3f} | {a_ttft} | {b_ttft} | "
          f"{med(r['ttft_ratio'] for r in rs):.3f} | {cpu} |")
json.dump(rows, open(work / "ab_http.json", "w"), indent=1)
