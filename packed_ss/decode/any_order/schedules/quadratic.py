"""Quadratic-SS for any-order models: [N | O | M | W branches of W masks] (1 + 2W + W^2 rows).

Branch k drafts U_t from P_{t-1} and the drafts of ranks < k (its masks see N and O_<k); the branch that
verification selects (k = A_t - 1) supplies the next draft. Live rows: p + 2u_t + u_t^2 (Table 2).
"""
import torch

from ....runtime import Step
from ..call import Call
from ..rules import pending, set_draft, window_size
from .base import AnyOrderSchedule


class Quadratic(AnyOrderSchedule):
    name = "quadratic"
    replay = "branch"

    def build(self):
        w = self.width
        self.call = Call(self.device, self.mask_id, self.n_pending, w, w + w * w, n_draft=w * w)
        self.branch = torch.arange(w, device=self.device).repeat_interleave(w)   # branch of each branch row
        self.rank = torch.arange(w, device=self.device).repeat(w)                # its rank
        return [Step(self.inputs, self.update)]

    def inputs(self, st):
        p, u = pending(st), window_size(st)
        branch_pos = torch.where(self.branch < u, st.rank_pos[self.rank], -1)
        see = torch.cat([p + self.ranks - 1, p + self.branch - 1])
        return self.call.build(st, torch.cat([st.rank_pos, branch_pos]), see, self.old_tokens(st))

    def update(self, st, logits):
        active, p, u = self.active(st), pending(st), window_size(st)
        m, w = self.call.n_anchor, self.width
        verified, h, kappa = self.verify(st, logits[m: m + w])
        rand = self.uniforms(st, active)
        a = self.accept(st, active, verified, h, kappa)
        branch = logits.index_select(0, m + w + (a - 1).clamp(min=0) * w + self.ranks)
        set_draft(st, active, *self.propose(st, branch, rand))
        self.close(st, active, u, a, h, p, rows=p + 2 * u + u * u)
