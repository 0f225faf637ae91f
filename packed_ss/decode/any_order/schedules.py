"""Any-order schedules for SetDLM-style models (paper appendix C, D.2, E.6).

Greedy decoding follows Alg. 3 with either order. Sampling (LTR order only) stores with each draft
token the sparse Q it was drawn from and verifies in rank order against it (Alg. 2's rule, shared
`verify_sampled`); the native decoder is greedy by definition. Every call is `[N | O | ...]`: N the pending tokens (accepted, K/V not computed yet) and O the
previous draft in verification order, both causal anchors written into the cache in place, then
mask query rows, each seeing the cache, a prefix of the anchors and itself. A mask row predicts the
token at its own position id. Position ids are textual (prompt length + output position).
"""
from __future__ import annotations

import torch

from ...model.attention import Layout
from ..acceptance import verify_sampled
from ..sampling import SamplingParams, densify, philox_uniform, sample_sparse, truncated_probs
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
    """prefill() caches the prompt in one counted call (paper E.2); iterate() runs one iteration.

    Sampling draws its uniforms from Philox keyed by (seed, offset), the offset advancing once per
    call: [0, u] for acceptance and the residual / fresh draw, [W+1, W+1+u) for drafts."""
    name = ""

    def __init__(self, run, mask_id: int, width: int, order: str, params: SamplingParams, seed: torch.Tensor):
        self.run, self.mask_id, self.width, self.policy, self.params = run, mask_id, width, order, params
        self.seed, self.offset = seed, torch.zeros_like(seed)

    def call(self, st: AnyOrderState) -> Call:
        return Call(st, self.mask_id)

    def prefill(self, st: AnyOrderState, prompt: list[int]) -> None:
        c = Call(st, self.mask_id)
        c.anchors((j - st.prompt_len, t) for j, t in enumerate(prompt))   # prompt rows: negative positions
        self.run(st, c, cache_len=0)

    def uniforms(self) -> torch.Tensor | None:
        if self.params.greedy:
            return None
        u = philox_uniform(self.seed, self.offset, 2 * self.width + 2)
        self.offset.add_(1)
        return u

    def propose(self, logits: torch.Tensor, u: torch.Tensor | None):
        """Drafts from mask rows: (tokens, scores, sparse Q or None); a score is the probability the
        proposal gave its own token."""
        if u is None:
            return (*greedy(logits), None)
        idx, prob = truncated_probs(logits, self.params)
        z = sample_sparse(idx, prob, u[self.width + 1: self.width + 1 + logits.shape[0]])
        score = (prob * (idx == z[:, None])).sum(-1)
        return z.tolist(), score.tolist(), (idx, prob)

    def verify(self, st: AnyOrderState, order: list[int], logits: torch.Tensor, u: torch.Tensor | None):
        """(token at each rank, accepted drafts h or None) from the verifier mask rows M in rank order.

        Greedy: the argmax (the state counts matches). Sampled: rejection sampling against each draft's
        stored Q up to the first missing draft; a rank without a draft is drawn from p."""
        if u is None:
            return logits.argmax(-1).tolist(), None
        n = len(order)
        kappa = next((r for r, j in enumerate(order) if j not in st.draft), n)
        device, k = logits.device, self.params.support(logits.shape[-1])
        draft = torch.tensor([st.draft.get(j, 0) for j in order], device=device)
        none = (torch.zeros(k, dtype=torch.int64, device=device),
                torch.zeros(k, dtype=torch.promote_types(logits.dtype, torch.float32), device=device))
        q_idx, q_prob = (torch.stack([st.q.get(j, none)[i] for j in order]) for i in (0, 1))
        # verify_sampled reads one more row after the last draft (the LTR bonus); with all u drafts
        # accepted Alg. 3 takes no extra token, so that row is a placeholder whose draw is dropped.
        p = densify(*truncated_probs(torch.cat([logits, logits[-1:]]), self.params), logits.shape[-1])
        emitted, a = verify_sampled(draft, torch.tensor(kappa, device=device), q_idx, q_prob, p, u[:n + 1])
        return emitted[:n].tolist(), int(a) - 1


