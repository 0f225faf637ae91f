"""Fused packed attention over the KV cache (Triton); same contract as `packed_ss.model.attention.packed_attention_ref`.

One kernel does the whole call, anchor commit included, for a batch of B requests that share the layout
(each with its own cache positions and cache_len[b]). The cache is paged: position j of request b lives in pool page
table[b, j // PAGE_SIZE] at offset j % PAGE_SIZE (model/attention.py), so every cache load and anchor store
goes through the request's row of the page table.
Each program owns a tile of BLOCK_M query vectors of one KV head of one request (grid axis 1 is
b * Hkv + hkv): the H/Hkv query heads that share a KV head are flattened into the tile's rows
(m = row * G + head_in_group), so every K/V block is loaded once per tile whatever the GQA ratio.
The keys a row can see come in three ranges, each read from where it lives:

1. cache positions [0, cache_len[b])   - every row sees all of them (see[r] >= -1); no mask but the tail;
2. anchors a in [0, n_anchor)      - visible iff a <= see[r]; read from the call's own K/V, not the
                                     cache, so the in-place write below never races with a read;
                                     loop bound max(see in tile) + 1 (causal blocks are skipped);
3. scratch rows c >= n_anchor      - visible iff seg[c] == seg[r] > 0; K/V blocks whose segment ids
                                     match no row of the tile are skipped (quadratic branches).

The mask comes from O(rows) metadata and `cache_len[b]` is loaded from its device tensor, so the grid
depends only on static shapes: the call is CUDA-graph capturable. The anchors' K/V are written to
cache positions cache_len[b] + a by the same launch (the anchor blocks are spread over all programs of a KV
head of a request); reading them from the call's K/V is equivalent because position cache_len[b] + a holds
k[b, a] after the write. Precondition (true of every layout the engine issues): see[r] < n_anchor.

Split-KV (flash-decoding): with NUM_SPLITS > 1 each request's cache range is cut into NUM_SPLITS
device-computed chunks, one per program along grid axis 2; the last split also takes anchors and
scratch rows. Each split writes an unnormalised partial (acc, max, sum) and a small kernel combines
them. This keeps a decode call with few query tiles (2B = 64 rows) from using only a handful of SMs.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ..model.attention import Layout

_LOG2E = 1.4426950408889634


@triton.jit
def _online_update(acc, m_i, l_i, q, k, v, visible, scale_log2, PREC: tl.constexpr):
    """One flash-attention step: fold K/V block (k [N, D], v [N, D]) into the running softmax state."""
    qk = (tl.dot(q, tl.trans(k), input_precision=PREC) * scale_log2).to(tl.float32)   # compile passes fp64 scales
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return acc, m_new, l_i


@triton.jit
def _packed_attention_kernel(
    Q, K, V, KC, VC, Table, Out, OPart, MPart, LPart, cache_len_ptr, seg_ptr, see_ptr,
    R, n_anchor, HKV, scale_log2, s_cl, s_see, n_table, s_tb,
    s_qb, s_qr, s_qh, s_kb, s_kr, s_kh, s_vb, s_vr, s_vh,
    s_kcn, s_kcs, s_kch, s_vcn, s_vcs, s_vch, s_ob, s_or, s_oh,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr, PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1) // HKV
    hkv = tl.program_id(1) % HKV
    split = tl.program_id(2)
    cache_len = tl.load(cache_len_ptr + b * s_cl)
    # Request b's tensors; 64-bit offsets (a batch of big caches can span more than 2^31 elements).
    b64 = b.to(tl.int64)
    Q += b64 * s_qb
    K += b64 * s_kb
    V += b64 * s_vb
    Table += b64 * s_tb
    Out += b64 * s_ob

    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d[None, :] < D

    # In-place anchor commit: anchor block i goes to program i mod (programs of this request's KV head).
    me = pid_m * NUM_SPLITS + split
    n_prog = tl.num_programs(0) * NUM_SPLITS
    for w0 in range(me * BLOCK_N, n_anchor, n_prog * BLOCK_N):
        w = w0 + offs_n
        w_ok = (w[:, None] < n_anchor) & d_ok
        kw = tl.load(K + w[:, None] * s_kr + hkv * s_kh + offs_d[None, :], mask=w_ok)
        vw = tl.load(V + w[:, None] * s_vr + hkv * s_vh + offs_d[None, :], mask=w_ok)
        position = cache_len + w
        column = position // PAGE_SIZE
        inside = (w < n_anchor) & (column < n_table)               # past the table: not stored (the null page)
        page = tl.load(Table + column, mask=inside, other=0).to(tl.int64)
        offset = position % PAGE_SIZE
        w_ok = w_ok & inside[:, None]
        tl.store(KC + page[:, None] * s_kcn + offset[:, None] * s_kcs + hkv * s_kch + offs_d[None, :],
                 kw.to(KC.dtype.element_ty), mask=w_ok)
        tl.store(VC + page[:, None] * s_vcn + offset[:, None] * s_vcs + hkv * s_vch + offs_d[None, :],
                 vw.to(VC.dtype.element_ty), mask=w_ok)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row = offs_m // G
    head = hkv * G + offs_m % G
    row_ok = row < R
    q = tl.load(Q + row[:, None] * s_qr + head[:, None] * s_qh + offs_d[None, :], mask=row_ok[:, None] & d_ok)
    see_r = tl.load(see_ptr + b64 * s_see + row, mask=row_ok, other=-1)
    seg_r = tl.load(seg_ptr + row, mask=row_ok, other=0)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # 1. The cached prefix, this split's chunk of it.
    chunk = tl.cdiv(tl.cdiv(cache_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, cache_len)
    for j0 in range(lo, hi, BLOCK_N):
        j = j0 + offs_n
        ok = (j[:, None] < hi) & d_ok
        page = tl.load(Table + j // PAGE_SIZE, mask=j < hi, other=0).to(tl.int64)
        offset = j % PAGE_SIZE
        kk = tl.load(KC + page[:, None] * s_kcn + offset[:, None] * s_kcs + hkv * s_kch + offs_d[None, :],
                     mask=ok, other=0.0)
        vv = tl.load(VC + page[:, None] * s_vcn + offset[:, None] * s_vcs + hkv * s_vch + offs_d[None, :],
                     mask=ok, other=0.0)
        visible = j[None, :] < hi
        acc, m_i, l_i = _online_update(acc, m_i, l_i, q, kk, vv, visible, scale_log2, PREC)

    if split == NUM_SPLITS - 1:
        # 2. This call's anchors (causal / up to see[r]), straight from K/V.
        a_hi = tl.minimum(tl.max(see_r) + 1, n_anchor)
        for a0 in range(0, a_hi, BLOCK_N):
            a = a0 + offs_n
            ok = (a[:, None] < n_anchor) & d_ok
            kk = tl.load(K + a[:, None] * s_kr + hkv * s_kh + offs_d[None, :], mask=ok, other=0.0)
            vv = tl.load(V + a[:, None] * s_vr + hkv * s_vh + offs_d[None, :], mask=ok, other=0.0)
            visible = (a[None, :] <= see_r[:, None]) & (a[None, :] < n_anchor)
            acc, m_i, l_i = _online_update(acc, m_i, l_i, q, kk, vv, visible, scale_log2, PREC)

        # 3. Scratch rows of the same segment; blocks no row of this tile can see are skipped.
        for c0 in range(n_anchor, R, BLOCK_N):
            c = c0 + offs_n
            seg_c = tl.load(seg_ptr + c, mask=c < R, other=-1)
            visible = (seg_r[:, None] == seg_c[None, :]) & (seg_r[:, None] > 0)
            if tl.max(visible.to(tl.int32)) > 0:
                ok = (c[:, None] < R) & d_ok
                kk = tl.load(K + c[:, None] * s_kr + hkv * s_kh + offs_d[None, :], mask=ok, other=0.0)
                vv = tl.load(V + c[:, None] * s_vr + hkv * s_vh + offs_d[None, :], mask=ok, other=0.0)
                acc, m_i, l_i = _online_update(acc, m_i, l_i, q, kk, vv, visible, scale_log2, PREC)

    out_ok = row_ok[:, None] & d_ok
    if NUM_SPLITS == 1:
        out = acc / tl.where(row_ok, l_i, 1.0)[:, None]   # padding rows may have seen nothing
        tl.store(Out + row[:, None] * s_or + head[:, None] * s_oh + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=out_ok)
    else:
        # Partials are [NUM_SPLITS, B, R, H(, D)], contiguous; m is in the log2 domain.
        H = G * HKV
        ml = ((split * (tl.num_programs(1) // HKV) + b) * R + row) * H + head
        tl.store(MPart + ml, m_i, mask=row_ok)
        tl.store(LPart + ml, l_i, mask=row_ok)
        tl.store(OPart + ml[:, None] * D + offs_d[None, :], acc, mask=out_ok)


@triton.jit
def _combine_kernel(Out, OPart, MPart, LPart, R, H, s_ob, s_or, s_oh,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """out[b, r, h] = sum_s 2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s over the splits; grid (R, H, B)."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    b = tl.program_id(2)
    s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = s < NUM_SPLITS
    ml = ((s * tl.num_programs(2) + b) * R + row) * H + head
    m = tl.load(MPart + ml, mask=s_ok, other=float("-inf"))
    l_s = tl.load(LPart + ml, mask=s_ok, other=0.0)
    ok = s_ok[:, None] & (offs_d[None, :] < D)
    o = tl.load(OPart + ml[:, None] * D + offs_d[None, :], mask=ok, other=0.0)
    w = tl.exp2(m - tl.max(m, 0))
    out = tl.sum(o * w[:, None], 0) / tl.sum(l_s * w, 0)
    tl.store(Out + b.to(tl.int64) * s_ob + row * s_or + head * s_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=offs_d < D)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _default_splits(device: torch.device, programs: int) -> int:
    """About two programs per SM, rounded down to a power of two, at most 16; 1 off the GPU.
    (H200, 64 rows x 32 heads at 8192 cached: 8 splits 41.8 us, the unrounded 9 49.2 us, 16 45.7 us;
    bench/RESULTS.md.)

    `programs` counts one request's programs of one split (query tiles x KV heads). The split count fixes
    the order of the softmax reduction, so it follows neither the batch nor the cache's capacity (splits
    past the cached length are empty): a request's logits must not change with the requests decoded
    beside it, nor between the eager loop (a cache sized to the request) and a CUDA graph (sized to
    max_seq_len). On the H200, a capacity-dependent count made graph replay of a bfloat16 model emit other
    greedy tokens than eager decoding (near-ties). Depends only on static shapes (never on cache_len), so a
    captured graph stays valid.
    """
    if device.type != "cuda":
        return 1
    want = min(2 * _sm_count(device.index or 0) // programs, 16)
    return 1 << (max(1, want).bit_length() - 1)


def packed_attention(q, k, v, k_pool, v_pool, table, cache_len, layout: Layout, scale: float, *,
                     block_m: int | None = None, block_n: int | None = None,
                     num_splits: int | None = None, num_warps: int = 4, num_stages: int = 2):
    """q [B, R, H, D], k/v [B, R, Hkv, D]; pools [pages, page_size, Hkv, D] (anchors written in place), table
    [B, n], cache_len [B]. Returns [B, R, H, D].

    Keyword arguments tune the launch (tile rows, KV block, split-KV count); the defaults are static
    functions of the shapes.
    """
    batch, rows, heads, dim = q.shape
    kv_heads, page_size = k_pool.shape[2], k_pool.shape[1]
    assert heads % kv_heads == 0, "query heads must be a multiple of KV heads"
    assert k.shape == v.shape == (batch, rows, kv_heads, dim) and k_pool.shape == v_pool.shape
    assert table.shape[0] == batch and cache_len.shape == (batch,) and table.stride(1) == 1
    assert k_pool.dtype == v_pool.dtype == k.dtype == v.dtype == q.dtype
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == k_pool.stride(-1) == v_pool.stride(-1) == 1
    group = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(dim))
    interp = _interpreting()
    block_n = block_n or (128 if interp else 64)   # the interpreter's cost is per op: big blocks
    block_m = block_m or max(16, min(128 if interp else 64, triton.next_power_of_2(rows * group)))
    m_blocks = triton.cdiv(rows * group, block_m)
    splits = num_splits or _default_splits(q.device, m_blocks * kv_heads)   # batch- and capacity-invariant

    out = torch.empty((batch, rows, heads, dim), dtype=q.dtype, device=q.device)
    if splits > 1:
        o_part = torch.empty((splits, batch, rows, heads, dim), dtype=torch.float32, device=q.device)
        m_part = torch.empty((splits, batch, rows, heads), dtype=torch.float32, device=q.device)
        l_part = torch.empty_like(m_part)
    else:
        o_part = m_part = l_part = out
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    _packed_attention_kernel[(m_blocks, batch * kv_heads, splits)](
        q, k, v, k_pool, v_pool, table, out, o_part, m_part, l_part, cache_len, layout.seg, layout.see,
        rows, layout.n_anchor, kv_heads, scale * _LOG2E, cache_len.stride(0),
        layout.see.stride(0) if layout.see.dim() == 2 and layout.see.shape[0] > 1 else 0,   # [1, R]: shared
        table.shape[1], table.stride(0),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *k_pool.stride()[:3], *v_pool.stride()[:3], *out.stride()[:3],
        G=group, D=dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page_size,
        NUM_SPLITS=splits, PREC=prec, num_warps=num_warps, num_stages=num_stages,
    )
    if splits > 1:
        _combine_kernel[(rows, heads, batch)](out, o_part, m_part, l_part, rows, heads, *out.stride()[:3],
                                              D=dim, BLOCK_D=block_d, NUM_SPLITS=splits,
                                              BLOCK_S=triton.next_power_of_2(splits))
    return out


