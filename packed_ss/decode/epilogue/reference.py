"""The step epilogue in plain torch: the reference the compiled one reproduces bit for bit.

It is the paper's algorithms written out: acceptance (acceptance.py, Alg. 1 lines 5-8 / Alg. 2 lines 5-8),
emit with the stop rules and the cache-length commit (state.emit), and the next draft kept from the
proposals (state.retain, Alg. 1 lines 12-13). Shape-static and free of host reads, so a step ending in it
compiles with torch.compile(fullgraph=True) and can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from ..acceptance import verify_greedy, verify_sampled
from ..sampling import densify, inverse_cdf, philox_uniform
from ..state import DecodeState, emit, retain
from .base import Epilogue, Rows, Verified


class TorchEpilogue(Epilogue):
    """The whole batch in each call, with batched tensor ops: the op count does not grow with the batch."""

    def __init__(self, device, width: int, sampled: bool):
        super().__init__(device, width, sampled)
        self.n_uniform = 2 * self.block + 1      # [0, W]: acceptance + correction, [B, 2B]: drafts
        self.one = torch.ones(1, dtype=torch.int64, device=self.device)
        self.zero = torch.zeros(1, dtype=torch.int64, device=self.device)

    def _uniforms(self, st: DecodeState) -> torch.Tensor | None:
        """This call's uniforms [B, n] (None when greedy); the offsets advance once per call, on the device."""
        if not self.sampled:
            return None
        u = philox_uniform(st.seed, st.offset, self.n_uniform)
        st.offset.add_(1)
        return u

    def _draw(self, rows: Rows, u: torch.Tensor) -> torch.Tensor:
        """One token per row: the argmax, or a draw from the row's distribution with uniforms u [B, R]."""
        if rows.arg is not None:
            return rows.arg
        j = inverse_cdf(rows.prob, u)
        return j if rows.idx is None else rows.idx.gather(-1, j[..., None])[..., 0]

    def _propose(self, rows: Rows, u):
        """Draft tokens from proposal rows (uniforms u[:, B:]) with the Q each was drawn from (its idx None when
        dense: the state's token ids stay)."""
        z = self._draw(rows, None if u is None else u[:, self.block: self.block + len(rows)])
        return z, rows.idx, rows.prob

    def _verify(self, st: DecodeState, rows: Rows, u, residual=None):
        draft_len = st.draft_len.clamp(max=len(rows) - 1)       # a draft verifies within the rows (base.Epilogue)
        rows = rows.widened(self.block) if len(rows) < self.block else rows
        if rows.arg is not None:
            return verify_greedy(st.draft, draft_len, rows.arg)
        p = rows.prob if rows.idx is None else densify(rows.idx, rows.prob, rows.vocab)
        if residual is not None:
            u = torch.cat([u[:, :self.width], u.gather(1, residual[:, None])], 1)
        emitted, n_accept = verify_sampled(st.draft, draft_len, st.q_idx, st.q_prob, p, u)
        if residual is not None:
            return emitted, n_accept
        ar_token = self._draw(rows[:1], u[:, :1])      # an empty draft's verification is an AR step
        return torch.where((draft_len == 0)[:, None], ar_token, emitted), n_accept

    def _emit(self, st, emitted, n_accept, verified: bool):
        active = ~st.done
        a = emit(st, emitted, n_accept)
        counts = {"nfe": st.nfe + 1}
        if verified:
            whole = (n_accept == st.draft_len + 1) & (st.draft_len > 0) & (a == n_accept)
            counts.update(n_verify=st.n_verify + 1, n_accepted=st.n_accepted + (a - 1).clamp(min=0),
                          n_bonus=st.n_bonus + whole.long())
        st.assign(active, **counts)
        return a, active

    def _retain(self, st, propose, retain_, u, a, active) -> None:
        if retain_ is None:
            return
        shift = a if retain_ == "a" else (self.zero, self.one)[retain_].expand(st.batch)
        retain(st, *self._propose(propose, u), shift, active)

    def _step(self, st, verify, token, propose, retain_) -> None:
        u = self._uniforms(st)
        if verify is not None:
            emitted, n_accept = self._verify(st, verify, u)
            a, active = self._emit(st, emitted, n_accept, verified=True)
        elif token is not None:
            first = self._draw(token[:1], None if u is None else u[:, :1])
            a, active = self._emit(st, first, self.one.expand(st.batch), verified=False)
        else:                                    # a drafting call: count it, emit nothing
            active = ~st.done
            st.assign(active, nfe=st.nfe + 1)
            a = self.zero.expand(st.batch)
        self._retain(st, propose, retain_, u, a, active)

    def verify(self, st: DecodeState, verify: Rows, residual: torch.Tensor | None = None) -> Verified:
        u = self._uniforms(st)
        return Verified(*self._verify(st, verify, u, residual), u)

    def _commit(self, st, verified, propose, retain_) -> None:
        a, active = self._emit(st, verified.emitted, verified.n_accept, verified=True)
        self._retain(st, propose, retain_, verified.draws, a, active)
