"""Dual-mode decoder (Llama / Mistral / Qwen3 family) that evaluates one packed call per forward.

Both modes share every weight; they differ only in the attention pattern given by the call's Layout
(see attention.py). AR rows predict the token after their position, mask rows predict their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .adapter import Linear
from .attention import Layout, reference_attention
from .config import ModelConfig
from .rope import apply_rope, llama4_query_scale, rope_cos_sin, rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() if x.element_size() < 4 else x  # statistics in at least float32
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, bias = cfg.head_dim, cfg.attention_bias
        self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * d, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = Linear(cfg.num_heads * d, cfg.hidden_size, bias=bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, rope, q_scale, k_pool, v_pool, drafting: int | None, attend):
        rows, d = x.shape[:-1], self.cfg.head_dim   # rows: (B, R)
        q = self.q_proj(x, drafting).view(*rows, -1, d)
        k = self.k_proj(x, drafting).view(*rows, -1, d)
        v = self.v_proj(x, drafting).view(*rows, -1, d)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if q_scale is not None:
            q = q * q_scale
        out = attend(q, k, v, k_pool, v_pool, d ** -0.5)
        return self.o_proj(out.reshape(*rows, -1), drafting)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = Linear(h, i, bias=bias)
        self.up_proj = Linear(h, i, bias=bias)
        self.down_proj = Linear(i, h, bias=bias)

    def forward(self, x, drafting: int | None):
        return self.down_proj(F.silu(self.gate_proj(x, drafting)) * self.up_proj(x, drafting), drafting)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rope, q_scale, k_pool, v_pool, drafting: int | None, attend):
        x = x + self.self_attn(self.input_layernorm(x), rope, q_scale, k_pool, v_pool, drafting, attend)
        return x + self.mlp(self.post_attention_layernorm(x), drafting)


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


PAGE_SIZE = 16   # cache positions per page (vLLM's default)


@dataclass
class KVCache:
    """Paged keys and values. `k`, `v`: pools of pages, [layers, pages, page_size, kv_heads, head_dim] each;
    `table`: the pages of each request's cache positions, [B, n] for a batch ([n] for one request): position j
    of request b lives in page table[b, j // page_size] at offset j % page_size. Page 0 is the null page: a
    table's unused entries name it, and no request's visible position lives there. `rows(b, e)`: requests
    b..e-1 (a view of the table, the same pools)."""
    k: torch.Tensor
    v: torch.Tensor
    table: torch.Tensor

    @property
    def page_size(self) -> int:
        return self.k.shape[2]

    @property
    def capacity(self) -> int:
        """Cache positions per request."""
        return self.table.shape[-1] * self.page_size

    def rows(self, begin: int, end: int) -> "KVCache":
        return KVCache(self.k, self.v, self.table[begin:end])


class DualModeModel(nn.Module):
    """Parameter names follow HF (`model.layers.N.self_attn.q_proj.weight`, `lm_head.weight`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        with torch.device("cpu"):   # real values even when the module is built on the meta device
            inv_freq, self.rope_scaling = rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.draft_profile: dict | None = None   # the drafter's acceptance profile (width.py), set by loading
        self.adapter_dir: Path | None = None     # the drafting adapter's directory, set by loading
        self.dtype_source: str | None = None     # how loading chose the dtype ("asked for", "default", dtype.py's)

    def _apply(self, fn, recurse=True):
        # Keep the rope frequencies in float32 whatever the model dtype (HF computes them that way).
        super()._apply(fn, recurse)
        self.inv_freq = self.inv_freq.float()
        return self

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def kv_pools(self, pages: int, page_size: int = PAGE_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
        """Uninitialised K and V pools of `pages` pages (runtime/kv_pool.py zeroes a page before its use)."""
        c = self.cfg
        shape = (c.num_layers, pages, page_size, c.num_kv_heads, c.head_dim)
        return (torch.empty(shape, dtype=self.dtype, device=self.device),
                torch.empty(shape, dtype=self.dtype, device=self.device))

    def new_cache(self, capacity: int, batch: int | None = None, page_size: int = PAGE_SIZE) -> KVCache:
        """A zeroed cache of its own for one request, or for `batch` requests decoded together (own_cache)."""
        return own_cache(self, capacity, batch, page_size)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, layout: Layout, cache: KVCache,
                cache_len: torch.Tensor, attend=reference_attention, head: bool = True,
                rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """Logits [rows, vocab] for one packed call; anchors' K/V are written into `cache`. `head=False`: the
        K/V only, no logits (a chunk of a long prompt, whose rows predict nothing anyone reads). `rows` [K]
        ([B, K] for a batch): the logits of those rows alone, in that order (a prefill reads a prompt's last row
        and its mask rows; the vocabulary head over every prompt row would cost it as much as 20% more).

        One request: tokens / positions [R], a one-request cache, cache_len 0-d. A batch of requests whose
        calls share the layout: tokens / positions [B, R], a batch cache, cache_len [B] -> [B, R, vocab]
        (each request attends to its own cache). `attend` is the packed-attention backend (attention_backend:
        the torch reference or the fused kernel), given the call's table, cache lengths and layout once and
        then each layer's q, k, v and pools, always on a batch. A drafting adapter (adapter.py)
        applies to rows `layout.draft_from ..` only.
        """
        if tokens.dim() == 1:
            one = KVCache(cache.k, cache.v, cache.table[None])
            logits = self._forward(tokens[None], positions[None], layout, one, cache_len[None], attend, head,
                                   None if rows is None else rows[None])
            return None if logits is None else logits[0]
        return self._forward(tokens, positions, layout, cache, cache_len, attend, head, rows)

    def _forward(self, tokens, positions, layout: Layout, cache: KVCache, cache_len, attend, head: bool = True,
                 rows: torch.Tensor | None = None):
        x = self.model.embed_tokens(tokens)
        rope = rope_cos_sin(self.inv_freq, self.rope_scaling, positions, x.dtype)
        q_scale = None
        if self.cfg.llama4_scaling:
            q_scale = llama4_query_scale(positions, *self.cfg.llama4_scaling, x.dtype)
        attention = attend(cache.table, cache_len, layout, cache.page_size)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, q_scale, cache.k[i], cache.v[i], layout.draft_from, attention)
        if not head:
            return None
        if rows is not None:
            x = x.gather(1, rows[..., None].expand(-1, -1, x.shape[-1]))
        logits = self.lm_head(self.model.norm(x))
        if self.cfg.suppress_mask_logit:   # SetDLM: the mask token is never a prediction, on any row
            logits[..., self.cfg.mask_token_id] = float("-inf")
        return logits


def own_cache(model, capacity: int, batch: int | None = None, page_size: int = PAGE_SIZE) -> KVCache:
    """A zeroed cache of `model`'s (anything with `kv_pools`) for one request, or for `batch` requests decoded
    together, outside any pool: each request's pages in order after the null page."""
    n = -(-capacity // page_size)
    k, v = model.kv_pools(1 + (batch or 1) * n, page_size)
    table = 1 + torch.arange((batch or 1) * n, device=k.device).view(batch or 1, n)
    return KVCache(k.zero_(), v.zero_(), table if batch else table[0])
