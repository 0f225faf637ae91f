"""Per-call latency of packed attention at Nemotron-8B shapes, against the baselines of DESIGN.md §6.

One packed call: B anchor rows (causal, K/V written into the cache) + B scratch rows (full among
themselves, see the cache only), 32 query heads, 8 KV heads, head_dim 128, B = 32 (2B = 64 rows).

Methods (each gets the same q/k/v and cache; outputs are checked against the torch reference):
  fused        kernels/attention.py: one launch (plus a combine launch with split-KV)
  sdpa_mask    SDPA over cache[:L] with a dense bool mask [2B, L] (scratch K/V stored after the anchors)
  flex         FlexAttention with a block mask built from the same rule (compiled on the GPU)
  sdpa_nomask  the floor: same rows over all L keys, no mask
  flash_attn   two flash_attn_with_kvcache calls (full scratch call, then causal anchors), if importable
  copy         a device-to-device copy of the K/V bytes one call reads (the bandwidth ceiling)

Bandwidth is K/V bytes one call must read, 2 * Hkv * L * D * itemsize with L = cache_len + 2B, over
its time; the copy's is (read + write) bytes over time. Each timed call uses its own "layer" of the
cache, cycling over enough layers to exceed the L2, so K/V come from device memory as in a model.
On the GPU every method is timed by replaying a CUDA graph of one pass over the layers (what the
engine does), falling back to eager launches where capture fails; on the CPU by wall clock.

    python bench/attention.py --out results/attention.json            # GPU
    python bench/attention.py --quick --out /tmp/attention_cpu.json   # CPU smoke run, reduced sizes
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from packed_ss.decode.schedules.base import layout
from packed_ss.model.attention import packed_attention_ref
from packed_ss.model.dual_mode import PAGE_SIZE as PAGE

L2_BYTES = 64 << 20


def packed_layout(block: int, device):
    """The packed schedule's call: B causal anchors, then B scratch rows (segment 1, cache only)."""
    return layout(device, block, [1] * block, [-1] * block)


def visible(lay, cache_len: int):
    """mask_mod over keys cache[:cache_len + R], the scratch rows stored right after the anchors."""
    n, rows = lay.n_anchor, lay.rows

    def mask_mod(b, h, qi, kj):
        c = (kj - cache_len).clamp(0, rows - 1)
        prefix = kj < cache_len + lay.see[qi] + 1
        scratch = (lay.seg[c] == lay.seg[qi]) & (lay.seg[qi] > 0)
        return torch.where(kj < cache_len + n, prefix, scratch)
    return mask_mod


class Timer:
    """Per-call seconds of `fn(layer)` averaged over passes over all layers."""

    def __init__(self, device, reps: int):
        self.cuda, self.reps = device.type == "cuda", reps

    def __call__(self, fn, layers: int):
        def one_pass():
            for i in range(layers):
                fn(i)
        one_pass()                                   # warm up (compiles)
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(self.reps):
                one_pass()
            return (time.perf_counter() - t0) / (self.reps * layers), "wall"
        run, mode = one_pass, "eager"
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                one_pass()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                one_pass()
            run, mode = graph.replay, "graph"
        except Exception as err:                     # noqa: BLE001 - fall back, and say so in the JSON
            mode = f"eager ({type(err).__name__})"
        run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.reps):
            run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / (self.reps * layers), mode


