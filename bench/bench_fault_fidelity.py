#!/usr/bin/python3
"""A killed, hung or drained worker, served and simulated (issue 33, faults in virtual time): a real head
(`troupe serve --workers 0`) with N emulated workers, one per node (`troupe worker --emulate COST.json`: the
whole protocol, each step the cost model's time), `troupe bench` sending a seeded workload, and one node struck
T seconds after the bench starts sending (the line it prints then; not its launch); then `troupe simulate` of the
same workload (same seed: the same arrivals and lengths) with the same fault at the same time:

  --fault kill   the node SIGKILLed at T; simulated with --fail-worker K@T
  --fault drain  the node sent SIGTERM at T (it drains and exits); simulated with --drain-worker K@T
  --fault hang   the node's `worker.step` failpoint hangs its K-th step (TROUPE_FAILPOINTS=worker.step=hang@K
                 in its environment; K from the simulated step rate, so that it fires near T, or --hang-step);
                 T is when the node printed "failpoint worker.step fired". Simulated with --hang-worker K@T (the
                 simulator registers the node anew once the step deadline let it go, as the real node does when
                 the head resets it).
 Compared: requests moved and tokens recomputed (the head's counters, `troupe status`,
against the simulation's Faults section), and the median TTFT and E2EL of the requests sent within W seconds
after the kill (the ones the lost capacity delays; the served run does not say which requests the head moved,
so two proxies stand in for them, the same rule on both sides: the requests that stalled, a gap of more than
--stall seconds before a token (their worker died under them; the head notices after 3 missed heartbeats),
and the requests sent within W seconds after the kill), besides the whole run's. Target: within 15%.

  bench/bench_fault_fidelity.py [--fault kill|hang|drain] [--workers 4] [--node 2] [--at 8] [--rate 6] [--num-requests 200]
                                [--input-len 128] [--output-len 64] [--time-scale 1] [--window 5] [--seed 1]

Name the CPU beside the numbers: the head, the nodes and the client share it (the simulated head is free).
"""
import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import troupe_procs as procs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--troupe", default="build/troupe")
ap.add_argument("--model", default="models/gpt2")
ap.add_argument("--cost", default="docs/profiles/gpt2-124m-cpu-epyc-2threads.json")
ap.add_argument("--workers", type=int, default=4)
ap.add_argument("--fault", choices=["kill", "hang", "drain"], default="kill")
ap.add_argument("--node", "--kill", dest="node", type=int, default=2, help="which node (1..N, in starting order)")
ap.add_argument("--at", "--kill-at", dest="at", type=float, default=8.0, help="seconds after the bench starts")
ap.add_argument("--hang-step", type=int, default=0,
                help="--fault hang: the step of the node that hangs (0: the one the simulation runs near --at)")
ap.add_argument("--rate", type=float, default=6.0)
ap.add_argument("--num-requests", type=int, default=200)
ap.add_argument("--input-len", type=int, default=128)
ap.add_argument("--output-len", type=int, default=64)
ap.add_argument("--time-scale", type=float, default=1.0)
ap.add_argument("--num-blocks", type=int, default=2048)
ap.add_argument("--window", type=float, default=5.0)
ap.add_argument("--stall", type=float, default=1.5, help="seconds without a token that mark a request stalled")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--placement", default="round-robin",
                help="the head's and the simulation's: round-robin puts request i on the same worker in both")
ap.add_argument("--out", default=None)
a = ap.parse_args()
T = a.troupe
work = procs.work_dir(a.out, "bench-fault-")
log = procs.log
workload = ["--num-requests", str(a.num_requests), "--random-input-len", str(a.input_len), "--random-output-len",
            str(a.output_len), "--seed", str(a.seed), "--request-rate", str(a.rate)]


def simulate(out, extra):
    procs.run([T, "simulate", "--cost", a.cost, "--workers", str(a.workers), "--num-blocks", str(a.num_blocks),
               "--cost-scale", str(a.time_scale), "--placement", a.placement, "--quiet", "--json", str(out),
               "--json-itls"] + extra + workload)
    return json.load(open(out))


def stalled_stats(j):
    """Requests with a gap of more than --stall s before a token (the first included): count, median TTFT, E2EL."""
    sel = [i for i, t in enumerate(j["ttfts"])
           if t is not None and max([t] + list(j["itls"][i] or [])) > a.stall]
    med = lambda xs: statistics.median(xs) * 1e3 if xs else float("nan")  # noqa: E731
    return len(sel), med([j["ttfts"][i] for i in sel]), med([j["latencies"][i] for i in sel])


def window_stats(j, start_key, t0):
    """Median TTFT and E2EL (ms) of the requests sent in [kill, kill + window), and of all."""
    starts = j[start_key]
    ttft, e2el = j["ttfts"], j["latencies"]
    sel = [i for i, s in enumerate(starts) if s is not None and at <= s - t0 < at + a.window]
    med = lambda xs: statistics.median(xs) * 1e3 if xs else float("nan")  # noqa: E731
    return {"window_requests": len(sel),
            "window_ttft_ms": med([ttft[i] for i in sel if ttft[i]]),
            "window_e2el_ms": med([e2el[i] for i in sel if e2el[i]]),
            "all_ttft_ms": med([x for x in ttft if x])}


# Served.
node_env = {}
if a.fault == "hang":
    k = a.hang_step
    if k <= 0:  # the victim's step near --at, at the simulated run's mean step rate per worker
        plain = simulate(work / "sim-plain.json", [])
        steps = sum(w["steps"] for w in plain["workers"]) / a.workers
        k = max(1, round(a.at * steps / plain["duration"]))
    node_env = {a.node - 1: {"TROUPE_FAILPOINTS": f"worker.step=hang@{k}"}}
    log(f"node {a.node} hangs at its step {k}")
