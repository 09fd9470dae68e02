#!/usr/bin/env python3
"""Time GPT-2 serving steps (prefill, decode, mixed) on a GPU with plain PyTorch.

Self-contained: random weights, no transformers. GPT-2 math: learned absolute
positions, pre-LayerNorm blocks, tanh GELU, tied LM head, vocab 50257, 1024
positions. One "step" is what a serving engine runs per iteration:

  prefill  Bp sequences of T new tokens each from an empty KV cache (causal
           attention), K/V written to a cache, LM head on the last row of each
           sequence only;
  decode   B sequences adding one token each with context C already in a
           (C = 128 or 1023: the new token at position 1023 fills GPT-2's window)
           preallocated contiguous [B, H, C+1, D] K/V cache per layer (new K/V
           written at position C, attention over all C+1 positions through
           scaled_dot_product_attention), LM head on every row;
  mixed    32 decodes at context 512 plus one 256-token prefill chunk in one
           step (GEMMs over the 288 rows together, attention per part).

Each step is timed with CUDA events around one step, with a synchronize after
every repetition (a serving loop reads the logits each step), after warm-up;
the CSV has the median and minimum. Decode for B in (1, 32) is also timed as a
CUDA graph replay (the launch overhead that graphs remove is what a roofline's
fixed term models). Beside each time: FLOPs and bytes counted per step (see
count_step), and the achieved rates. The machine's ceilings (device-to-device
copy bandwidth, 8192^3 matmul rates bf16 / fp32 without and with TF32) are
measured in the same run and written to ceilings.json.

Model fp32 runs use true fp32 GEMMs (torch.backends.cuda.matmul.allow_tf32 =
False, PyTorch's default).

Where all layers' K/V caches would not fit in --kv-budget-gb, layers share a
pool of distinct buffers (layer l uses buffer l % n); each such buffer is then
far larger than the L2 cache, so the bytes still come from device memory. The
kv_bufs column says how many distinct buffers a step used.

bytes = weight_bytes + kv_bytes + act_bytes (see count_step). The activation
term is a rough count of intermediate reads/writes; at decode batch sizes these
mostly stay in the 50 MB L2, so achieved_gbs_wkv (weights + K/V only, the
compulsory device-memory traffic) is the figure to hold against the copy
bandwidth there.

Usage:
  python3 bench/gpu/gpt2_steps.py --device cuda --out DIR       # full run
  python3 bench/gpu/gpt2_steps.py --quick --device cpu --out DIR  # smoke test
"""

import argparse
import csv
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

VOCAB = 50257
NPOS = 1024
SIZES = {  # name: (n_embd, n_layer, n_head)
    "124M": (768, 12, 12),
    "355M": (1024, 24, 16),
    "774M": (1280, 36, 20),
    "1.5B": (1600, 48, 25),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

CSV_COLUMNS = [
    "model", "dtype", "kind", "batch", "tokens", "context", "graph",
    "median_ms", "min_ms", "flops", "bytes", "achieved_tflops", "achieved_gbs",
    # extra columns, after the ones the brief asked for
    "reps", "lm_rows", "kv_bufs", "weight_bytes", "kv_bytes", "act_bytes", "achieved_gbs_wkv",
]

if hasattr(F, "scaled_dot_product_attention"):
    sdpa = F.scaled_dot_product_attention
    SDPA_NATIVE = True
else:  # old torch (the CPU smoke test's Debian torch 1.13): same semantics
    SDPA_NATIVE = False

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        if is_causal:
            Lq, Lk = q.shape[-2], k.shape[-2]
            m = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq)
            s = s.masked_fill(~m, float("-inf"))
        return torch.matmul(torch.softmax(s.float(), dim=-1).to(q.dtype), v)


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------
# model


class Spec:
    """One step's shape: dec_B decodes at context dec_C, pre_B prefills of pre_T."""

    def __init__(self, dec_B=0, dec_C=0, pre_B=0, pre_T=0):
        self.dec_B, self.dec_C, self.pre_B, self.pre_T = dec_B, dec_C, pre_B, pre_T

    @property
    def tokens(self):
        return self.dec_B + self.pre_B * self.pre_T

    @property
    def lm_rows(self):
        return self.dec_B + self.pre_B

    @property
    def kind(self):
        if self.dec_B and self.pre_B:
            return "mixed"
        return "decode" if self.dec_B else "prefill"


