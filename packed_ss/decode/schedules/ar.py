"""Plain autoregressive decoding: one row per call, the reference every other schedule must match."""
from ...runtime import ModelInput
from .base import Schedule, Step, layout


class AR(Schedule):
    name = "ar"
    drafts = False

    def __init__(self, model, width, params, epilogue):
        super().__init__(model, width, params, epilogue)
        self.layout = layout(self.device, 1)
        self.steps = [Step(self.inputs, self.update)]

    def inputs(self, st):
        return ModelInput(st.last[None], st.cache_len[None], self.layout, st.cache_len)

    def update(self, st, logits):
        self.epilogue.step(st, token=self.epilogue.rows(logits[:1]))
