"""Packed-SS for any-order models (paper Alg. 3, D.2): verify D_{t-1} and draft from P_{t-1} in one call.

Input (1 + 3W rows): [N | O | M | R]. O holds D_{t-1} in the order pi_t (masks where no draft); M_r, a
mask at pi_t(r), sees N and O_<r and verifies rank r; R_r, a mask at pi_t(r), sees N only: the proposal
z^(pi_t(r)) | P_{t-1}. Live rows: p + 3u_t (Table 2); the rest is padding.
"""
import torch

from ....runtime import Step
from ..call import Call
from ..rules import pending, set_draft, window_size
from .base import AnyOrderSchedule


class Packed(AnyOrderSchedule):
    name = "packed"
    replay = "lagged"

    def build(self):
        self.call = Call(self.device, self.mask_id, self.n_pending, self.width, 2 * self.width, n_draft=self.width)
        return [Step(self.inputs, self.update)]

    def inputs(self, st):
        p = pending(st)
        see = torch.cat([p + self.ranks - 1, (p - 1).expand(self.width)])   # M_r: N, O_<r; R: N
        return self.call.build(st, st.rank_pos.repeat(2), see, self.old_tokens(st))

    def update(self, st, logits):
        active, p, u = self.active(st), pending(st), window_size(st)
        m = self.call.n_anchor
        verified, h, kappa = self.verify(st, logits[m: m + self.width])   # lines 6-7, 9
        rand = self.uniforms(st, active)
        proposal = self.propose(st, logits[m + self.width:], rand)            # line 8
        a = self.accept(st, active, verified, h, kappa)                   # lines 10-13
        set_draft(st, active, *proposal)                                  # lines 14-15
        self.close(st, active, u, a, h, p, rows=p + 3 * u)
