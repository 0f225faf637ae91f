"""Quadratic-SS: one call that verifies the draft and drafts from every possible acceptance boundary.

Input: B anchors [P^(n), d_1..d_W] (causal, K/V kept), then for each anchor i a branch of B masks at
positions n+i .. n+i+W that sees anchors 0..i and its own branch: B(B+1) rows. After accepting h draft
tokens, branch h is the proposal conditioned on everything but the correction; its first slot sits at
the correction's position and is dropped, the other W become the next draft.
"""
import torch

from .base import Schedule, Step, layout
from ..state import retain


class Quadratic(Schedule):
    name = "quadratic"

    def __init__(self, model, width, params, native=False):
        super().__init__(model, width, params, native)
        b = self.block
        branch_of = [i for i in range(b) for _ in range(b)]
        self.offsets = torch.tensor(list(range(b)) + [i + 1 + j for i in range(b) for j in range(b)],
                                    device=self.device)
        self.branch_rows = b + torch.arange(b, device=self.device)
        self.one = torch.ones((), dtype=torch.int64, device=self.device)
        lay = layout(self.device, b, [1 + i for i in branch_of], branch_of)
        self.steps = [Step(lay, self.inputs, self.pick(self.update, self.update_native))]

    def inputs(self, st):
        tokens = torch.cat([st.last[None], st.draft, self.masks(self.block * self.block)])
        return tokens, st.cache_len + self.offsets

    def update(self, st, logits):
        active = ~st.done
        u = self.uniforms(st)
        b = self.block
        emitted, n_accept = self.verify(st, logits[:b], u)
        branch = logits.index_select(0, self.branch_rows + (n_accept - 1) * b)
        proposal = self.propose(branch, u)
        self.commit(st, emitted, n_accept, active)
        retain(st, *proposal, self.one, active)

    def update_native(self, st, logits):
        """update() on the compiled epilogue: verify, pick branch A - 1 on the device, then commit."""
        b = self.block
        n_accept = self.epilogue.verify(st, self.epilogue.rows(logits[:b]))
        branch = logits.index_select(0, self.branch_rows + (n_accept - 1) * b)
        self.epilogue.commit(st, propose=self.epilogue.rows(branch), retain=1)