@torch.library.custom_op("packed_ss::packed_attention", mutates_args=("k_pool", "v_pool"))
def _packed_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor,
                         v_pool: torch.Tensor, table: torch.Tensor, cache_len: torch.Tensor, seg: torch.Tensor,
                         see: torch.Tensor, n_anchor: int, scale: float) -> torch.Tensor:
    return packed_attention(q, k, v, k_pool, v_pool, table, cache_len, Layout(n_anchor, seg, see), scale)


@_packed_attention_op.register_fake
def _(q, k, v, k_pool, v_pool, table, cache_len, seg, see, n_anchor, scale):
    return torch.empty_like(q)


def packed_attention_op(q, k, v, k_pool, v_pool, table, cache_len, layout: Layout, scale: float) -> torch.Tensor:
    """The engine's attention backend: `packed_attention` as one torch op that declares its in-place cache
    writes. torch.compile calls it and never traces the kernel (traced inline, the compiled step emitted
    wrong tokens on the H200, tests/test_kernels.py::test_engine_compiled); eager and graph-captured calls
    go through the op dispatcher alike."""
    return _packed_attention_op(q, k, v, k_pool, v_pool, table, cache_len, layout.seg, layout.see,
                                layout.n_anchor, scale)


def fused_attention(table, cache_len, layout: Layout, page_size: int):
    """The engine's backend for one model call (model.attention.attention_backend): each layer's
    (q, k, v, k_pool, v_pool, scale) through packed_attention_op, which works out the call's metadata in the
    kernel."""
    def attend(q, k, v, k_pool, v_pool, scale: float) -> torch.Tensor:
        return packed_attention_op(q, k, v, k_pool, v_pool, table, cache_len, layout, scale)
    return attend
