"""Linear-SS: a drafting call from the verified prefix, then a verification call (two calls/iteration).

Draft call  [P^(n), MASK^W]  full attention, K/V discarded      -> D = z^(1..W)
Verify call [P^(n), D]       causal, K/V written in place        -> accept A tokens
The prefill drafts the first block, so a request's first iteration enters at the verify call.
"""
import torch

from .base import Schedule, Step, layout


class Linear(Schedule):
    name = "linear"
    replay = "fresh"

    def __init__(self, model, width, sampled, epilogue, draft_source="diffusion"):
        super().__init__(model, width, sampled, epilogue, draft_source)
        b = self.block
        self.offsets = torch.arange(b, device=self.device)
        self.verify_layout = layout(self.device, b)
        self.draft_layout = layout(self.device, 0, [1] * b, [-1] * b)
        self.steps = [Step(self.draft_inputs, self.draft_update), Step(self.verify_inputs, self.verify_update)]
        self.entry = 1

    def draft_inputs(self, st):
        tokens = torch.cat([st.last[:, None], self.masks_for(st)], 1)
        return self.input_at(st, tokens, self.offsets, self.draft_layout)

    def draft_update(self, st, logits):
        self.epilogue.step(st, propose=self.epilogue.rows(logits[:, 1:], st.sampling), retain=0)
        self.redraft(st)

    def verify_inputs(self, st):
        tokens = torch.cat([st.last[:, None], st.draft], 1)
        return self.input_at(st, tokens, self.offsets, self.verify_layout)

    def verify_update(self, st, logits):
        self.epilogue.step(st, verify=self.epilogue.rows(logits, st.sampling))
