"""Linear-SS: a drafting call from the verified prefix, then a verification call (two calls/iteration).

Draft call  [P^(n), MASK^W]  full attention, K/V discarded      -> D = z^(1..W)
Verify call [P^(n), D]       causal, K/V written in place        -> accept A tokens
"""
import torch

from .base import Schedule, Step, layout
from ..state import retain


class Linear(Schedule):
    name = "linear"

    def __init__(self, model, width, params, native=False):
        super().__init__(model, width, params, native)
        b = self.block
        self.offsets = torch.arange(b, device=self.device)
        self.steps = [
            Step(layout(self.device, b), self.verify_inputs,
                 self.pick(self.verify_update, self.verify_update_native)),
            Step(layout(self.device, 0, [1] * b, [-1] * b), self.draft_inputs,
                 self.pick(self.draft_update, self.draft_update_native)),
        ]

    def verify_inputs(self, st):
        return torch.cat([st.last[None], st.draft]), st.cache_len + self.offsets

    def verify_update(self, st, logits):
        active = ~st.done
        emitted, n_accept = self.verify(st, logits, self.uniforms(st))
        self.commit(st, emitted, n_accept, active)

    def verify_update_native(self, st, logits):
        self.epilogue.step(st, verify=self.epilogue.rows(logits))

    def draft_inputs(self, st):
        return torch.cat([st.last[None], self.masks(self.width)]), st.cache_len + self.offsets

    def draft_update(self, st, logits):
        active = ~st.done
        proposal = self.propose(logits[1:], self.uniforms(st))
        retain(st, *proposal, torch.zeros_like(st.draft_len), active)
        st.assign(active, nfe=st.nfe + 1)

    def draft_update_native(self, st, logits):
        self.epilogue.step(st, propose=self.epilogue.rows(logits[1:]), retain=0)
