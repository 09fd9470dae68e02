#!/usr/bin/python3
"""The head's own CPU per generated token as the cluster grows: a real `troupe serve --workers 0` head,
emulated workers (`troupe worker --emulate COST.json`: the whole protocol, no model; 16 per node) and
`troupe bench` over ZeroMQ (or, with `--front http`, streamed over the HTTP front) keeping every worker busy. Head CPU = user + system seconds of the head process
(/proc/PID/stat) over the run, divided by the output tokens. Two binaries can be compared side by side:
`--troupe-old` runs alternately with `--troupe` (these machines are noisy: pairs, not one of each).

  bench/bench_head_cost.py [--troupe build/troupe] [--troupe-old OLD/troupe] [--model models/gpt2]
                           [--workers 1,8,64] [--rounds 3] [--num-requests 256] [--time-scale 0.1]
                           [--front zmq|http] [--in-flight-per-worker 16]

Name the CPU beside the numbers: the head, the nodes and the client share it.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import troupe_procs as procs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--troupe", default="build/troupe")
ap.add_argument("--troupe-old", default=None)
ap.add_argument("--model", default="models/gpt2")
ap.add_argument("--cost", default="docs/profiles/gpt2-124m-cpu-epyc-2threads.json")
ap.add_argument("--workers", default="1,8,64")
ap.add_argument("--per-node", type=int, default=16)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--num-requests", type=int, default=256)
ap.add_argument("--input-len", type=int, default=64)
ap.add_argument("--output-len", type=int, default=64)
ap.add_argument("--time-scale", type=float, default=0.1)
ap.add_argument("--num-blocks", type=int, default=2048)
ap.add_argument("--front", choices=["zmq", "http"], default="zmq")
ap.add_argument("--in-flight-per-worker", type=int, default=16)
ap.add_argument("--out", default=None)
a = ap.parse_args()
work = procs.work_dir(a.out, "bench-head-cost-")


def measure(troupe, workers, tag):
    head, nodes = procs.emulated_cluster(troupe, a.model, work, tag, workers, a.per_node, a.cost, a.time_scale,
                                         a.num_blocks,
                                         ["--http", "127.0.0.1:0"] if a.front == "http" else [])
    try:
        out = work / f"bench-{tag}.json"
        in_flight = a.in_flight_per_worker * workers
        requests = max(a.num_requests, in_flight)
        target = ["--base-url", head.http] if a.front == "http" else ["--to", head.to]
        cpu0, t0 = procs.cpu_seconds(head.p.pid), time.monotonic()
        procs.run([troupe, "bench"] + target + ["--request-rate", "inf", "--max-concurrency",
                   str(in_flight), "--num-requests", str(requests), "--random-input-len", str(a.input_len),
                   "--random-output-len", str(a.output_len), "--range-ratio", "0.5", "--seed", "1",
                   "--json", str(out)])
        cpu, wall = procs.cpu_seconds(head.p.pid) - cpu0, time.monotonic() - t0
        r = json.load(open(out))
        tokens = r["total_output_tokens"]
        return dict(us_per_token=1e6 * cpu / tokens, head_cpu=cpu / wall, tokens=tokens,
                    tok_s=r["output_throughput"], failed=r.get("failed", 0))
    finally:
        for n in nodes:
            n.stop()
        head.stop()


binaries = [("new", a.troupe)] + ([("old", a.troupe_old)] if a.troupe_old else [])
results = {}
for w in [int(x) for x in a.workers.split(",")]:
    for rnd in range(a.rounds):
        for name, path in (binaries if rnd % 2 == 0 else binaries[::-1]):
            r = measure(path, w, f"{name}-w{w}-r{rnd}")
            results.setdefault((w, name), []).append(r)
            procs.log(name, w, json.dumps(r))

print(f"CPU: {procs.cpu_name()} (head, emulated nodes and bench client on it); {a.cost} x {a.time_scale}; "
      f"max({a.num_requests}, {a.in_flight_per_worker} x workers) requests over {a.front}, input {a.input_len}, "
      f"output {a.output_len} (range 0.5), {a.in_flight_per_worker} in flight per worker; {a.rounds} rounds, binaries alternating; median (min-max)")
cols = " | ".join(f"{n}: head CPU µs per token" for n, _ in binaries)
print(f"| workers | {cols} | head CPU use (new) | output tok/s (new) |")
print("|---:|" + "---:|" * (len(binaries) + 2))
for w in [int(x) for x in a.workers.split(",")]:
    cells = []
    for name, _ in binaries:
        v = [r["us_per_token"] for r in results[(w, name)]]
        cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
    new = results[(w, "new")]
    print(f"| {w} | " + " | ".join(cells) +
          f" | {100 * statistics.median(r['head_cpu'] for r in new):.0f}% | "
          f"{statistics.median(r['tok_s'] for r in new):.0f} |")
json.dump({f"{w}-{n}": v for (w, n), v in results.items()}, open(work / "head_cost.json", "w"), indent=1)
