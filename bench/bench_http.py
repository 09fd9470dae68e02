#!/usr/bin/python3
"""Issue 8's benchmarks, every load driven by `troupe bench` (vLLM's client-side metrics), side by side in one run.

Phases (pick with --phases; each alternates its variants within every repetition):
  front  the same load through troupe's ZeroMQ front (`bench --to`) and its HTTP front (`bench --base-url`),
         one `serve --http` head, short runs alternating (--front-pairs): output tokens/s of each, the ratio
         http / zmq of each adjacent pair and their median (target >= 0.97)
  cpu    CPU seconds of the head and of the client per 1000 output tokens through each front (where the
         front's cost goes)
  sweep  request rates light -> saturation through the HTTP front (`bench --request-rate R1,R2,...
         --plot DIR`): the latency-vs-throughput plot (DIR/sweep.svg) and one line per rate
  peer   troupe `serve --http` vs llama.cpp's `llama-server` on the same random GPT-2 as GGUF
         (../shared/peer-bench/make_gguf.py), both through `bench --base-url`: 64 requests, prompts of 56-64
         random ids, 128 output tokens, greedy, ignore_eos, at 16 and 64 concurrent (all sent at once,
         --max-concurrency C). Targets: output tok/s >= 2x llama-server's at 16 and >= 3x at 64; median TPOT
         <= 0.6x; median TTFT <= 1x. llama-server is built by hand in a scratch folder, never a dependency.

         Each server's peak RSS (VmHWM) is recorded beside its figures. --troupe-args adds flags to troupe's
         serve (a dtype beside a quantized --gguf: '--quantization int8_g32 --kv-cache-dtype bfloat16' vs
         a Q8_0 GGUF from llama-quantize).

usage: bench/bench_http.py [--phases front,sweep,peer] [--reps 2] [--out DIR]
                           [--llama-server PATH --gguf PATH] [--troupe-args '...']
                           (peer; default $PEERS_DIR or /tmp/troupe-peers)
Run from the project root after scripts/setup.sh. 2 threads for every server. Name the CPU beside the numbers.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import troupe_procs as procs  # noqa: E402

peers = Path(os.environ.get("PEERS_DIR", "/tmp/troupe-peers"))
ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/gpt2")
ap.add_argument("--troupe", default="build/troupe")
ap.add_argument("--phases", default="front,sweep,peer")
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--front-requests", type=int, default=32)
ap.add_argument("--front-concurrency", type=int, default=16)
ap.add_argument("--front-output", type=int, default=64)
ap.add_argument("--front-pairs", type=int, default=8)
ap.add_argument("--sweep-rates", default="0.25,0.5,1,2,4")
ap.add_argument("--sweep-requests", type=int, default=24)
ap.add_argument("--sweep-output", type=int, default=64)
ap.add_argument("--peer-concurrency", default="16,64")
ap.add_argument("--peer-requests", type=int, default=64)
ap.add_argument("--output-len", type=int, default=128)
ap.add_argument("--llama-server", default=str(peers / "llama.cpp/build/bin/llama-server"))
ap.add_argument("--gguf", default=str(peers / "gpt2-f32.gguf"))
ap.add_argument("--troupe-args", default="",
                help="more flags for troupe serve, e.g. '--quantization int8_g32 --kv-cache-dtype bfloat16' "
                     "beside a Q8_0 --gguf")
ap.add_argument("--out", default=None)
a = ap.parse_args()

T = a.troupe
work = procs.work_dir(a.out, "bench-http-")
ENV = procs.ENV
# 64 x (56-64 + 128) greedy, the peer-bench workload's shape; ids from troupe bench's seeded generator.
WORKLOAD = ["--random-input-len", "60", "--range-ratio", "0.07", "--random-output-len", str(a.output_len),
            "--seed", "7"]
# The front and cpu phases' load: short runs, so that many alternate within one head's life.
FRONT_LOAD = ["--num-requests", str(a.front_requests), "--request-rate", "inf",
              "--max-concurrency", str(a.front_concurrency), "--random-input-len", "60", "--range-ratio", "0.07",
              "--random-output-len", str(a.front_output), "--seed", "7"]


log = procs.log


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, what, proc, logf, limit_s=600):
    for _ in range(limit_s * 10):
        if cond():
            return
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: see {logf}")
        time.sleep(0.1)
    raise SystemExit(f"{what} did not start: see {logf}")


class Troupe:
    """`troupe serve --http` with one worker of a.threads threads."""

    def __init__(self, tag):
        self.ready = work / f"ready-{tag}"
        self.ready.unlink(missing_ok=True)
        self.logf = work / f"troupe-{tag}.log"
        self.p = subprocess.Popen([T, "serve", "--model", a.model, "--listen", "tcp://127.0.0.1:*",
                                   "--worker-listen", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0",
                                   "--workers", "1", "--threads-per-worker", str(a.threads),
                                   "--kv-memory", "1GiB", "--max-num-seqs", "64", "--max-queue", "1024",
                                   "--ready-file", str(self.ready), "--quiet", *a.troupe_args.split()],
                                  env=ENV, stdout=open(self.logf, "w"), stderr=subprocess.STDOUT)
        wait_for(self.ready.exists, "troupe serve", self.p, self.logf)
        text = self.ready.read_text()
        self.zmq = re.search(r"listen=(\S+)", text).group(1)
        self.url = "http://" + re.search(r"http=(\S+)", text).group(1)
        wait_for(lambda: health(self.url), "troupe's worker", self.p, self.logf)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=300)


def peak_rss_mb(pid):
    """VmHWM of a live process, MB (1e6 bytes); None when unreadable."""
    kib = procs.status_kib(pid, "VmHWM")
    return None if kib is None else kib * 1024 / 1e6


class LlamaServer:
    def __init__(self, parallel, tag):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.logf = work / f"llama-{tag}.log"
        self.p = subprocess.Popen([a.llama_server, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(port),
                                   "-t", str(a.threads), "-tb", str(a.threads), "-np", str(parallel),
                                   "-c", str(1024 * parallel), "--no-warmup"],
                                  env=ENV, stdout=open(self.logf, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: health(self.url), "llama-server", self.p, self.logf)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)


def health(url):
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url + "/health"],
                       capture_output=True, text=True)
    return r.stdout.strip() == "200"


def bench(target, tag, extra):
    out = work / f"{tag}.json"
    r = subprocess.run([T, "bench", *target, "--json", str(out), "--quiet", *extra], env=ENV,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"troupe bench {tag} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return json.load(open(out))


def summary(j):
    return (f"{j['output_throughput']:.1f} out tok/s, TTFT median {j['median_ttft_ms']:.0f} ms, "
            f"TPOT median {j['median_tpot_ms']:.1f} ms, completed {j['completed']}")


cpu = procs.cpu_name()
log(f"CPU: {cpu}; {os.cpu_count()} CPUs; {a.threads} threads per server; {a.reps} reps; results in {work}")
phases = a.phases.split(",")
results = {"cpu": cpu}

if "front" in phases:
    # One head; short runs alternating zmq/http (order flipped every pair), so the neighbours' load on this
    # shared machine hits both fronts alike; the ratio of each adjacent pair, then their median.
    load = FRONT_LOAD
    runs = {"zmq": [], "http": []}
    t = Troupe("front")
    try:
        bench(["--base-url", t.url], "front-warmup", load)
        for rep in range(a.front_pairs):
            order = ("zmq", "http") if rep % 2 == 0 else ("http", "zmq")
            for v in order:
                target = ["--to", t.zmq] if v == "zmq" else ["--base-url", t.url]
                j = bench(target, f"front-{v}-{rep}", load)
                runs[v].append(j["output_throughput"])
                log(f"front pair {rep} {v}: {summary(j)}")
    finally:
        t.stop()
    ratios = [h / z for h, z in zip(runs["http"], runs["zmq"])]
    med = {k: statistics.median(v) for k, v in runs.items()}
    results["front"] = dict(runs, ratios=ratios)
    print(f"front: zmq median {med['zmq']:.1f} tok/s (best {max(runs['zmq']):.1f}), http median {med['http']:.1f} "
          f"tok/s (best {max(runs['http']):.1f}); http / zmq per pair {[round(r, 3) for r in ratios]}, "
          f"median {statistics.median(ratios):.3f}, of bests {max(runs['http']) / max(runs['zmq']):.3f} "
          f"(target >= 0.97)")

if "cpu" in phases:
    # Where the time goes: CPU seconds of the head process (all its threads) and of the client (troupe bench)
    # per 1000 output tokens, for the same load through each front, alternating.
    load = FRONT_LOAD
    t = Troupe("cpu")

    def head_cpu():
        return procs.cpu_seconds(t.p.pid)

    cost = {"zmq": [], "http": []}
    try:
        bench(["--base-url", t.url], "cpu-warmup", load)
        for rep in range(a.reps * 2):
            for v in (("zmq", "http") if rep % 2 == 0 else ("http", "zmq")):
                h0, c0 = head_cpu(), os.times()
                j = bench(["--to", t.zmq] if v == "zmq" else ["--base-url", t.url], f"cpu-{v}-{rep}", load)
                h1, c1 = head_cpu(), os.times()
                k = j["total_output_tokens"] / 1000
                client = (c1.children_user + c1.children_system - c0.children_user - c0.children_system) / k
                cost[v].append({"head_s_per_1k": (h1 - h0) / k, "client_s_per_1k": client,
                               "tok_s": j["output_throughput"]})
                log(f"cpu {v}: head {(h1 - h0) / k:.3f} s, client {client:.3f} s per 1000 tokens, "
                    f"{j['output_throughput']:.1f} tok/s")
    finally:
        t.stop()
    results["cost"] = cost
    for v in cost:
        print(f"cpu {v}: head median {statistics.median(x['head_s_per_1k'] for x in cost[v]):.3f} s, client "
              f"median {statistics.median(x['client_s_per_1k'] for x in cost[v]):.3f} s per 1000 output tokens")

if "sweep" in phases:
    t = Troupe("sweep")
    try:
        plot = work / "sweep"
        r = subprocess.run([T, "bench", "--base-url", t.url, "--num-requests", str(a.sweep_requests),
                            "--request-rate", a.sweep_rates, "--random-input-len", "60", "--range-ratio", "0.07",
                            "--random-output-len", str(a.sweep_output), "--seed", "7", "--quiet",
                            "--json", str(work / "sweep.json"), "--plot", str(plot)],
                           env=ENV, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"sweep failed:\n{r.stdout}\n{r.stderr}")
        results["sweep"] = []
        for rate in a.sweep_rates.split(","):
            j = json.load(open(work / f"sweep.rate-{rate}.json"))
            results["sweep"].append({"rate": rate, "output_throughput": j["output_throughput"],
                                     "median_ttft_ms": j["median_ttft_ms"], "p99_ttft_ms": j["p99_ttft_ms"],
                                     "median_tpot_ms": j["median_tpot_ms"], "p99_tpot_ms": j["p99_tpot_ms"]})
            print(f"sweep rate {rate}/s: {summary(j)}, p99 TTFT {j['p99_ttft_ms']:.0f} ms, "
                  f"p99 TPOT {j['p99_tpot_ms']:.1f} ms")
        print(f"sweep plot: {plot}/sweep.svg")
    finally:
        t.stop()

if "peer" in phases:
    results["peer"] = {}
    for c in [int(x) for x in a.peer_concurrency.split(",")]:
        load = ["--num-requests", str(a.peer_requests), "--request-rate", "inf", "--max-concurrency", str(c), *WORKLOAD]
        runs = {"troupe": [], "llama": []}
        for rep in range(a.reps):
            order = ("troupe", "llama") if rep % 2 == 0 else ("llama", "troupe")
            for v in order:
                s = Troupe(f"peer-{c}-{rep}") if v == "troupe" else LlamaServer(c, f"{c}-{rep}")
                try:
                    j = bench(["--base-url", s.url], f"peer-{v}-{c}-{rep}", load)
                    rss = peak_rss_mb(s.p.pid)
                finally:
                    s.stop()
                runs[v].append({k: j[k] for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms",
                                                  "completed", "total_output_tokens")})
                runs[v][-1]["peak_rss_mb"] = rss if rss is not None else float("nan")
                log(f"peer c={c} rep {rep} {v}: {summary(j)}")
        med = {v: {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]} for v in runs}
        results["peer"][c] = runs
        tp = med["troupe"]["output_throughput"] / med["llama"]["output_throughput"]
        tpot = med["troupe"]["median_tpot_ms"] / med["llama"]["median_tpot_ms"]
        ttft = med["troupe"]["median_ttft_ms"] / med["llama"]["median_ttft_ms"]
        print(f"peer {c} concurrent: troupe {med['troupe']['output_throughput']:.1f} tok/s "
              f"(TTFT {med['troupe']['median_ttft_ms']:.0f} ms, TPOT {med['troupe']['median_tpot_ms']:.1f} ms), "
              f"llama-server {med['llama']['output_throughput']:.1f} tok/s "
              f"(TTFT {med['llama']['median_ttft_ms']:.0f} ms, TPOT {med['llama']['median_tpot_ms']:.1f} ms); "
              f"throughput {tp:.2f}x (target >= {2 if c <= 16 else 3}x), TPOT {tpot:.2f}x (<= 0.6), "
              f"TTFT {ttft:.2f}x (<= 1); peak RSS troupe {med['troupe']['peak_rss_mb']:.0f} MB, "
              f"llama-server {med['llama']['peak_rss_mb']:.0f} MB")

json.dump(results, open(work / "bench_http.json", "w"), indent=1)
