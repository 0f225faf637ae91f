"""Any-order KV commit, plain-torch reference (CPU backend and test oracle for kernels/commit.py).

After an any-order verification the cache must receive the pending token's row and the accepted draft
rows in acceptance order, which is a gather from the call's K/V followed by a scatter to consecutive
cache slots. The count is a device tensor, so the reference writes every one of the M candidate slots
without a host sync: slots i >= count are rewritten with their own contents. Those slots are taken
modulo the capacity, which keeps all M slots distinct (M <= capacity) so index_copy_ is deterministic.
"""
from __future__ import annotations

import torch


def commit_rows(k_cache, v_cache, k_rows, v_rows, src, count, cache_len) -> None:
    """For i < count: cache slot cache_len + i <- row src[i] of k_rows / v_rows ([N, Hkv, D]).

    Caches are [Hkv, S, D]; src is [M] int64 (entries at i >= count are ignored); count and cache_len are
    0-d int64 device tensors. Requires cache_len + count <= S and M <= S. Slots are distinct, so the order
    of the copies cannot matter.
    """
    m, capacity = src.numel(), k_cache.shape[1]
    i = torch.arange(m, device=src.device)
    keep = (i < count)[None, :, None]
    slots = (cache_len + i) % capacity
    rows = torch.where(i < count, src, 0)
    for cache, new in ((k_cache, k_rows), (v_cache, v_rows)):
        values = torch.where(keep, new.index_select(0, rows).transpose(0, 1), cache.index_select(1, slots))
        cache.index_copy_(1, slots, values)
