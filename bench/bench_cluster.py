#!/usr/bin/python3
"""What the distributed path costs, measured side by side in one run (issue 7's benchmarks).

Workload: 64 jobs of ~60 random token ids (56-64, seeded), 128 new tokens each, greedy, ignore_eos.
Alternating within each repetition:
  batch     `troupe batch` (the engine in one process, no actors, no sockets)
  serve1    `troupe serve --workers 1` + `troupe submit --input` (router, batcher, worker actor, ZeroMQ)
  serve2x1  `troupe serve --workers 2 --threads-per-worker 1` + submit
  serve1x2  `troupe serve --workers 1 --threads-per-worker 2` + submit
Reports output tokens/s of each and the ratios serve1/batch (target >= 0.95) and serve2x1/serve1x2
(target >= 0.9); the worker idle fraction idle / (busy + idle) from `troupe status --json` after each serve run
(target < 2%); and time to first token at low load: one 8-token job at a time through `troupe bench --to`
(client-measured on a warm connection) minus the worker's own time for that step (the engine alone, the same
forward pass and sampling), target <= 2 ms added.

usage: bench/bench_cluster.py [--model models/gpt2] [--reps 3] [--jobs 64] [--max-tokens 128] [--out DIR]
Run from the project root after scripts/setup.sh. The numbers are this machine's: name its CPU beside them.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import troupe_procs as procs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/gpt2")
ap.add_argument("--troupe", default="build/troupe")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--jobs", type=int, default=64)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--ttft-reps", type=int, default=10)
ap.add_argument("--out", default=None)
ap.add_argument("--ttft-only", action="store_true", help="only the time-to-first-token part")
a = ap.parse_args()

T = a.troupe
work = procs.work_dir(a.out, "bench-cluster-")
ENV = procs.ENV


log = procs.log


rng = random.Random(7)
jobs = work / "jobs.jsonl"
with open(jobs, "w") as f:
    for i in range(a.jobs):
        ids = [rng.randrange(256, 50000) for _ in range(rng.randint(56, 64))]
        f.write(json.dumps({"id": f"r{i}", "prompt_ids": ids, "max_tokens": a.max_tokens, "temperature": 0,
                            "ignore_eos": True}) + "\n")


def out_tokens(path):
    return sum(len(json.loads(l)["ids"]) for l in open(path) if l.strip())


def run_batch(tag):
    out = work / f"batch-{tag}.jsonl"
    t0 = time.monotonic()
    subprocess.run([T, "batch", "--model", a.model, "--input", str(jobs), "--output", str(out), "--quiet",
                    "--kv-memory", "1GiB"], check=True, env=ENV, capture_output=True)
    return out_tokens(out) / (time.monotonic() - t0), out


def Head(extra, tag):
    return procs.Head(T, a.model, work, tag, ["--kv-memory", "1GiB"] + extra)


def run_serve(extra, tag):
    h = Head(extra, tag)
    try:
        before = h.status()["workers"]
        out = work / f"serve-{tag}.jsonl"
        t0 = time.monotonic()
        subprocess.run([T, "submit", "--to", h.to, "--input", str(jobs), "--output", str(out), "--quiet"],
                       check=True, env=ENV, capture_output=True)
        tps = out_tokens(out) / (time.monotonic() - t0)
        after = h.status()["workers"]
        busy = sum(w["busy_s"] for w in after) - sum(w["busy_s"] for w in before)
        idle = sum(w["idle_s"] for w in after) - sum(w["idle_s"] for w in before)
        return tps, idle / (busy + idle) if busy + idle > 0 else 0.0, out
    finally:
        h.stop()


def ttft_served(rate):
    """One 8-token prompt -> 1 token at a time, `rate` requests/s, through `troupe bench` on one warm
    connection. Returns (client TTFT samples, the worker's own step time per request): the step (the engine
    alone: model + sampling, as the worker times it) is the worker's busy time over these requests / N, each
    request being exactly one step."""
    h = Head(["--workers", "1"], f"ttft-{rate}")
    try:
        def bench(n, tag):
            out = work / f"ttft-{rate}-{tag}.json"
            subprocess.run([T, "bench", "--to", h.to, "--num-requests", str(n), "--request-rate", str(rate),
                            "--max-concurrency", "1", "--random-input-len", "8", "--random-output-len", "1",
                            "--seed", str(len(tag)), "--json", str(out), "--quiet"],
                           env=ENV, capture_output=True, text=True, check=True)
            return json.load(open(out))
        bench(3, "warm")
        before = h.status()["workers"]
        res = bench(a.ttft_reps, "measured")
        after = h.status()["workers"]
        busy_ms = 1e3 * (sum(w["busy_s"] for w in after) - sum(w["busy_s"] for w in before))
        return res["ttfts"], busy_ms / a.ttft_reps
    finally:
        h.stop()


cpu = procs.cpu_name()
log(f"CPU: {cpu}; {os.cpu_count()} CPUs; workload {a.jobs} x (56-64 + {a.max_tokens}) greedy; {a.reps} reps")
res = {"batch": [], "serve1": [], "serve2x1": [], "serve1x2": [], "idle1": [], "idle2x1": []}
ref = None
for rep in range(0 if a.ttft_only else a.reps):
    tps, out = run_batch(rep)
    res["batch"].append(tps)
    ref = ref or [json.loads(l)["ids"] for l in open(out)]
    log(f"rep {rep}: batch {tps:.1f} tok/s")
    for name, extra, idle_key in (("serve1", ["--workers", "1"], "idle1"),
                                  ("serve2x1", ["--workers", "2", "--threads-per-worker", "1"], "idle2x1"),
                                  ("serve1x2", ["--workers", "1", "--threads-per-worker", "2"], None)):
        tps, idle, out = run_serve(extra, f"{name}-{rep}")
        same = [json.loads(l)["ids"] for l in open(out)] == ref
        res[name].append(tps)
        if idle_key:
            res[idle_key].append(idle)
        log(f"rep {rep}: {name} {tps:.1f} tok/s, worker idle {100 * idle:.2f}%, same tokens as batch: {same}")

med = {k: statistics.median(v) for k, v in res.items() if v}
rng_ = {k: (min(v), max(v)) for k, v in res.items() if v}
ttft = {rate: ttft_served(rate) for rate in (2, 20)}
print(f"CPU: {cpu} ({os.cpu_count()} CPUs)")
if not a.ttft_only:
    print(f"{'run':<10} {'output tok/s median':>20} {'range':>20}")
    for k in ("batch", "serve1", "serve2x1", "serve1x2"):
        print(f"{k:<10} {med[k]:20.1f} {rng_[k][0]:9.1f}-{rng_[k][1]:<9.1f}")
    print(f"serve1 / batch       = {med['serve1'] / med['batch']:.3f}   (target >= 0.95)")
    print(f"serve2x1 / serve1x2  = {med['serve2x1'] / med['serve1x2']:.3f}   (target >= 0.9)")
    print(f"worker idle fraction = {100 * med['idle1']:.2f}% (1 worker), {100 * med['idle2x1']:.2f}% (2 workers)"
          f"   (target < 2%)")
for rate, (ttfts, step_ms) in ttft.items():
    ttfts_ms = [1e3 * t for t in ttfts]
    print(f"TTFT at {rate} req/s, one at a time: client median {statistics.median(ttfts_ms):.2f} ms, "
          f"mean {statistics.mean(ttfts_ms):.2f} ms; the worker's step (engine alone) {step_ms:.2f} ms/request; "
          f"added by router, batcher, actors and ZeroMQ {statistics.mean(ttfts_ms) - step_ms:+.2f} ms"
          f"   (target <= 2 ms)")
json.dump({"cpu": cpu, "runs": res, "ttft": {str(r): {"client_ttfts_s": t, "worker_step_ms": m}
                                             for r, (t, m) in ttft.items()}},
          open(work / "bench_cluster.json", "w"), indent=1)
