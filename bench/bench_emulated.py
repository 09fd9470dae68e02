#!/usr/bin/python3
"""How far one head goes (issue 9's emulated workers): a real `troupe serve --workers 0` head, emulated workers
(`troupe worker --emulate COST.json`: the whole protocol, no model) and `troupe bench` over ZeroMQ. For each
number of workers and load, the same request list also runs in `troupe simulate`, whose head costs nothing: the
head's added latency is measured median TTFT - simulated median TTFT (likewise TPOT). Also the head's and the
nodes' CPU use. Reports the first (workers, rate) where the head adds more than 5 ms.

With --head-cost (a `troupe profile --head` file, or `auto`: measure one first under the same settings), the
same list also runs with the head as a server with that cost: its added latency is the prediction, and the
knee (the workers at which the added median TTFT passes --knee-ms, interpolated) of the real and the
predicted curves are compared; --plot writes both curves (gnuplot, SVG). --pin puts the head on a CPU of its
own and the nodes and the client on the others; --head-failpoints sets TROUPE_FAILPOINTS for the head alone
(`batcher.result=spin(300)`: a head that spends 300 us more of its CPU on each step result, docs/failpoints.md).

  bench/bench_emulated.py [--cost docs/profiles/...json] [--model models/gpt2] [--workers 4,16,64]
                          [--per-node 16] [--loads 0.5,0.8] [--time-scale 0.1] [--num-requests 400]
                          [--input-len 128] [--output-len 64] [--out DIR]
                          [--head-cost FILE|auto] [--pin] [--head-failpoints SPEC] [--knee-ms 5] [--plot SVG]

--time-scale 0.1 makes each emulated step 10x faster than the profile (GPU-class workers), so the head
sees more traffic per worker. Name the CPU beside the numbers: the head and the workers share it.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import troupe_procs as procs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="models/gpt2")
ap.add_argument("--troupe", default="build/troupe")
ap.add_argument("--cost", default="docs/profiles/gpt2-124m-cpu-epyc-2threads.json")
ap.add_argument("--workers", default="4,16,64")
ap.add_argument("--per-node", type=int, default=16)
ap.add_argument("--loads", default="0.5,0.8")
ap.add_argument("--time-scale", type=float, default=0.1)
ap.add_argument("--num-requests", type=int, default=400)
ap.add_argument("--input-len", type=int, default=128)
ap.add_argument("--output-len", type=int, default=64)
ap.add_argument("--num-blocks", type=int, default=2048)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--out", default=None)
ap.add_argument("--head-cost", default=None)
ap.add_argument("--pin", action="store_true")
ap.add_argument("--head-failpoints", default=None)
ap.add_argument("--knee-ms", type=float, default=5.0)
ap.add_argument("--plot", default=None)
a = ap.parse_args()
head_env = {"TROUPE_FAILPOINTS": a.head_failpoints} if a.head_failpoints else None
head_cpus, other_cpus = procs.split_cpus() if a.pin else (None, None)
T = a.troupe
work = procs.work_dir(a.out, "bench-emulated-")


log = procs.log

run = procs.run


# The simulator takes the profile's times; the emulated workers multiply them by --time-scale: a scaled copy
# of the profile keeps both on the same times.
profile = json.load(open(a.cost))
cm = profile["cost_model"]
for k in ("decode_pair_ns", "item_ns", "prefill_pair_ns", "sample_row_ns"):
    cm[k] *= a.time_scale
cm["knot_ns"] = [x * a.time_scale for x in cm["knot_ns"]]
scaled = work / "cost-scaled.json"
json.dump(profile, open(scaled, "w"))

workload = ["--num-requests", str(a.num_requests), "--random-input-len", str(a.input_len), "--random-output-len",
            str(a.output_len), "--range-ratio", "0.5", "--seed", str(a.seed)]


def simulate(workers, rate, tag, head_cost=None):
    out = work / f"sim-{tag}.json"
    run([T, "simulate", "--cost", str(scaled), "--workers", str(workers), "--num-blocks", str(a.num_blocks),
         "--quiet", "--request-rate", str(rate), "--json", str(out)] + workload +
        (["--head-cost", str(head_cost)] if head_cost else []))
    return json.load(open(out))


head_cost = a.head_cost
if head_cost == "auto":
    head_cost = work / "head-cost.json"
    log("profiling the head (troupe profile --head) under the same settings")
    r = subprocess.run([T, "profile", "--head", "--model", a.model, "--emulate", a.cost, "--emulate-time-scale",
                        str(a.time_scale), "--workers", "8", "--out",
                        str(head_cost)] + (["--pin"] if a.pin else []),
                       env=dict(procs.ENV, **(head_env or {})), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"troupe profile --head failed:\n{r.stdout}\n{r.stderr}")
    log(r.stdout.strip())


def served(head):
    """Requests ended, step results and tokens the head has seen so far (its status)."""
    st = head.status()
    ws = st.get("workers", [])
    return dict(requests=st.get("requests_served", 0), steps=sum(w.get("steps", 0) for w in ws),
                tokens=sum(w.get("tokens", 0) for w in ws))


def measure(workers, rate, tag):
    head, nodes = procs.emulated_cluster(T, a.model, work, tag, workers, a.per_node, a.cost, a.time_scale,
                                         a.num_blocks, head_env=head_env, head_cpus=head_cpus,
                                         node_cpus=other_cpus)
    try:
        out = work / f"bench-{tag}.json"
        cpu0 = procs.cpu_seconds(head.p.pid), sum(procs.cpu_seconds(n.p.pid) for n in nodes)
        served0, switches0 = served(head), procs.context_switches(head.p.pid)
        t0 = time.monotonic()
        run(procs.pinned(other_cpus) + [T, "bench", "--to", head.to, "--request-rate", str(rate), "--json", str(out)]
            + workload)
        wall = time.monotonic() - t0
        cpu1 = procs.cpu_seconds(head.p.pid), sum(procs.cpu_seconds(n.p.pid) for n in nodes)
        r = json.load(open(out))
        r["head_cpu"] = (cpu1[0] - cpu0[0]) / wall
        r["nodes_cpu"] = (cpu1[1] - cpu0[1]) / wall
        # What the head did over the run, for a fit of its cost per event (troupe profile --head's terms).
        served1 = served(head)
        r["head_events"] = dict({k: served1[k] - served0[k] for k in served0}, wall_s=wall,
                                cpu_s=cpu1[0] - cpu0[0],
                                context_switches=procs.context_switches(head.p.pid) - switches0)
        return r
    finally:
        for n in nodes:
            n.stop()
        head.stop()


rows = []
for w in [int(x) for x in a.workers.split(",")]:
    capacity = simulate(w, "inf", f"cap{w}")["request_throughput"]
    for load in [float(x) for x in a.loads.split(",")]:
        rate = round(load * capacity, 3)
        sim = simulate(w, rate, f"w{w}-{load}")
        real = measure(w, rate, f"w{w}-{load}")
        with_head = simulate(w, rate, f"w{w}-{load}-head", head_cost) if head_cost else None
        row = dict(workers=w, load=load, rate=rate, ttft_real=real["median_ttft_ms"], ttft_sim=sim["median_ttft_ms"],
                   tpot_real=real["median_tpot_ms"], tpot_sim=sim["median_tpot_ms"],
                   tput_real=real["output_throughput"], tput_sim=sim["output_throughput"],
                   head_cpu=real["head_cpu"], nodes_cpu=real["nodes_cpu"], failed=real.get("failed", 0),
                   head_events=real["head_events"])
        if with_head:
            row.update(ttft_head=with_head["median_ttft_ms"], tpot_head=with_head["median_tpot_ms"],
                       head_util=with_head.get("head", {}).get("utilization", 0.0))
        rows.append(row)
        log(json.dumps(row))

print(f"CPU: {procs.cpu_name()} (head, nodes and bench client on it"
      f"{f'; the head on CPU {head_cpus}, the rest on {other_cpus}' if a.pin else ''}); profile {a.cost} x "
      f"{a.time_scale}; {a.num_requests} requests, input {a.input_len}, output {a.output_len} (range 0.5), Poisson"
      f"{f'; head failpoints {a.head_failpoints}' if a.head_failpoints else ''}"
      f"{f'; head cost {head_cost}' if head_cost else ''}")
print("| workers | load | rate req/s | TTFT median real / sim ms | added | TPOT median real / sim ms | added | "
      "output tok/s real / sim | head CPU | head CPU µs a step | head's switches an event | nodes CPU |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
first = None
for r in rows:
    e = r["head_events"]  # the head's CPU per step result (requests and tokens included), its context switches
    added = r["ttft_real"] - r["ttft_sim"]
    if first is None and added > 5:
        first = r
    print(f"| {r['workers']} | {r['load']:.2f} | {r['rate']:.2f} | {r['ttft_real']:.1f} / {r['ttft_sim']:.1f} | "
          f"{added:+.1f} | {r['tpot_real']:.2f} / {r['tpot_sim']:.2f} | {r['tpot_real'] - r['tpot_sim']:+.2f} | "
          f"{r['tput_real']:.0f} / {r['tput_sim']:.0f} | {100 * r['head_cpu']:.0f}% | "
          f"{1e6 * e['cpu_s'] / max(1, e['steps']):.0f} | "
          f"{e['context_switches'] / max(1, e['requests'] + e['steps']):.1f} | {100 * r['nodes_cpu']:.0f}% |")
print("first run where the head adds > 5 ms to the median TTFT:",
      f"{first['workers']} workers at {first['rate']} req/s" if first else "none of these")
json.dump(rows, open(work / "emulated.json", "w"), indent=1)


def knee(xs, ys, limit):
    """The x at which y first passes `limit`, linearly between the points around it (None: never)."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y > limit:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (limit - y0) * (x - x0) / (y - y0)
    return None