class GPT2:
    def __init__(self, E, L, H, V, P, dtype, device, seed=0):
        self.E, self.L, self.H, self.D, self.V, self.P = E, L, H, E // H, V, P
        self.dtype, self.device = dtype, device
        g = torch.Generator(device=device)
        g.manual_seed(seed)

        def rnd(*shape, std=0.02):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

        def ln():
            return (1.0 + rnd(E, std=0.1), rnd(E, std=0.1))

        self.wte = rnd(V, E)
        self.wpe = rnd(P, E, std=0.01)
        self.layers = []
        for _ in range(L):
            self.layers.append(dict(
                ln1=ln(),
                w_qkv=rnd(3 * E, E), b_qkv=rnd(3 * E),
                w_o=rnd(E, E), b_o=rnd(E),
                ln2=ln(),
                w_fc=rnd(4 * E, E), b_fc=rnd(4 * E),
                w_fc2=rnd(E, 4 * E), b_fc2=rnd(E),
            ))
        self.lnf = ln()

    def param_count(self):
        E, L, V, P = self.E, self.L, self.V, self.P
        return V * E + P * E + L * (12 * E * E + 13 * E) + 2 * E

    def _attn(self, qkv, layer, spec, cache):
        E, H, D = self.E, self.H, self.D
        parts = []
        off = 0
        if spec.dec_B:
            n, C = spec.dec_B, spec.dec_C
            q, k, v = qkv[off:off + n].view(n, 3, H, D).unbind(1)  # [n, H, D] each
            kc, vc = cache["dec"][layer]  # [n, H, C+1, D]
            kc[:, :, C] = k
            vc[:, :, C] = v
            o = sdpa(q.unsqueeze(2), kc, vc)  # [n, H, 1, D]
            parts.append(o.reshape(n, E))
            off += n
        if spec.pre_B:
            Bp, T = spec.pre_B, spec.pre_T
            n = Bp * T
            q, k, v = qkv[off:off + n].view(Bp, T, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
            kc, vc = cache["pre"][layer]  # [Bp, H, T, D]
            kc.copy_(k)
            vc.copy_(v)
            o = sdpa(q, kc, vc, is_causal=True)  # [Bp, H, T, D]
            parts.append(o.transpose(1, 2).reshape(n, E))
        return parts[0] if len(parts) == 1 else torch.cat(parts, 0)

    def step(self, spec, dec_ids, pre_ids, cache):
        """dec_ids [dec_B] tokens at position dec_C; pre_ids [pre_B, pre_T] at 0..T-1.
        Returns logits [lm_rows, V]: decode rows first, then each prefill's last row."""
        E = self.E
        xs = []
        if spec.dec_B:
            xs.append(self.wte[dec_ids] + self.wpe[spec.dec_C])
        if spec.pre_B:
            xs.append((self.wte[pre_ids] + self.wpe[:spec.pre_T]).reshape(-1, E))
        x = xs[0] if len(xs) == 1 else torch.cat(xs, 0)
        for l, p in enumerate(self.layers):
            h = F.layer_norm(x, (E,), p["ln1"][0], p["ln1"][1], 1e-5)
            qkv = F.linear(h, p["w_qkv"], p["b_qkv"])
            a = self._attn(qkv, l, spec, cache)
            x = x + F.linear(a, p["w_o"], p["b_o"])
            h = F.layer_norm(x, (E,), p["ln2"][0], p["ln2"][1], 1e-5)
            h = F.gelu(F.linear(h, p["w_fc"], p["b_fc"]), approximate="tanh")
            x = x + F.linear(h, p["w_fc2"], p["b_fc2"])
        if spec.pre_B:
            last = x[spec.dec_B:].view(spec.pre_B, spec.pre_T, E)[:, -1]
            xl = last if not spec.dec_B else torch.cat([x[:spec.dec_B], last], 0)
        else:
            xl = x
        xl = F.layer_norm(xl, (E,), self.lnf[0], self.lnf[1], 1e-5)
        return F.linear(xl, self.wte)


def make_cache(model, spec, budget_bytes, fill=True):
    """Per-layer K/V buffers; layers share a pool when all would exceed budget_bytes."""
    H, D, L, dt, dev = model.H, model.D, model.L, model.dtype, model.device
    es = torch.tensor([], dtype=dt).element_size()
    shapes = {}
    if spec.dec_B:
        shapes["dec"] = (spec.dec_B, H, spec.dec_C + 1, D)
    if spec.pre_B:
        shapes["pre"] = (spec.pre_B, H, spec.pre_T, D)
    per_layer = sum(2 * math.prod(s) * es for s in shapes.values())
    nbuf = int(max(1, min(L, budget_bytes // max(per_layer, 1))))
    cache = {}
    for name, s in shapes.items():
        bufs = []
        for _ in range(nbuf):
            k = torch.empty(s, dtype=dt, device=dev)
            v = torch.empty(s, dtype=dt, device=dev)
            if fill:
                k.normal_()
                v.normal_()
            bufs.append((k, v))
        cache[name] = [bufs[l % nbuf] for l in range(L)]
    return cache, nbuf


def count_step(model, spec):
    """FLOPs and bytes of one step.

    FLOPs: 2 x (weights of the GEMMs) x tokens (QKV, proj, FC, FC2 per layer),
    plus 2 x V x E per LM-head row, plus attention QK^T and PV: 4 x E per
    (query, key) pair per layer (decode: C+1 keys per query; prefill: causal,
    T(T+1)/2 pairs per sequence).
    Bytes: every weight read once per step (the 12 E^2 + 13 E per layer, final
    LN, the full V x E LM head once, the embedding and position rows of the
    step's tokens); K/V: decode reads B(C+1) and writes B positions per layer,
    prefill writes Bp T positions and reads them once; activations approx.
    38 E element reads+writes per token per layer (LN, GEMM in/out, attention
    in/out, GELU, residuals) plus the logits written.
    """
    E, L, V = model.E, model.L, model.V
    es = torch.tensor([], dtype=model.dtype).element_size()
    N = spec.tokens
    gemm = 2 * N * 12 * E * E * L + 2 * spec.lm_rows * V * E
    pairs = spec.dec_B * (spec.dec_C + 1) + spec.pre_B * spec.pre_T * (spec.pre_T + 1) // 2
    attn = 4 * E * pairs * L
    flops = gemm + attn
    w_elems = L * (12 * E * E + 13 * E) + 2 * E + V * E + 2 * N * E
    kv_elems = L * 2 * E * (spec.dec_B * (spec.dec_C + 1) + spec.dec_B
                            + 2 * spec.pre_B * spec.pre_T)
    act_elems = 38 * E * N * L + spec.lm_rows * V
    return dict(flops=flops, weight_bytes=w_elems * es, kv_bytes=kv_elems * es,
                act_bytes=act_elems * es, bytes=(w_elems + kv_elems + act_elems) * es)


# --------------------------------------------------------------------------
# timing


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, device, target_s, min_reps, max_reps, warm=2):
    for _ in range(warm):
        fn()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    est = time.perf_counter() - t0
    reps = int(min(max_reps, max(min_reps, target_s / max(est, 1e-6))))
    times = []
    if device.type == "cuda":
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), reps


def capture_graph(fn, device):
    """Capture fn() into a CUDA graph; returns (graph, static output)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize(device)
    return g, out


# --------------------------------------------------------------------------
# ceilings


def nvidia_smi():
    res = {}
    for key, cmd in [
        ("query", ["nvidia-smi", "--query-gpu=name,driver_version,pstate,clocks.sm,clocks.max.sm,"
                   "clocks.mem,clocks.max.mem,power.draw,power.limit,temperature.gpu,memory.total",
                   "--format=csv"]),
        ("clocks", ["nvidia-smi", "-q", "-d", "CLOCK"]),
    ]:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
            res[key] = r.stdout.strip() or r.stderr.strip()
        except Exception as ex:  # noqa: BLE001 - best effort
            res[key] = "unavailable: %r" % (ex,)
    return res


def measure_ceilings(device, quick):
    out = {}
    # device-to-device copy: bytes read + bytes written
    nbytes = (64 << 20) if quick else (4 << 30)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    med, mn, reps = time_fn(lambda: dst.copy_(src), device, 0.3, 5, 30)
    out["copy"] = dict(bytes_each_way=nbytes, median_ms=med, min_ms=mn, reps=reps,
                       median_gbs=2 * nbytes / med / 1e6, best_gbs=2 * nbytes / mn / 1e6)
    log("ceiling copy %d MiB: median %.3f ms -> %.0f GB/s (best %.0f GB/s)"
        % (nbytes >> 20, med, out["copy"]["median_gbs"], out["copy"]["best_gbs"]))
    del src, dst
    # matmuls
    n = 512 if quick else 8192
    flops = 2 * n ** 3
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    for name, dt, tf32 in [("matmul_bf16", torch.bfloat16, False),
                           ("matmul_fp32_no_tf32", torch.float32, False),
                           ("matmul_fp32_tf32", torch.float32, True)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device=device, dtype=dt)
        b = torch.randn(n, n, device=device, dtype=dt)
        c = torch.empty(n, n, device=device, dtype=dt)
        med, mn, reps = time_fn(lambda: torch.matmul(a, b, out=c), device, 0.4, 5, 30)
        out[name] = dict(n=n, median_ms=med, min_ms=mn, reps=reps,
                         median_tflops=flops / med / 1e9, best_tflops=flops / mn / 1e9)
        log("ceiling %s %d^3: median %.3f ms -> %.1f TFLOP/s (best %.1f)"
            % (name, n, med, out[name]["median_tflops"], out[name]["best_tflops"]))
        del a, b, c
    torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return out


# --------------------------------------------------------------------------
# correctness


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def check_model(E, L, H, V, P, dtype, device, tol, use_graph):
    """Decode-after-prefill == prefill of the longer sequence; mixed == its parts;
    graph replay == eager. Returns dict of errors; raises on failure."""
    m = GPT2(E, L, H, V, P, dtype, device, seed=1)
    T, Bc, T2 = 24, 2, 16
    g = torch.Generator(device="cpu").manual_seed(2)
    full_ids = torch.randint(0, V, (Bc, T + 1), generator=g).to(device)
    q_ids = torch.randint(0, V, (1, T2), generator=g).to(device)
    inf = float("inf")
    errs = {}
    # reference: prefill of T+1 tokens, last row
    sp_full = Spec(pre_B=Bc, pre_T=T + 1)
    c_full, _ = make_cache(m, sp_full, inf, fill=False)
    ref = m.step(sp_full, None, full_ids, c_full)
    # prefill T tokens, then decode the (T+1)-th from the cache
    sp_pre = Spec(pre_B=Bc, pre_T=T)
    c_pre, _ = make_cache(m, sp_pre, inf, fill=False)
    m.step(sp_pre, None, full_ids[:, :T].contiguous(), c_pre)
    sp_dec = Spec(dec_B=Bc, dec_C=T)
    c_dec, _ = make_cache(m, sp_dec, inf, fill=True)  # position T is garbage until written
    for l in range(L):
        c_dec["dec"][l][0][:, :, :T].copy_(c_pre["pre"][l][0])
        c_dec["dec"][l][1][:, :, :T].copy_(c_pre["pre"][l][1])
    dec_ids = full_ids[:, T].contiguous()
    dec = m.step(sp_dec, dec_ids, None, c_dec)
    errs["decode_vs_full_prefill"] = rel_err(dec, ref)
    # standalone prefill of another sequence, and the mixed step of both
    sp_q = Spec(pre_B=1, pre_T=T2)
    c_q, _ = make_cache(m, sp_q, inf, fill=False)
    lq = m.step(sp_q, None, q_ids, c_q)
    sp_mix = Spec(dec_B=Bc, dec_C=T, pre_B=1, pre_T=T2)
    c_mix = {"dec": c_dec["dec"], "pre": make_cache(m, sp_q, inf, fill=True)[0]["pre"]}
    mix = m.step(sp_mix, dec_ids, q_ids, c_mix)
    errs["mixed_decode_rows"] = rel_err(mix[:Bc], dec)
    errs["mixed_prefill_row"] = rel_err(mix[Bc:], lq)
    if use_graph:
        try:
            gr, gout = capture_graph(lambda: m.step(sp_dec, dec_ids, None, c_dec), device)
            gr.replay()
            sync(device)
            errs["graph_vs_eager"] = rel_err(gout, dec)
            del gr, gout
        except Exception as ex:  # noqa: BLE001 - keep the eager timings
            errs["graph_vs_eager"] = float("nan")
            errs["graph_error"] = repr(ex)
            log("GRAPH CAPTURE FAILED in check: %r" % (ex,))
    num = {k: v for k, v in errs.items() if isinstance(v, float)}
    bad = {k: v for k, v in num.items() if not (v <= tol)}  # NaN fails too
    log("check %s E=%d L=%d: %s" % (str(dtype).replace("torch.", ""), E, L,
                                   ", ".join("%s %.2e" % kv for kv in num.items())))
    errs["ok"] = not bad
    if bad:
        # not fatal: device time is scarce, the timings stay useful; recorded in ceilings.json
        log("CORRECTNESS CHECK FAILED (tol %.1e): %r" % (tol, bad))
    return errs


# --------------------------------------------------------------------------
# main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke test")
    ap.add_argument("--models", default=",".join(SIZES), help="comma list of %s" % ",".join(SIZES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--kv-budget-gb", type=float, default=24.0)
    ap.add_argument("--target-s", type=float, default=0.25, help="timed seconds per point (approx.)")
    ap.add_argument("--min-reps", type=int, default=7)
    ap.add_argument("--max-reps", type=int, default=60)
    ap.add_argument("--time-budget-s", type=float, default=330.0,
                    help="stop starting new points after this many seconds")
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()

    t_start = time.time()
    device = torch.device(args.device)
    is_cuda = device.type == "cuda"
    if is_cuda:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch.backends, "cudnn"):
        torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    os.makedirs(args.out, exist_ok=True)

    if args.quick:
        sizes = {"tiny-a": (64, 2, 4), "tiny-b": (96, 3, 3)}
        vocab, npos = 1000, 128
        prefill_shapes = [(1, 16), (1, 64), (2, 32)]
        decode_B, decode_C = [1, 4, 8], [16, 127]
        graph_B = [1, 4]
        mixed = (4, 32, 16)  # decodes, context, prefill chunk
        args.target_s, args.min_reps, args.max_reps = 0.01, 2, 3
    else:
        sizes = {k: SIZES[k] for k in args.models.split(",")}
        vocab, npos = VOCAB, NPOS
        prefill_shapes = [(1, 128), (1, 512), (1, 1024), (4, 512)]
        decode_B, decode_C = [1, 8, 32, 128, 256], [128, 1023]
        graph_B = [1, 32]
        mixed = (32, 512, 256)
    dtypes = [d for d in args.dtypes.split(",")]
    budget = args.kv_budget_gb * (1 << 30)

    info = dict(
        date_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__, torch_cuda=getattr(torch.version, "cuda", None),
        python=platform.python_version(), device=str(device), quick=args.quick,
        sdpa_native=SDPA_NATIVE, model_matmul_allow_tf32=False,
        argv=sys.argv[1:],
    )
    if is_cuda:
        info["device_name"] = torch.cuda.get_device_name(device)
        p = torch.cuda.get_device_properties(device)
        info["device_props"] = dict(total_memory=p.total_memory, sm_count=p.multi_processor_count,
                                    capability="%d.%d" % (p.major, p.minor),
                                    l2_cache_size=getattr(p, "L2_cache_size", None))
        info["nvidia_smi_before"] = nvidia_smi()
    else:
        info["device_name"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    log("torch %s, device %s (%s)" % (torch.__version__, device, info["device_name"]))
    if is_cuda:
        log(info["nvidia_smi_before"]["query"])

    ceil_path = os.path.join(args.out, "ceilings.json")

    def write_ceilings():
        with open(ceil_path, "w") as f:
            json.dump(info, f, indent=2)

    write_ceilings()
    info["ceilings"] = measure_ceilings(device, args.quick)
    write_ceilings()

    if not args.no_check:
        E, L, H = list(sizes.values())[0] if args.quick else SIZES["124M"]
        if args.quick:
            L = 2
        chk = {}
        chk["float32"] = check_model(E, L, H, vocab, npos, torch.float32, device, 1e-4, is_cuda)
        chk["bfloat16"] = check_model(E, L, H, vocab, npos, torch.bfloat16, device, 3e-2, is_cuda)
        info["checks"] = chk
        write_ceilings()

    csv_path = os.path.join(args.out, "gpt2_steps.csv")
    fcsv = open(csv_path, "w", newline="")
    wr = csv.DictWriter(fcsv, fieldnames=CSV_COLUMNS)
    wr.writeheader()
    fcsv.flush()
    rows = []
    skipped = []
    failed = []

    def over_budget():
        return time.time() - t_start > args.time_budget_s

    def record(mname, dname, model, spec, graph, med, mn, reps, nbuf):
        c = count_step(model, spec)
        row = dict(model=mname, dtype=dname, kind=spec.kind,
                   batch=spec.dec_B + spec.pre_B, tokens=spec.tokens,
                   context=spec.dec_C if spec.dec_B else 0, graph=int(graph),
                   median_ms="%.4f" % med, min_ms="%.4f" % mn, flops=c["flops"], bytes=c["bytes"],
                   achieved_tflops="%.3f" % (c["flops"] / med / 1e9),
                   achieved_gbs="%.1f" % (c["bytes"] / med / 1e6),
                   reps=reps, lm_rows=spec.lm_rows, kv_bufs=nbuf,
                   weight_bytes=c["weight_bytes"], kv_bytes=c["kv_bytes"], act_bytes=c["act_bytes"],
                   achieved_gbs_wkv="%.1f" % ((c["weight_bytes"] + c["kv_bytes"]) / med / 1e6))
        wr.writerow(row)
        fcsv.flush()
        os.fsync(fcsv.fileno())
        rows.append(row)
        log("  %-6s %-8s %-7s B=%-3d tok=%-5d C=%-5d g=%d  %9.3f ms (min %9.3f, n=%2d)  %8.2f TFLOP/s %7.0f GB/s"
            % (mname, dname, spec.kind, row["batch"], spec.tokens, row["context"], graph, med, mn,
               reps, c["flops"] / med / 1e9, c["bytes"] / med / 1e6))

    gen = torch.Generator(device="cpu").manual_seed(3)
    graphs_ok = [not any("graph_error" in v for v in info.get("checks", {}).values())]

    def ids(*shape):
        return torch.randint(0, vocab, shape, generator=gen).to(device)

    def run_point(mname, dname, model, spec, graph_too=False):
        try:
            run_point_(mname, dname, model, spec, graph_too)
        except Exception as ex:  # noqa: BLE001 - one failed point must not end the run
            failed.append("%s %s %s B=%d/%d T=%d C=%d: %r" % (mname, dname, spec.kind, spec.dec_B,
                                                            spec.pre_B, spec.pre_T, spec.dec_C, ex))
            log("POINT FAILED: " + failed[-1])
            traceback.print_exc()
            sys.stdout.flush()
            if is_cuda:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()

    def run_point_(mname, dname, model, spec, graph_too=False):
        if over_budget():
            skipped.append((mname, dname, spec.kind, spec.dec_B, spec.pre_B, spec.pre_T, spec.dec_C))
            return
        cache, nbuf = make_cache(model, spec, budget)
        d_ids = ids(spec.dec_B) if spec.dec_B else None
        p_ids = ids(spec.pre_B, spec.pre_T) if spec.pre_B else None

        def fn():
            return model.step(spec, d_ids, p_ids, cache)

        med, mn, reps = time_fn(fn, device, args.target_s, args.min_reps, args.max_reps)
        record(mname, dname, model, spec, False, med, mn, reps, nbuf)
        if graph_too and is_cuda and graphs_ok[0] and not over_budget():
            gr, _ = capture_graph(fn, device)
            med, mn, reps = time_fn(gr.replay, device, args.target_s, args.min_reps, args.max_reps)
            record(mname, dname, model, spec, True, med, mn, reps, nbuf)
            del gr
        del cache
        if is_cuda:
            torch.cuda.empty_cache()

    for mname, (E, L, H) in sizes.items():
        for dname in dtypes:
            if over_budget():
                skipped.append((mname, dname, "all"))
                continue
            t0 = time.time()
            model = GPT2(E, L, H, vocab, npos, DTYPES[dname], device, seed=0)
            sync(device)
            log("model %s %s: E=%d L=%d H=%d, %.1fM params (built in %.1f s; %.0f s elapsed)"
                % (mname, dname, E, L, H, model.param_count() / 1e6, time.time() - t0,
                   time.time() - t_start))
            for Bp, T in prefill_shapes:
                run_point(mname, dname, model, Spec(pre_B=Bp, pre_T=T))
            for C in decode_C:
                for B in decode_B:
                    run_point(mname, dname, model, Spec(dec_B=B, dec_C=C), graph_too=B in graph_B)
            nd, cd, tp = mixed
            run_point(mname, dname, model, Spec(dec_B=nd, dec_C=cd, pre_B=1, pre_T=tp))
            del model
            if is_cuda:
                torch.cuda.empty_cache()
    fcsv.close()

    if is_cuda:
        info["nvidia_smi_after"] = nvidia_smi()
        info["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    info["points"] = len(rows)
    info["skipped"] = skipped
    info["failed"] = failed
    info["elapsed_s"] = round(time.time() - t_start, 1)
    write_ceilings()

    # short summary table
    def find(m, d, kind, batch, ctx, graph, tokens=None):
        for r in rows:
            if (r["model"], r["dtype"], r["kind"], r["batch"], r["context"], r["graph"]) == \
                    (m, d, kind, batch, ctx, graph) and (tokens is None or r["tokens"] == tokens):
                return float(r["median_ms"])
        return float("nan")

    cl, ch = decode_C[0], decode_C[-1]
    b1, bm, bx = decode_B[0], graph_B[-1], decode_B[-1]
    pT = max(T for Bp, T in prefill_shapes if Bp == 1)
    log("")
    log("summary (median ms): dec = decode at context C, g = CUDA graph replay")
    hdr = ("model", "dtype", "dec%d C%d" % (b1, cl), "g" , "dec%d C%d" % (b1, ch), "g",
           "dec%d C%d" % (bm, ch), "g", "dec%d C%d" % (bx, ch), "prefill %d" % pT)
    log("%-7s %-8s %10s %8s %10s %8s %10s %8s %10s %10s" % hdr)
    for mname in sizes:
        for dname in dtypes:
            v = (find(mname, dname, "decode", b1, cl, 0), find(mname, dname, "decode", b1, cl, 1),
                 find(mname, dname, "decode", b1, ch, 0), find(mname, dname, "decode", b1, ch, 1),
                 find(mname, dname, "decode", bm, ch, 0), find(mname, dname, "decode", bm, ch, 1),
                 find(mname, dname, "decode", bx, ch, 0),
                 find(mname, dname, "prefill", 1, 0, 0, tokens=pT))
            log("%-7s %-8s %10.3f %8.3f %10.3f %8.3f %10.3f %8.3f %10.3f %10.3f" % ((mname, dname) + v))
    c = info["ceilings"]
    log("ceilings: copy %.0f GB/s, bf16 %.0f TFLOP/s, fp32 %.1f TFLOP/s (TF32 on: %.1f)"
        % (c["copy"]["median_gbs"], c["matmul_bf16"]["median_tflops"],
           c["matmul_fp32_no_tf32"]["median_tflops"], c["matmul_fp32_tf32"]["median_tflops"]))
    log("%d points, %d skipped, %d failed, %.0f s; wrote %s and %s"
        % (len(rows), len(skipped), len(failed), time.time() - t_start, csv_path, ceil_path))


if __name__ == "__main__":
    main()
