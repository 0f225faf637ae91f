"""Plain autoregressive decoding: one row per call, the reference every other schedule must match."""
import torch

from .base import Schedule, Step, layout


class AR(Schedule):
    name = "ar"
    proposes = False
    draft_sources = ()

    def __init__(self, model, width, sampled, epilogue, draft_source=None):
        super().__init__(model, width, sampled, epilogue, draft_source)
        self.layout = layout(self.device, 1)
        self.zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.steps = [Step(self.inputs, self.update)]

    def inputs(self, st):
        return self.input_at(st, st.last[:, None], self.zero, self.layout)

    def update(self, st, logits):
        self.epilogue.step(st, token=self.epilogue.rows(logits, st.sampling))
