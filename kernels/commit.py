"""Any-order KV commit (Triton); same contract as `packed_ss.commit.commit_rows`.

One program per candidate i copies row src[i] (all KV heads) of K and V to cache slot cache_len + i
when i < count. count and cache_len are read from their device tensors: the launch has a fixed grid
(CUDA-graph capturable) and programs past count return without touching memory. Slots are distinct,
so running the copies in parallel gives the same result as running them in order.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _commit_kernel(KC, VC, KR, VR, src_ptr, count_ptr, cache_len_ptr,
                   s_kch, s_kcs, s_vch, s_vcs, s_kr, s_kh, s_vr, s_vh,
                   HKV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    if i < tl.load(count_ptr):
        row = tl.load(src_ptr + i)
        slot = tl.load(cache_len_ptr) + i
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        ok = (h < HKV) & (d < D)
        kk = tl.load(KR + row * s_kr + h * s_kh + d, mask=ok)
        vv = tl.load(VR + row * s_vr + h * s_vh + d, mask=ok)
        tl.store(KC + h * s_kch + slot * s_kcs + d, kk.to(KC.dtype.element_ty), mask=ok)
        tl.store(VC + h * s_vch + slot * s_vcs + d, vv.to(VC.dtype.element_ty), mask=ok)


def commit_rows(k_cache, v_cache, k_rows, v_rows, src, count, cache_len) -> None:
    """For i < count: cache slot cache_len + i <- row src[i] of k_rows / v_rows ([N, Hkv, D]); in place."""
    kv_heads, _, dim = k_cache.shape
    assert k_rows.shape[1:] == v_rows.shape[1:] == (kv_heads, dim) and v_cache.shape == k_cache.shape
    assert k_cache.stride(-1) == v_cache.stride(-1) == k_rows.stride(-1) == v_rows.stride(-1) == 1
    if src.numel() == 0:
        return
    _commit_kernel[(src.numel(),)](
        k_cache, v_cache, k_rows, v_rows, src, count, cache_len,
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k_rows.stride(0), k_rows.stride(1), v_rows.stride(0), v_rows.stride(1),
        HKV=kv_heads, D=dim, BLOCK_H=triton.next_power_of_2(kv_heads),
        BLOCK_D=triton.next_power_of_2(dim), num_warps=4,
    )
