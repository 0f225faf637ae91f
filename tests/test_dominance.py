"""Theorem 3.2 (pathwise dominance) as a property test on a scripted dual-mode model.

The scripted target always continues with a fixed sequence x; its drafter predicts position k
correctly iff it sees at least c*_k verified output tokens (Assumption 3.1), thresholds drawn at
random. Under that assumption NFE(packed) <= NFE(linear) for every output length.
"""
import random
from types import SimpleNamespace

import pytest
import torch

import packed_ss

VOCAB, MASK = 32, 31


class ScriptedModel:
    """Implements the engine's model interface: logits are one-hot on the scripted prediction."""

    def __init__(self, prompt_len: int, target: list[int], thresholds: list[int]):
        pad = 4 * len(target) + 64
        self.n0 = prompt_len
        self.x = torch.tensor(target + [0] * pad)
        self.wrong = (self.x + 1) % (VOCAB - 2)
        self.cstar = torch.tensor(thresholds + [10**9] * pad)
        self.cfg = SimpleNamespace(vocab_size=VOCAB, mask_token_id=MASK, eos_token_ids=(), max_seq_len=4096,
                                   any_order=False)
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.draft_profile = None   # no drafter profile: the engine's defaults

    def kv_pools(self, pages, page_size):
        return torch.zeros(1, pages, page_size, 1, 1), torch.zeros(1, pages, page_size, 1, 1)

    def __call__(self, tokens, positions, layout, cache, cache_len, attend=None, rows=None):
        """The engine's calls are batches [B, R]: request by request; `rows` [B, K]: those rows' logits alone."""
        logits = torch.stack([self.one(*request, layout) for request in zip(tokens, positions, cache_len)])
        return logits if rows is None else logits.gather(1, rows[..., None].expand(-1, -1, VOCAB))

    def one(self, tokens, positions, cache_len, layout):
        rows, n = tokens.numel(), layout.n_anchor
        is_scratch = torch.arange(rows) >= n
        drafter = is_scratch & (tokens == MASK)
        # Verified tokens a drafting row sees: the cache, the anchors up to `see`, and the non-mask
        # rows of its own segment (the copy of the last prefix token in packed / linear drafts).
        copies = ((layout.seg[:, None] == layout.seg[None, n:]) & (tokens[None, n:] != MASK)).sum(1)
        context = cache_len + layout.see + 1 + copies - self.n0
        k = (positions - self.n0).clamp(min=0)                   # output index drafted by a mask row
        draft = torch.where(context >= self.cstar[k], self.x[k], self.wrong[k])
        ar = self.x[(positions + 1 - self.n0).clamp(min=0)]      # AR row predicts the next position
        logits = torch.zeros(rows, VOCAB)
        logits[torch.arange(rows), torch.where(drafter, draft, ar)] = 1.0
        return logits


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_packed_needs_no_more_calls_than_linear(width):
    rng = random.Random(width)
    max_len = 24
    for _ in range(15):
        target = [rng.randrange(VOCAB - 2) for _ in range(max_len)]
        # c*_k in [0, k] for output position k (1-indexed); c*_k = k means never drafted correctly
        thresholds = [rng.randint(0, k + 1) for k in range(max_len)]
        model = ScriptedModel(3, target, thresholds)
        engines = {s: packed_ss.Engine(model, schedule=s, width=width, drafts="diffusion") for s in ("packed", "linear")}
        for length in range(1, max_len + 1):
            runs = {s: e.generate([1, 2, 3], max_new_tokens=length) for s, e in engines.items()}
            assert runs["packed"].tokens == runs["linear"].tokens == target[:length]
            assert runs["packed"].nfe <= runs["linear"].nfe, (length, thresholds)


def test_scripted_drafter_is_exercised():
    """Sanity: with all thresholds 0 every draft is right, with thresholds k no draft ever is."""
    target = list(range(20))
    always = packed_ss.Engine(ScriptedModel(3, target, [0] * 20), schedule="packed", width=4, drafts="diffusion")
    never = packed_ss.Engine(ScriptedModel(3, target, list(range(1, 21))), schedule="packed", width=4,
                             drafts="diffusion")
    assert always.generate([1, 2, 3], max_new_tokens=20).n_accepted > 10
    assert never.generate([1, 2, 3], max_new_tokens=20).n_accepted == 0
