"""Packed-SS (paper Alg. 1 greedy, Alg. 2 sampling): verify D_{t-1} and draft from P_{t-1} in one call.

Input (2B rows, positions n-1 .. n-1+W in both regions):
  verifier [P^(n), D̄_{t-1}]  causal, K/V written in place   (D̄: the draft padded with masks)
  proposal [P^(n), MASK^W]    full within the region         -> Z_t = z^(1..W), conditioned on P_{t-1}
After accepting A_t tokens (cut to a by stop rules), the next draft is z^(a+1..W) with its stored Q.
"""
import torch

from .base import Schedule, Step, layout


class Packed(Schedule):
    name = "packed"
    replay = "lagged"

    def __init__(self, model, width, sampled, epilogue, draft_source="diffusion"):
        super().__init__(model, width, sampled, epilogue, draft_source)
        b = self.block
        self.offsets = torch.arange(b, device=self.device).repeat(2)
        self.slots = torch.arange(width, device=self.device)
        self.layout = layout(self.device, b, [1] * b, [-1] * b)
        self.steps = [Step(self.inputs, self.update)]

    def inputs(self, st):
        last = st.last[:, None]
        padded = torch.where(self.slots < st.draft_len[:, None], st.draft, self.mask_id)
        tokens = torch.cat([last, padded, last, self.masks_for(st)], 1)   # [P^(n), D̄_{t-1} | P^(n), MASK^W]
        return self.input_at(st, tokens, self.offsets, self.layout)

    def update(self, st, logits):
        b = self.block
        rows = self.epilogue.rows(logits, st.sampling)               # per request of the batch
        self.epilogue.step(st, verify=rows[:b],         # lines 3, 5-11: verify D_{t-1}, emit, commit
                           propose=rows[b + 1:],        # line 4: z^(1..W) | P_{t-1}
                           retain="a")                  # lines 12-13: next draft z^(a+1..W)
        self.redraft(st)                                # or the lookup draft from the prefix after the call
