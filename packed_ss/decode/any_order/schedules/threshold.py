"""The threshold decoder baseline (E.6): predict every unresolved position of the sliding window from P,
commit those with confidence >= 0.9 (at least the most confident one), no verification.

Input (2W rows): [N (up to W pending rows: the previous commit) | W masks in textual order, seeing N].
Live rows: p + u_t.
"""
import torch

from ....runtime import Step
from ..call import Call
from ..rules import commit, pending, window_size
from .base import AnyOrderSchedule, confidence


class Threshold(AnyOrderSchedule):
    name = "threshold"
    verifies = False
    threshold = 0.9

    def __init__(self, model, width, sampled, epilogue, order="ltr", n_pending=None):
        super().__init__(model, width, sampled, epilogue, "ltr", n_pending)

    def pending_slots(self) -> int:
        return self.width

    def build(self):
        self.call = Call(self.device, self.mask_id, self.n_pending, 0, self.width)
        return [Step(self.inputs, self.update)]

    def inputs(self, st):
        return self.call.build(st, st.rank_pos, (pending(st) - 1).expand(self.width))

    def update(self, st, logits):
        active, p, u = self.active(st), pending(st), window_size(st)
        masks = logits[self.call.n_anchor:]
        tokens = masks.argmax(-1)
        live = st.rank_pos >= 0
        conf = torch.where(live, confidence(masks, tokens).double(), -1.0)
        keep = live & ((conf >= self.threshold) | (self.ranks == conf.argmax()))
        n = keep.sum()
        committed = torch.where(self.ranks < n, st.rank_pos[torch.sort((~keep).long(), stable=True).indices], -1)
        commit(st, active, st.rank_pos, tokens, keep, n_cached=st.n_acc)
        self.close(st, active, u, n, torch.zeros_like(n), p, rows=p + u, order=committed)
