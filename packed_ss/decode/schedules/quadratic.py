"""Quadratic-SS: one call that verifies the draft and drafts from every possible acceptance boundary.

Input: B anchors [P^(n), d_1..d_W] (causal, K/V kept), then for each anchor i a branch of B masks at
positions n+i .. n+i+W that sees anchors 0..i and its own branch: B(B+1) rows. After accepting h draft
tokens, branch h is the proposal conditioned on everything but the correction; its first slot sits at
the correction's position and is dropped, the other W become the next draft.
"""
import torch

from .base import Schedule, Step, layout


class Quadratic(Schedule):
    name = "quadratic"
    replay = "fresh"

    def __init__(self, model, width, sampled, epilogue, draft_source="diffusion"):
        super().__init__(model, width, sampled, epilogue, draft_source)
        b = self.block
        branch_of = [i for i in range(b) for _ in range(b)]
        self.offsets = torch.tensor(list(range(b)) + [i + 1 + j for i in range(b) for j in range(b)],
                                    device=self.device)
        self.branch_rows = b + torch.arange(b, device=self.device)
        self.branches = self.masks(b * b)
        self.layout = layout(self.device, b, [1 + i for i in branch_of], branch_of)
        self.steps = [Step(self.inputs, self.update)]

    def inputs(self, st):
        tokens = torch.cat([st.last[:, None], st.draft, self.branches.expand(st.batch, -1)], 1)
        return self.input_at(st, tokens, self.offsets, self.layout)

    def update(self, st, logits):
        """Verify, pick each request's branch A - 1 on the device, then emit and keep that branch's proposals."""
        b = self.block
        verified = self.epilogue.verify(st, self.epilogue.rows(logits[:, :b], st.sampling))
        rows = self.branch_rows + (verified.n_accept[:, None] - 1) * b
        branch = logits.gather(1, rows[:, :, None].expand(-1, -1, logits.shape[2]))
        self.epilogue.commit(st, verified, propose=self.epilogue.rows(branch, st.sampling), retain=1)
        self.redraft(st)
