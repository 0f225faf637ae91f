"""Linear-SS for any-order models (ASSD-style): a drafting call, then a verification call.

Draft call  [N | R] (1 + W rows): R_r, a mask at pi_t(r), sees N: z^(pi_t(r)) | P_{t-1}; N is cached.
Verify call [O | M] (2W rows): O = the fresh draft in the order pi_t, M_r sees O_<r and verifies rank r.
pi_t is fixed before the drafting call, by the previous verifier's confidence (E.6). Live rows:
p + u_t and 2u_t (Table 2).
"""
import torch

from ....runtime import Step
from ..call import Call
from ..rules import pending, set_draft, window_size
from .base import AnyOrderSchedule, confidence


class Linear(AnyOrderSchedule):
    name = "linear"
    replay = "fresh"

    def build(self):
        self.draft_call = Call(self.device, self.mask_id, self.n_pending, 0, self.width, n_draft=self.width)
        self.verify_call = Call(self.device, self.mask_id, 0, self.width, self.width)
        self.no_tokens = torch.full((self.width,), -1, dtype=torch.int64, device=self.device)
        return [Step(self.draft_inputs, self.draft_update), Step(self.verify_inputs, self.verify_update)]

    def draft_inputs(self, st):
        return self.draft_call.build(st, st.rank_pos, (pending(st) - 1).expand(self.width))

    def draft_update(self, st, logits):
        active = self.active(st)
        set_draft(st, active, *self.propose(st, logits[self.draft_call.n_anchor:], self.uniforms(st, active)))
        st.assign(active, nfe=st.nfe + 1)

    def verify_inputs(self, st):
        return self.verify_call.build(st, st.rank_pos, self.ranks - 1, self.old_tokens(st), after_pending=True)

    def verify_update(self, st, logits):
        active, p, u = self.active(st), pending(st), window_size(st)
        m = logits[self.width:]
        verified, h, kappa = self.verify(st, m)
        self.uniforms(st, active)                   # the call's offset advances
        a = self.accept(st, active, verified, h, kappa)
        set_draft(st, active, self.no_tokens, confidence(m, m.argmax(-1)))   # scores for pi_{t+1}, no draft
        self.close(st, active, u, a, h, p, rows=p + 3 * u)
