"""Any-order schedules for SetDLM-style models (paper appendix C, D.2, E.6), greedy except `ar`.

Every call is `[N | O | ...]`: N the pending tokens (accepted, K/V not computed yet) and O the
previous draft in verification order, both causal anchors written into the cache in place, then
mask query rows, each seeing the cache, a prefix of the anchors and itself. A mask row predicts the
token at its own position id. Position ids are textual (prompt length + output position).
"""
from __future__ import annotations

import torch

from ..attention import Layout
from ..sampling import SamplingParams, philox_uniform, sample_sparse, truncated_probs
from .state import AnyOrderState

NATIVE_THRESHOLD = 0.9


class Call:
    """The rows of one call: anchors first (causal), then mask queries with their own segment."""

    def __init__(self, st: AnyOrderState, mask_id: int):
        self.st, self.mask_id = st, mask_id
        self.tokens, self.positions, self.see, self.n_anchor = [], [], [], 0

    def anchors(self, pairs) -> None:
        """(output position, token) rows; a missing token (None) becomes a mask."""
        assert len(self.see) == self.n_anchor, "anchors come before queries"
        for j, t in pairs:
            self._row(j, self.mask_id if t is None else t, self.n_anchor)
            self.n_anchor += 1

    def queries(self, positions, visible: int) -> None:
        """Mask rows at `positions`, each seeing the first `visible` anchors of this call."""
        for j in positions:
            self._row(j, self.mask_id, visible - 1)

    def _row(self, j, token, see):
        self.tokens.append(token)
        self.positions.append(self.st.prompt_len + j)
        self.see.append(see)

    @property
    def rows(self) -> int:
        return len(self.tokens)

    def layout(self, device) -> Layout:
        n = self.n_anchor
        seg = [0] * n + list(range(1, self.rows - n + 1))
        return Layout(n, torch.tensor(seg, device=device), torch.tensor(self.see, device=device))


def greedy(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """Argmax tokens of mask rows and the probability each was assigned (its confidence score)."""
    tokens = logits.argmax(-1)
    conf = logits.float().softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens.tolist(), conf.tolist()


class AnyOrderSchedule:
    """prefill() caches the prompt in one counted call (paper E.2); iterate() runs one iteration."""
    name = ""

    def __init__(self, run, mask_id: int, width: int, order: str, params: SamplingParams):
        self.run, self.mask_id, self.width, self.policy, self.params = run, mask_id, width, order, params

    def call(self, st: AnyOrderState) -> Call:
        return Call(st, self.mask_id)

    def prefill(self, st: AnyOrderState, prompt: list[int]) -> None:
        c = Call(st, self.mask_id)
        c.anchors((j - st.prompt_len, t) for j, t in enumerate(prompt))
        self.run(st, c, cache_len=0)


class AR(AnyOrderSchedule):
    """Left-to-right decoding: [N | MASK at the leftmost unresolved position], greedy or sampled."""
    name = "ar"

    def iterate(self, st: AnyOrderState, seed: torch.Tensor, offset: torch.Tensor) -> None:
        (j,) = st.window(1)
        c = self.call(st)
        c.anchors(st.pending)
        c.queries([j], c.n_anchor)
        logits = self.run(st, c)[-1]
        if self.params.greedy:
            token = int(logits.argmax())
        else:
            u = philox_uniform(seed, offset, 1)
            offset.add_(1)
            token = int(sample_sparse(*truncated_probs(logits, self.params), u[0]))
        st.commit_unverified([(j, token)], 1, c.rows)


class Packed(AnyOrderSchedule):
    """Packed-SS (Alg. 3): [N | O | M | R]; M verifies D_{t-1} in order pi_t, R drafts U_t from P_{t-1}."""
    name = "packed"

    def iterate(self, st: AnyOrderState, *_) -> None:
        order = st.order(st.window(self.width), self.policy)          # lines 3-5
        u, p = len(order), len(st.pending)
        c = self.call(st)
        c.anchors(st.pending)                                         # N
        c.anchors((j, st.draft.get(j)) for j in order)                # O: D_{t-1}, masks where missing
        for r, j in enumerate(order):
            c.queries([j], p + r)                                     # M_r sees N, O_<r
        c.queries(order, p)                                           # R sees N only: P_{t-1}
        logits = self.run(st, c)
        verified = logits[p + u: p + 2 * u].argmax(-1).tolist()      # line 7
        proposals = greedy(logits[p + 2 * u:])                        # line 8
        st.accept(order, verified, c.rows)                            # lines 9-13
        st.set_draft(order, *proposals)                               # lines 14-15


class Linear(AnyOrderSchedule):
    """Linear-SS (ASSD-style): draft [N | R] from P_{t-1}, then verify [O | M] in order pi_t."""
    name = "linear"

    def iterate(self, st: AnyOrderState, *_) -> None:
        order = st.order(st.window(self.width), self.policy)   # fixed before the drafting call (E.6)
        u, p = len(order), len(st.pending)
        draft = self.call(st)
        draft.anchors(st.pending)
        draft.queries(order, p)
        drafts, _ = greedy(self.run(st, draft)[p:])
        st.draft = dict(zip(order, drafts))
        verify = self.call(st)
        verify.anchors(zip(order, drafts))
        for r, j in enumerate(order):
            verify.queries([j], r)
        verified, conf = greedy(self.run(st, verify, cache_len=st.cache_len + p)[u:])
        st.accept(order, verified, draft.rows + verify.rows)
        st.keep_scores(order, conf)


class Quadratic(AnyOrderSchedule):
    """Quadratic-SS: [N | O | M | u branches]; branch k drafts U_t from P_{t-1} and the drafts of ranks < k,
    and the branch that verification selects (k = A_t - 1) supplies the next draft."""
    name = "quadratic"

    def iterate(self, st: AnyOrderState, *_) -> None:
        order = st.order(st.window(self.width), self.policy)
        u, p = len(order), len(st.pending)
        c = self.call(st)
        c.anchors(st.pending)
        c.anchors((j, st.draft.get(j)) for j in order)
        for r, j in enumerate(order):
            c.queries([j], p + r)
        for k in range(u):
            c.queries(order, p + k)
        logits = self.run(st, c)
        verified = logits[p + u: p + 2 * u].argmax(-1).tolist()
        a = st.accept(order, verified, c.rows)
        branch = p + 2 * u + (a - 1) * u
        st.set_draft(order, *greedy(logits[branch: branch + u]))


class Native(AnyOrderSchedule):
    """The threshold decoder baseline (E.6): predict every unresolved position of the sliding window
    from P, commit those with confidence >= 0.9 (at least the most confident one), no verification."""
    name = "native"

    def iterate(self, st: AnyOrderState, *_) -> None:
        window = st.window(self.width)
        c = self.call(st)
        c.anchors(st.pending)
        c.queries(window, c.n_anchor)
        tokens, conf = greedy(self.run(st, c)[c.n_anchor:])
        best = max(range(len(window)), key=lambda i: (conf[i], -i))
        keep = [i for i in range(len(window)) if conf[i] >= NATIVE_THRESHOLD or i == best]
        st.commit_unverified([(window[i], tokens[i]) for i in keep], len(window), c.rows)


SCHEDULES = {s.name: s for s in (AR, Linear, Quadratic, Packed, Native)}