head, nodes = procs.emulated_cluster(T, a.model, work, "fault", a.workers, 1, a.cost, a.time_scale, a.num_blocks,
                                     head_extra=["--placement", a.placement], node_env=node_env)
at = a.at
try:
    victim = nodes[a.node - 1]
    # The head numbers workers as they join (nodes race): the victim's id, for the simulation.
    tag = f"fault-n{a.node - 1}"
    ids = sorted(w["id"] for w in head.status()["workers"])
    victim_id = ids.index(next(w["id"] for w in head.status()["workers"] if w["node"] == tag)) + 1
    bench_out = work / "bench.json"
    fired = []  # hang: seconds after the bench started when the node said its failpoint fired
    left = []  # drain: when the drained node exited (the head let it go)

    def watch_hang(stop):
        path = Path(victim.log.name)
        while not stop.is_set():
            if "failpoint worker.step fired" in path.read_text(errors="replace"):
                fired.append(time.time() - t0)
                return
            time.sleep(0.005)

    stop = threading.Event()
    if a.fault == "kill":
        striker = threading.Timer(a.at, victim.p.kill)
    elif a.fault == "drain":
        def drain_now():
            victim.p.send_signal(signal.SIGTERM)
            victim.p.wait()
            left.append(time.time() - t0)

        striker = threading.Timer(a.at, drain_now)
    else:
        striker = threading.Thread(target=watch_hang, args=(stop,))
    # Times are the bench's: from when it starts sending (the header line it prints then), not from its
    # launch (the process takes up to a second to start; the simulated events would be that late).
    bench = subprocess.Popen([T, "bench", "--to", head.to] + workload + ["--json", str(bench_out)], env=procs.ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors = []
    for line in bench.stderr:
        errors.append(line)
        if line.startswith("troupe bench:"):
            break
    t0 = time.time()
    striker.start()
    drain_err = threading.Thread(target=lambda: errors.extend(bench.stderr))
    drain_err.start()
    out_text = bench.stdout.read()
    drain_err.join()
    if bench.wait() != 0:
        raise SystemExit(f"troupe bench failed:\n{out_text}\n{''.join(errors)}")
    if a.fault == "hang":
        stop.set()
        striker.join()
    else:
        striker.cancel()
    status = head.status()
finally:
    for n in nodes:
        if n.p.poll() is None:
            n.stop()
    head.stop()
real = json.load(open(bench_out))
log(f"served: {status.get('requests_moved')} requests moved, {status.get('tokens_recomputed')} tokens recomputed, "
    f"{len(status.get('workers', []))} workers at the end")

# Simulated.
flag = {"kill": "--fail-worker", "hang": "--hang-worker", "drain": "--drain-worker"}[a.fault]
if a.fault == "hang":
    if not fired:
        raise SystemExit(f"node {a.node}'s failpoint never fired (its step {k}): give --hang-step")
    at = round(fired[0], 3)
# (A hung node, reset by the head, registers again with a fresh worker: the simulator models it.)
sim = simulate(work / "sim.json", [flag, f"{victim_id}@{at}"])

print(f"CPU: {procs.cpu_name()}; {a.workers} emulated workers ({a.cost}), node {a.node} (worker {victim_id}) "
      f"{ {'kill': 'killed', 'hang': 'hung', 'drain': 'drained'}[a.fault]} at {at} s; "
      f"{a.num_requests} requests at {a.rate}/s, {a.input_len}+{a.output_len} tokens, seed {a.seed}")
rows = [("requests moved", status.get("requests_moved", 0), sim["requests_moved"]),
        ("tokens recomputed", status.get("tokens_recomputed", 0), sim["tokens_recomputed"])]
# Times from each run's own zero: the simulation's is the workload's t = 0; the served run's first request
# left at the same offset from the bench's start as the simulated one did.
first_sim = min(x for x in sim["start_times"] if x is not None)
rs = window_stats(real, "start_times", min(x for x in real["start_times"] if x is not None) - first_sim)
ss = window_stats(sim, "start_times", 0.0)
rn, rt, re_ = stalled_stats(real)
sn, st, se = stalled_stats(sim)
if sim["faults"][0]["removed_s"] is not None:
    print(f"simulated: worker {victim_id} let go at {sim['faults'][0]['removed_s']:.3f} s")
if left:
    rows.append(("drained node exited, s after the bench started", left[0], sim["faults"][0]["removed_s"] or 0))
rows += [(f"requests stalled > {a.stall} s", rn, sn), ("  their median TTFT (ms)", rt, st),
         ("  their median E2EL (ms)", re_, se)]
if True:
    rows += [(f"median TTFT, sent within {a.window} s after the fault (ms)", rs["window_ttft_ms"], ss["window_ttft_ms"]),
             (f"median E2EL, sent within {a.window} s after the fault (ms)", rs["window_e2el_ms"], ss["window_e2el_ms"]),
             ("median TTFT, all (ms)", rs["all_ttft_ms"], ss["all_ttft_ms"])]
    print(f"requests in the window: served {rs['window_requests']}, simulated {ss['window_requests']}")
print(f"{'':58} {'served':>10} {'simulated':>10} {'sim/served':>10}")
for name, r, s in rows:
    ratio = s / r if r else float("nan")
    print(f"{name:58} {r:10.1f} {s:10.1f} {ratio:10.2f}")
print(f"files: {work}")
