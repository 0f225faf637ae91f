"""Prompt-lookup decoding: drafts from n-gram matches alone (decode/lookup.py), verified in one causal call.

Verify call [P^(n), D]  causal, K/V written in place  -> accept A tokens; the next draft is the lookup
continuation of the prefix after the call (none without a match: the call then emits one token, as AR).
Needs no drafting mode: any causal checkpoint runs it (the baseline users know from transformers'
`prompt_lookup_num_tokens`, here batch-shaped and on the device).
"""
import torch

from .base import Schedule, Step, layout


class Lookup(Schedule):
    name = "lookup"
    proposes = False
    draft_sources = ("lookup",)
    replay = "lookup"

    def __init__(self, model, width, sampled, epilogue, draft_source="lookup"):
        super().__init__(model, width, sampled, epilogue, draft_source)
        self.offsets = torch.arange(self.block, device=self.device)
        self.layout = layout(self.device, self.block)
        self.steps = [Step(self.inputs, self.update)]

    def inputs(self, st):
        return self.input_at(st, torch.cat([st.last[:, None], st.draft], 1), self.offsets, self.layout)

    def update(self, st, logits):
        self.epilogue.step(st, verify=self.epilogue.rows(logits, st.sampling))
        self.redraft(st)
