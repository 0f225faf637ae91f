"""Left-to-right decoding: [N | a mask at the leftmost unresolved position] (2 rows), greedy or sampled.
Live rows: p + 1."""
from ....runtime import Step
from ...sampling import inverse_cdf, truncated_probs
from ..call import Call
from ..rules import commit, pending, window_size
from .base import AnyOrderSchedule


class AR(AnyOrderSchedule):
    name = "ar"
    verifies = False

    def __init__(self, model, width, sampled, epilogue, order="ltr", n_pending=None):
        super().__init__(model, 1, sampled, epilogue, "ltr", n_pending)   # a window of one position

    def build(self):
        self.call = Call(self.device, self.mask_id, self.n_pending, 0, 1)
        return [Step(self.inputs, self.update)]

    def inputs(self, st):
        return self.call.build(st, st.rank_pos, (pending(st) - 1).expand(1))

    def update(self, st, logits):
        active, p, u = self.active(st), pending(st), window_size(st)
        rand, row = self.uniforms(st, active), logits[-1]
        token = row.argmax() if rand is None else inverse_cdf(truncated_probs(row, st.sampling), rand[0])
        commit(st, active, st.rank_pos, token[None], self.ranks >= 0, n_cached=st.n_acc)
        self.close(st, active, u, u, 0 * u, p, rows=p + 1)
