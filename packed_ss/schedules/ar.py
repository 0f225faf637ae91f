"""Plain autoregressive decoding: one row per call, the reference every other schedule must match."""
import torch

from .base import Schedule, Step, layout
from ..state import emit


class AR(Schedule):
    name = "ar"
    drafts = False

    def __init__(self, model, width, params, native=False):
        super().__init__(model, width, params, native)
        self.one = torch.ones((), dtype=torch.int64, device=self.device)
        self.steps = [Step(layout(self.device, 1), self.inputs, self.pick(self.update, self.update_native))]

    def inputs(self, st):
        return st.last[None], st.cache_len[None]

    def update(self, st, logits):
        active = ~st.done
        token = self.sample_token(logits[0], self.uniforms(st))
        emit(st, token[None], self.one)
        st.assign(active, nfe=st.nfe + 1)

    def update_native(self, st, logits):
        self.epilogue.step(st, token=self.epilogue.rows(logits[:1]))
