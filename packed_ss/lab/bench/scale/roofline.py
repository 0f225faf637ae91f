"""The roofline of a model call: its per-call latency against rows, cache length and batch (latency.py, CUDA
graph replays on CUDA), next to the bytes it must read - the weights once, the K/V it attends to - and the
bandwidth that achieves, as a share of the device's copy bandwidth measured in the same run."""
from __future__ import annotations

import statistics

import torch

from ..latency import seconds, measure_latency

COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 26}   # the copy bandwidth's buffer: far beyond any cache
COPY_REPS = 10
MEMORY_MARGIN = 0.8       # a sweep point runs only if its K/V and logits need under this share of free memory


@torch.inference_mode()
def copy_bandwidth(device: torch.device) -> dict:
    """A large device-to-device copy: (bytes read + bytes written) / the median time of COPY_REPS copies."""
    n = COPY_BYTES[device.type]
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    median_s = statistics.median(seconds(lambda: dst.copy_(src), device) for _ in range(COPY_REPS))
    return {"bytes": n, "reps": COPY_REPS, "median_s": median_s, "gb_per_s": 2 * n / median_s / 1e9}


def weight_bytes(model) -> int:
    """Bytes of weights one call reads: every parameter once (a tied head once), less the embedding table,
    which a call reads a row of per input row (negligible, not counted)."""
    embed = model.model.embed_tokens.weight
    params = {id(p): p for p in model.parameters()}
    if model.lm_head.weight is not embed:
        params.pop(id(embed))
    return sum(p.numel() * p.element_size() for p in params.values())


def kv_bytes_per_token(model) -> int:
    """K/V bytes per cached position of one request (every layer's keys and values), from a pool of one position."""
    k, v = model.kv_pools(1, 1)
    return k.numel() * k.element_size() + v.numel() * v.element_size()


def fits(model, batch: int, capacity: int, rows: int) -> str | None:
    """None when a batch of `batch` requests with `capacity` cache slots and a call of `rows` rows fits in the
    device's free memory (CUDA; always on the CPU), else why not."""
    if model.device.type != "cuda":
        return None
    need = batch * (capacity * kv_bytes_per_token(model) + 2 * rows * model.cfg.vocab_size * model.dtype.itemsize)
    torch.cuda.empty_cache()        # what the last point's cache and graphs left reserved
    free, _ = torch.cuda.mem_get_info(model.device)
    if need > MEMORY_MARGIN * free:
        return f"needs {need / 2**30:.1f} GiB of K/V and logits, {free / 2**30:.1f} GiB free"
    return None


def sweep_point(model, widths: list[int], rows: list[int], max_rows: int, cache_len: int, batch: int,
                reps: int, copy: dict) -> dict:
    """The latency fit at one cache length and batch, each point with its bytes and bandwidth; or the reason
    it was skipped."""
    capacity = cache_len + max_rows
    skipped = fits(model, batch, capacity, max_rows)
    if skipped:
        return {"cache_len": cache_len, "batch": batch, "skipped": skipped}
    lat = measure_latency(model, widths, cache_len, capacity, reps, batch, graph=model.device.type == "cuda",
                          rows=rows, max_rows=max_rows)
    weights, kv = weight_bytes(model), batch * cache_len * kv_bytes_per_token(model)
    lat["weight_bytes"], lat["kv_bytes"] = weights, kv
    lat["weight_read_ms"] = 1e3 * weights / (copy["gb_per_s"] * 1e9)
    for p in lat["points"]:
        p["bytes"] = weights + kv
        p["gb_per_s"] = p["bytes"] / (p["median_ms"] * 1e-3) / 1e9
        p["copy_share"] = p["gb_per_s"] / copy["gb_per_s"]
    return lat


def attention_bandwidth(fits_: list[dict], copy: dict) -> list[dict]:
    """Per batch and call shape: the extra K/V bytes between the shortest and the longest cache length over the
    extra time, the bandwidth at which the call's attention reads the cache."""
    out = []
    for batch in sorted({f["batch"] for f in fits_ if "points" in f}):
        runs = sorted((f for f in fits_ if f["batch"] == batch and "points" in f), key=lambda f: f["cache_len"])
        if len(runs) < 2:
            continue
        short, long = runs[0], runs[-1]
        for a, b in zip(short["points"], long["points"]):
            extra_s = 1e-3 * (b["median_ms"] - a["median_ms"])
            gbps = (long["kv_bytes"] - short["kv_bytes"]) / extra_s / 1e9 if extra_s > 0 else None
            out.append({"batch": batch, "kind": a["kind"], "rows": a["rows"], "from_cache_len": short["cache_len"],
                        "to_cache_len": long["cache_len"], "gb_per_s": gbps,
                        "copy_share": None if gbps is None else gbps / copy["gb_per_s"]})
    return out