if head_cost:
    print()
    print("| workers | rate req/s | added TTFT real ms | added TTFT predicted ms | head utilisation (simulated) | "
          "TPOT real / predicted ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for load in sorted({r["load"] for r in rows}):
        rs = [r for r in rows if r["load"] == load]
        for r in rs:
            print(f"| {r['workers']} | {r['rate']:.1f} | {r['ttft_real'] - r['ttft_sim']:+.1f} | "
                  f"{r['ttft_head'] - r['ttft_sim']:+.1f} | {100 * r['head_util']:.0f}% | "
                  f"{r['tpot_real']:.2f} / {r['tpot_head']:.2f} |")
        xs = [r["workers"] for r in rs]
        real_knee = knee(xs, [r["ttft_real"] - r["ttft_sim"] for r in rs], a.knee_ms)
        pred_knee = knee(xs, [r["ttft_head"] - r["ttft_sim"] for r in rs], a.knee_ms)
        verdict = "n/a"
        if real_knee and pred_knee:
            err = 100 * (pred_knee - real_knee) / real_knee
            verdict = f"{err:+.1f}% ({'within' if abs(err) <= 20 else 'NOT within'} 20%)"
        fmt = lambda k: f"{k:.1f} workers" if k else "not reached"
        print(f"load {load:.2f}: the head adds > {a.knee_ms:g} ms to the median TTFT at {fmt(real_knee)} (real), "
              f"{fmt(pred_knee)} (simulated with the head's cost): {verdict}")
    if a.plot:
        data = work / "knee.dat"
        with open(data, "w") as f:
            for r in rows:
                f.write(f"{r['workers']} {r['load']} {r['ttft_real'] - r['ttft_sim']:.3f} "
                        f"{r['ttft_head'] - r['ttft_sim']:.3f}\n")
        script = f"""set terminal svg size 720,440 dynamic font 'Sans,12'
set output '{a.plot}'
set title "The head's added median TTFT ({procs.cpu_name()}, {'head pinned' if a.pin else 'CPUs shared'})"
set xlabel 'emulated workers'
set ylabel 'added median TTFT, ms'
set key left top
set grid
plot '{data}' using 1:3 with linespoints lw 2 pt 7 title 'real head - simulated free head', \
     '{data}' using 1:4 with linespoints lw 2 pt 5 title 'simulated head with its cost - free head', \
     {a.knee_ms} with lines dt 2 lc rgb 'gray' title '{a.knee_ms:g} ms'
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
        print("wrote", a.plot)
