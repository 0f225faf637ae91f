"""Plain autoregressive decoding: one row per call, the reference every other schedule must match."""
import torch

from .base import Schedule, Step, layout
from ..state import emit


class AR(Schedule):
    name = "ar"
    drafts = False

    def __init__(self, model, width, params):
        super().__init__(model, width, params)
        self.one = torch.ones((), dtype=torch.int64, device=self.device)
        self.steps = [Step(layout(self.device, 1), self.inputs, self.update)]

    def inputs(self, st):
        return st.last[None], st.cache_len[None]

    def update(self, st, logits):
        active = ~st.done
        token = self.sample_token(logits[0], self.uniforms(st))
        emit(st, token[None], self.one)
        st.assign(active, nfe=st.nfe + 1)