class AR(AnyOrderSchedule):
    """Left-to-right decoding: [N | MASK at the leftmost unresolved position], greedy or sampled."""
    name = "ar"

    def iterate(self, st: AnyOrderState) -> None:
        (j,) = st.window(1)
        c = self.call(st)
        c.anchors(st.pending)
        c.queries([j], c.n_anchor)
        logits, u = self.run(st, c)[-1], self.uniforms()
        token = int(logits.argmax()) if u is None else int(sample_sparse(*truncated_probs(logits, self.params), u[0]))
        st.commit_unverified([(j, token)], 1, c.rows)


class Packed(AnyOrderSchedule):
    """Packed-SS (Alg. 3): [N | O | M | R]; M verifies D_{t-1} in order pi_t, R drafts U_t from P_{t-1}."""
    name = "packed"

    def iterate(self, st: AnyOrderState) -> None:
        order = st.order(st.window(self.width), self.policy)          # lines 3-5
        u, p = len(order), len(st.pending)
        c = self.call(st)
        c.anchors(st.pending)                                         # N
        c.anchors((j, st.draft.get(j)) for j in order)                # O: D_{t-1}, masks where missing
        for r, j in enumerate(order):
            c.queries([j], p + r)                                     # M_r sees N, O_<r
        c.queries(order, p)                                           # R sees N only: P_{t-1}
        logits, rand = self.run(st, c), self.uniforms()
        verified, h = self.verify(st, order, logits[p + u: p + 2 * u], rand)   # line 7
        proposals = self.propose(logits[p + 2 * u:], rand)                     # line 8
        st.accept(order, verified, c.rows, h)                                  # lines 9-13
        st.set_draft(order, *proposals)                                        # lines 14-15


class Linear(AnyOrderSchedule):
    """Linear-SS (ASSD-style): draft [N | R] from P_{t-1}, then verify [O | M] in order pi_t."""
    name = "linear"

    def iterate(self, st: AnyOrderState) -> None:
        order = st.order(st.window(self.width), self.policy)   # fixed before the drafting call (E.6)
        u, p = len(order), len(st.pending)
        draft = self.call(st)
        draft.anchors(st.pending)
        draft.queries(order, p)
        drafts, scores, q = self.propose(self.run(st, draft)[p:], self.uniforms())
        st.set_draft(order, drafts, scores, q)
        verify = self.call(st)
        verify.anchors(zip(order, drafts))
        for r, j in enumerate(order):
            verify.queries([j], r)
        logits = self.run(st, verify, cache_len=st.cache_len + p)[u:]
        verified, h = self.verify(st, order, logits, self.uniforms())
        st.accept(order, verified, draft.rows + verify.rows, h)
        st.keep_scores(order, greedy(logits)[1])


class Quadratic(AnyOrderSchedule):
    """Quadratic-SS: [N | O | M | u branches]; branch k drafts U_t from P_{t-1} and the drafts of ranks < k,
    and the branch that verification selects (k = A_t - 1) supplies the next draft."""
    name = "quadratic"

    def iterate(self, st: AnyOrderState) -> None:
        order = st.order(st.window(self.width), self.policy)
        u, p = len(order), len(st.pending)
        c = self.call(st)
        c.anchors(st.pending)
        c.anchors((j, st.draft.get(j)) for j in order)
        for r, j in enumerate(order):
            c.queries([j], p + r)
        for k in range(u):
            c.queries(order, p + k)
        logits, rand = self.run(st, c), self.uniforms()
        verified, h = self.verify(st, order, logits[p + u: p + 2 * u], rand)
        a = st.accept(order, verified, c.rows, h)
        branch = p + 2 * u + (a - 1) * u
        st.set_draft(order, *self.propose(logits[branch: branch + u], rand))


class Native(AnyOrderSchedule):
    """The threshold decoder baseline (E.6): predict every unresolved position of the sliding window
    from P, commit those with confidence >= 0.9 (at least the most confident one), no verification."""
    name = "native"

    def iterate(self, st: AnyOrderState) -> None:
        window = st.window(self.width)
        c = self.call(st)
        c.anchors(st.pending)
        c.queries(window, c.n_anchor)
        tokens, conf = greedy(self.run(st, c)[c.n_anchor:])
        best = max(range(len(window)), key=lambda i: (conf[i], -i))
        keep = [i for i in range(len(window)) if conf[i] >= NATIVE_THRESHOLD or i == best]
        st.commit_unverified([(window[i], tokens[i]) for i in keep], len(window), c.rows)


SCHEDULES = {s.name: s for s in (AR, Linear, Quadratic, Packed, Native)}
