"""Processes of a troupe cluster for the Python benchmarks (bench_cluster, bench_fidelity, bench_emulated):
a head (`troupe serve`) on ephemeral loopback ports, worker nodes, `troupe status --json`, and the CPU's name."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="3000")  # troupe's policy: model/threading.hpp


def log(*x):
    print(time.strftime("%H:%M:%S"), *x, file=sys.stderr, flush=True)


def run(cmd):
    """Runs a command to completion; exits the bench with its output if it fails."""
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return r


def work_dir(out, prefix):
    """The folder for a bench's files: `out`, or a fresh temporary one."""
    work = Path(out or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work


def cpu_name():
    return next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def steal_seconds():
    """CPU time the hypervisor gave other guests while this one's CPUs wanted it, summed over the CPUs, since boot
    (/proc/stat's `steal`): a run during which it grows was slowed by the host, not by what it measures."""
    f = open("/proc/stat").readline().split()
    return int(f[8]) / os.sysconf("SC_CLK_TCK") if len(f) > 8 and f[0] == "cpu" else 0.0


def context_switches(pid):
    """Voluntary + involuntary context switches of a process's threads so far (/proc/PID/task/*/status): how
    often its threads went to sleep or were put off a CPU."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in open(task / "status"):
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    n += int(line.split()[1])
        except OSError:
            pass  # a thread that ended meanwhile
    return n


def status_kib(pid, field):
    """A /proc/PID/status field in KiB (VmRSS, VmHWM, ...); None when the process or the field is gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class Head:
    """`troupe serve` with `extra` flags; waits until `workers` workers have joined (default: --workers N)."""

    def __init__(self, troupe, model, work, tag, extra, workers=None, env=None, cpus=None):
        self.troupe = troupe
        ready = Path(work) / f"ready-{tag}"
        ready.unlink(missing_ok=True)
        self.log = open(Path(work) / f"head-{tag}.log", "w")
        self.p = subprocess.Popen(pinned(cpus) + [troupe, "serve", "--model", model, "--listen", "tcp://127.0.0.1:*",
                                                  "--worker-listen", "tcp://127.0.0.1:*", "--ready-file", str(ready),
                                                  "--quiet"] + extra, env=dict(ENV, **(env or {})),
                                  stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(1200):
            if ready.exists():
                break
            if self.p.poll() is not None:
                raise SystemExit(f"head exited: see {self.log.name}")
            time.sleep(0.1)
        text = ready.read_text()
        self.to = re.search(r"^listen=(\S+)", text, re.M).group(1)
        self.worker_listen = re.search(r"^worker_listen=(\S+)", text, re.M).group(1)
        http = re.search(r"^http=(\S+)", text, re.M)
        self.http = "http://" + http.group(1) if http else None  # with --http
        if workers is None:
            workers = int(extra[extra.index("--workers") + 1]) if "--workers" in extra else 1
        self.wait_workers(workers)

    def wait_workers(self, n, timeout_s=300):
        for _ in range(int(timeout_s * 10)):
            if len(self.status().get("workers", [])) >= n:
                return
            if self.p.poll() is not None:
                raise SystemExit(f"head exited: see {self.log.name}")
            time.sleep(0.1)
        raise SystemExit(f"{n} workers did not join: see {self.log.name}")

    def status(self):
        r = subprocess.run([self.troupe, "status", "--to", self.to, "--json"], env=ENV, capture_output=True,
                           text=True)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)


class Node:
    """`troupe worker --join` the head with `extra` flags (and `env`, more environment: failpoints)."""

    def __init__(self, troupe, model, work, tag, head, extra, env=None, cpus=None):
        self.log = open(Path(work) / f"node-{tag}.log", "w")
        self.p = subprocess.Popen(pinned(cpus) + [troupe, "worker", "--join", head.worker_listen, "--model", model,
                                                  "--name", tag] + extra,
                                  env=dict(ENV, **(env or {})), stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)


def pinned(cpus):
    """The prefix that runs a command on `cpus` ("1", "0-3"), or none."""
    return ["taskset", "-c", cpus] if cpus else []


def split_cpus():
    """(the head's CPU, the others'): the last usable CPU, and the rest, as taskset lists."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("pinning needs 2 CPUs at least")
    return str(cpus[-1]), ",".join(str(c) for c in cpus[:-1])


def emulated_cluster(troupe, model, work, tag, workers, per_node, cost, time_scale, num_blocks, head_extra=(),
                     node_env=None, head_env=None, head_cpus=None, node_cpus=None):
    """A head alone (with `head_extra` flags, `head_env` more environment, on `head_cpus`) and `workers`
    emulated workers (`troupe worker --emulate`, on `node_cpus`), `per_node` to a node, all joined: (head,
    nodes). node_env: {node index: more environment}. Stop the nodes, then the head."""
    head = Head(troupe, model, work, tag, ["--workers", "0"] + list(head_extra), workers=0, env=head_env,
                cpus=head_cpus)
    nodes = []
    try:
        for i in range(0, workers, per_node):
            n = min(per_node, workers - i)
            nodes.append(Node(troupe, model, work, f"{tag}-n{i}", head,
                              ["--workers", str(n), "--emulate", cost, "--emulate-time-scale", str(time_scale),
                               "--num-blocks", str(num_blocks)], (node_env or {}).get(len(nodes)), node_cpus))
        head.wait_workers(workers)
    except BaseException:
        for n in nodes:
            n.stop()
        head.stop()
        raise
    return head, nodes
