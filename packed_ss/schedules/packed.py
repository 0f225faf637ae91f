"""Packed-SS (paper Alg. 1 greedy, Alg. 2 sampling): verify D_{t-1} and draft from P_{t-1} in one call.

Input (2B rows, positions n-1 .. n-1+W in both regions):
  verifier [P^(n), D̄_{t-1}]  causal, K/V written in place   (D̄: the draft padded with masks)
  proposal [P^(n), MASK^W]    full within the region         -> Z_t = z^(1..W), conditioned on P_{t-1}
After accepting A_t tokens (cut to a by stop rules), the next draft is z^(a+1..W) with its stored Q.
"""
import torch

from .base import Schedule, Step, layout
from ..state import retain


class Packed(Schedule):
    name = "packed"

    def __init__(self, model, width, params, native=False):
        super().__init__(model, width, params, native)
        b = self.block
        self.offsets = torch.arange(b, device=self.device).repeat(2)
        self.slots = torch.arange(width, device=self.device)
        self.steps = [Step(layout(self.device, b, [1] * b, [-1] * b), self.inputs,
                           self.pick(self.update, self.update_native))]

    def inputs(self, st):
        padded = torch.where(self.slots < st.draft_len, st.draft, self.mask_id)
        tokens = torch.cat([st.last[None], padded, st.last[None], self.masks(self.width)])
        return tokens, st.cache_len + self.offsets

    def update(self, st, logits):
        active = ~st.done
        u = self.uniforms(st)
        b = self.block
        emitted, n_accept = self.verify(st, logits[:b], u)     # line 3, 5-8
        proposal = self.propose(logits[b + 1:], u)          # line 4: z^(1..W) | P_{t-1}
        a = self.commit(st, emitted, n_accept, active)          # lines 9-11
        retain(st, *proposal, a, active)                        # lines 12-13

    def update_native(self, st, logits):
        """update() in one epilogue call: verify rows [0, B), proposals z^(1..W) = rows [B+1, 2B)."""
        b = self.block
        rows = self.epilogue.rows(logits)
        self.epilogue.step(st, verify=rows[:b], propose=rows[b + 1:], retain="a")
