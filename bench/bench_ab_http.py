#!/usr/bin/python3
"""Two troupe binaries side by side on the served HTTP workload of the peer benchmarks: `troupe serve --http`
(one worker, 2 threads) and `troupe bench --base-url`, 64 requests of 56-64 prompt ids and 128 output tokens,
greedy, all sent at once with at most C in flight. The binaries alternate (A B, then B A, ...), a fresh head
each run after a warm-up; output tokens/s per run and the ratio B / A of each pair.

  bench/bench_ab_http.py --a OLD/troupe --b build/troupe [--model models/gpt2] [--concurrency 16,64] [--reps 3]

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
        procs.run([binary, "bench", "--base-url", url, "--quiet", "--max-concurrency", str(concurrency), "--json",
                   str(out)] + WORKLOAD)
        return json.load(open(out))["output_throughput"]
    finally:
        p.terminate()
        p.wait(timeout=300)


rows = []
for c in [int(x) for x in a.concurrency.split(",")]:
    for rep in range(a.reps):
        order = [("a", a.a), ("b", a.b)] if rep % 2 == 0 else [("b", a.b), ("a", a.a)]
        got = {name: served(binary, f"{name}-c{c}-r{rep}", c) for name, binary in order}
        rows.append(dict(concurrency=c, rep=rep, a=got["a"], b=got["b"], ratio=got["b"] / got["a"]))
        procs.log(json.dumps(rows[-1]))

print(f"CPU: {procs.cpu_name()}; A = {a.a}, B = {a.b}; 64 x (56-64 + 128) greedy over HTTP, serve --workers 1 "
      f"--threads-per-worker 2; {a.reps} pairs, order alternating")
print("| in flight | A output tok/s | B output tok/s | B / A per pair | median B / A |")
print("|---:|---|---|---|---:|")
for c in sorted({r["concurrency"] for r in rows}):
    rs = [r for r in rows if r["concurrency"] == c]
    a_s = ", ".join(f"{r['a']:.0f}" for r in rs)
    b_s = ", ".join(f"{r['b']:.0f}" for r in rs)
    ratios = ", ".join(f"{r['ratio']:.3f}" for r in rs)
    print(f"| {c} | {a_s} | {b_s} | {ratios} | {statistics.median(r['ratio'] for r in rs):.3f} |")
json.dump(rows, open(work / "ab_http.json", "w"), indent=1)