class Case:
    """Inputs of one packed call at one cached length, replicated over enough cache layers to beat the L2."""

    def __init__(self, args, cache_len: int):
        dev, dt = args.device, args.dtype
        self.block, self.cache_len, self.dev = args.block, cache_len, dev
        self.lay = packed_layout(args.block, dev)
        rows = self.lay.rows
        self.keys = cache_len + rows
        capacity = 256 * math.ceil(self.keys / 256)
        self.kv_bytes = 2 * args.kv_heads * self.keys * args.head_dim * torch.finfo(dt).bits // 8
        self.layers = max(2, min(64, math.ceil(4 * L2_BYTES / self.kv_bytes))) if dev.type == "cuda" else 1
        gen = torch.Generator(device=dev).manual_seed(cache_len)
        self.q = torch.randn(rows, args.heads, args.head_dim, device=dev, dtype=dt, generator=gen)
        self.k, self.v = (torch.randn(rows, args.kv_heads, args.head_dim, device=dev, dtype=dt, generator=gen)
                          for _ in range(2))
        self.kc = torch.randn(self.layers, args.kv_heads, capacity, args.head_dim, device=dev, dtype=dt,
                              generator=gen)
        self.vc = torch.randn_like(self.kc)
        # Baselines read every row's K/V from the cache: anchors at cache_len + a, scratch right after.
        self.kc[:, :, cache_len:self.keys] = self.k.transpose(0, 1)
        self.vc[:, :, cache_len:self.keys] = self.v.transpose(0, 1)
        self.length = torch.tensor([cache_len], device=dev)
        self.scale = args.head_dim ** -0.5
        # The fused kernel's view of the same cache: pages of PAGE positions in order, [layers, pages, PAGE, Hkv, D].
        pages = capacity // PAGE
        self.kp, self.vp = (c.transpose(1, 2).reshape(self.layers, pages, PAGE, args.kv_heads, args.head_dim)
                            for c in (self.kc, self.vc))
        self.table = torch.arange(pages, device=dev)[None]
        self.ref = packed_attention_ref(self.q[None].float(), self.k[None].float(), self.v[None].float(),
                                        self.kp[0].float(), self.vp[0].float(), self.table, self.length, self.lay,
                                        self.scale)[0]
        self.mask_mod = visible(self.lay, cache_len)
        self.qh = self.q.transpose(0, 1)[None]      # [1, H, R, D]

    def kv(self, i):
        return self.kc[i, :, :self.keys][None], self.vc[i, :, :self.keys][None]

    def fused(self, **kw):
        from packed_ss.kernels.attention import packed_attention
        return lambda i: packed_attention(self.q[None], self.k[None], self.v[None], self.kp[i], self.vp[i], self.table,
                                          self.length, self.lay, self.scale, **kw)[0]

    def sdpa_mask(self):
        qi = torch.arange(self.lay.rows, device=self.dev)[:, None]
        dense = self.mask_mod(0, 0, qi, torch.arange(self.keys, device=self.dev)[None, :])
        return lambda i: F.scaled_dot_product_attention(self.qh, *self.kv(i), attn_mask=dense, scale=self.scale,
                                                        enable_gqa=True)[0].transpose(0, 1)

    def sdpa_nomask(self):
        return lambda i: F.scaled_dot_product_attention(self.qh, *self.kv(i), scale=self.scale,
                                                        enable_gqa=True)[0].transpose(0, 1)

    def flex(self):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        fa = torch.compile(flex_attention, dynamic=False) if self.dev.type == "cuda" else flex_attention
        bm = create_block_mask(self.mask_mod, None, None, self.lay.rows, self.keys, device=self.dev)
        return lambda i: fa(self.qh, *self.kv(i), block_mask=bm, scale=self.scale,
                            enable_gqa=True)[0].transpose(0, 1)

    def flash_attn(self):
        from flash_attn import flash_attn_with_kvcache
        b, q, k, v = self.block, self.q[None], self.k[None], self.v[None]
        knhd, vnhd = (c.transpose(1, 2).contiguous() for c in (self.kc, self.vc))   # [layers, S, Hkv, D]
        seqlens = torch.full((1,), self.cache_len, dtype=torch.int32, device=self.dev)

        def call(i):
            # Scratch rows first (full, appended at cache_len), then anchors overwrite those slots (causal).
            kv = knhd[i:i + 1], vnhd[i:i + 1]
            o_s = flash_attn_with_kvcache(q[:, b:], *kv, k=k[:, b:], v=v[:, b:], cache_seqlens=seqlens,
                                          softmax_scale=self.scale)
            o_a = flash_attn_with_kvcache(q[:, :b], *kv, k=k[:, :b], v=v[:, :b], cache_seqlens=seqlens,
                                          softmax_scale=self.scale, causal=True)
            return torch.cat([o_a[0], o_s[0]])
        return call

    def measure(self, name, fn, timer, skipped):
        """A result row for one method; sdpa_nomask's error is not checked (it sees every key)."""
        try:
            err = None if name == "sdpa_nomask" else (fn(0).float() - self.ref).abs().max().item()
            sec, mode = timer(fn, self.layers)
        except Exception as exc:                     # noqa: BLE001 - a baseline that cannot run is reported
            skipped.append(f"{name} @ {self.cache_len}: {type(exc).__name__}: {exc}")
            return None
        return dict(method=name, cache_len=self.cache_len, us=sec * 1e6, kv_GBps=self.kv_bytes / sec / 1e9,
                    max_err=err, timing=mode)

    def copy(self, timer):
        src = torch.empty(self.layers, self.kv_bytes // 2, dtype=torch.float16, device=self.dev)
        dst = torch.empty_like(src)
        sec, mode = timer(lambda i: dst[i].copy_(src[i]), self.layers)
        return dict(method="copy", cache_len=self.cache_len, us=sec * 1e6, kv_GBps=2 * self.kv_bytes / sec / 1e9,
                    max_err=None, timing=mode)


def bench_length(case, timer, methods, skipped):
    rows = [case.measure(name, getattr(case, name)(), timer, skipped) for name in methods]
    rows = [r for r in rows if r is not None] + [case.copy(timer)]
    for r in rows:
        r["pct_of_copy"] = 100 * r["kv_GBps"] / rows[-1]["kv_GBps"]
    return rows


def sweep(case, timer, skipped):
    """Fused-kernel launch configurations at one cached length (the defaults were chosen without a GPU)."""
    results = []
    for bm in (32, 64, 128):
        for bn in (64, 128):
            for splits in (1, 4, 8, 16):
                for warps in (4, 8):
                    kw = dict(block_m=bm, block_n=bn, num_splits=splits, num_warps=warps)
                    r = case.measure("fused", case.fused(**kw), timer, skipped)
                    if r is not None:                # printed as measured: a timeout keeps them
                        results.append(dict(kw, us=r["us"], max_err=r["max_err"]))
                        print(f"  sweep {kw} {r['us']:.1f} us", flush=True)
    return sorted(results, key=lambda r: r["us"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("attention_bench.json"))
    p.add_argument("--quick", action="store_true", help="reduced sizes (CPU smoke run)")
    p.add_argument("--lengths", type=int, nargs="*", help="cached lengths (default 512..8192, doubling)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--sweep", action="store_true", help="also sweep fused launch configs at the largest length")
    args = p.parse_args()

    args.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = args.device.type == "cuda"
    args.dtype = torch.bfloat16 if gpu else torch.float32
    if not gpu:
        torch.set_num_threads(1)                     # spinning intra-op threads on a shared CPU swamp timings
    if args.quick:
        args.heads, args.kv_heads, args.head_dim, args.block = 8, 2, 64, 8
        lengths = args.lengths or [256, 512, 1024]
    else:
        args.heads, args.kv_heads, args.head_dim, args.block = 32, 8, 128, 32
        lengths = args.lengths or [512, 1024, 2048, 4096, 8192]
    timer = Timer(args.device, args.reps or (20 if gpu else 5))

    methods, skipped = ["sdpa_mask", "flex", "sdpa_nomask"], []
    if gpu:
        methods.insert(0, "fused")
    else:
        skipped.append("fused: Triton kernels need a GPU (the interpreter's timings mean nothing)")
        skipped.append("flex compiled: CPU compiles take ~30 s per shape; timed eagerly instead")
    try:
        import flash_attn  # noqa: F401
        if gpu:
            methods.append("flash_attn")
        else:
            skipped.append("flash_attn: needs a GPU")
    except ImportError:
        skipped.append("flash_attn: not importable")

    report = dict(device=torch.cuda.get_device_name() if gpu else "cpu", torch=torch.__version__,
                  dtype=str(args.dtype), shape=dict(rows=2 * args.block, heads=args.heads,
                                                    kv_heads=args.kv_heads, head_dim=args.head_dim),
                  results=[], layers={}, skipped=skipped)
    if gpu:
        import triton
        report["triton"] = triton.__version__
    print(f"{report['device']}  {report['dtype']}  rows={2 * args.block} H={args.heads} Hkv={args.kv_heads} "
          f"D={args.head_dim}")
    print(f"{'method':<12} {'cached':>7} {'us/call':>9} {'KV GB/s':>9} {'% copy':>7} {'max err':>9}  timing")
    case = None
    for n in lengths:                                # rows are printed as they come: a timeout keeps them
        case = Case(args, n)
        report["layers"][n] = dict(layers=case.layers, kv_bytes=case.kv_bytes)
        for r in bench_length(case, timer, methods, skipped):
            report["results"].append(r)
            err = "-" if r["max_err"] is None else f"{r['max_err']:.2e}"
            print(f"{r['method']:<12} {r['cache_len']:>7} {r['us']:>9.1f} {r['kv_GBps']:>9.1f} "
                  f"{r['pct_of_copy']:>6.1f}% {err:>9}  {r['timing']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    try:
        plot(report["results"], args.out.with_suffix(".png"), report)
    except ImportError:
        print("no matplotlib: plot skipped")

    if args.sweep and gpu:
        report["sweep"] = sweep(case, timer, skipped)
        print(f"fused sweep at {lengths[-1]} cached, fastest first:")
        for r in report["sweep"][:8]:
            print("  " + "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        args.out.write_text(json.dumps(report, indent=1))
    for s in skipped:
        print("skipped:", s)
    print("wrote", args.out)


def plot(results, path, report):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["method"] for r in results):
        pts = [(r["cache_len"], r["us"]) for r in results if r["method"] == name]
        ax.plot(*zip(*pts), marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="cached tokens", ylabel="us per call",
           title=f"packed attention, {report['device']}, {report['dtype']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
