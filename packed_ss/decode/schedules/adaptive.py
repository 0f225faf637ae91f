"""Adaptive: each iteration runs the call shape the policy bets on (decode/policy.py), AR always among them.

Shapes (one model call each, n = |P|; w <= W, the state's draft width, m mask rows):
  ar              [P^(n)]                                the AR step
  lookup  w       [P^(n), D̄]                causal       the lookup draft, verified alone
  packed  w / m   [P^(n), D̄ | P^(n), MASK^m]  Packed-SS    D: the lookup draft where one is found, else the
                                                         proposal suffix the request's last packed call kept
Every shape verifies (AR an empty draft), so a request draws its tokens with the same uniforms in any of them,
and a request verifies no more of its draft than its own shape does: a batch runs the cover of its requests'
shapes and each request's tokens are those it would get alone (per-request choice, the rejection sampler), or
the policy picks the batch's shape freely (greedy and shared noise, where the output does not depend on it).
After every step (the prefill too) the lookup draft of the prefix after the call becomes the next draft where
one is found, the policy scores drafts and chooses, and the status table carries each request's choice to the
host, which runs the cover of the choices next (on CUDA an iteration late). When every live request stays quiet
through the next call (the policy's quiet periods, Policy.next_call) the host runs the lean AR step instead (index
QUIET, the last): the AR call, an empty draft verified, and nothing else.
"""
import torch

from ..policy import AR, Policy, Shape
from .base import Schedule, Step, layout


class Adaptive(Schedule):
    name = "adaptive"
    proposes = False      # the prefill drafts by lookup alone; the packed shapes propose in their calls

    def __init__(self, model, width, sampled, epilogue, draft_source="both", policy: Policy | None = None):
        if policy is None or policy.width != width:
            raise ValueError(f"the adaptive schedule needs a Policy of width {width}")
        super().__init__(model, width, sampled, epilogue, draft_source)
        self.policy = policy
        self._shapes = [[Step(self._inputs(shape), self._update(i, shape))] for i, shape in enumerate(policy.shapes)]
        self._shapes.append([Step(self._inputs(AR), self._quiet)])          # index QUIET: the lean AR step
        self.steps = self._shapes[0]

    @property
    def shapes(self) -> list[list[Step]]:
        """The policy's shapes, then the lean AR step (QUIET)."""
        return self._shapes

    def new_state(self, request, **shape):
        """DecodeState with the policy's fields."""
        return self.policy.new_state(super().new_state(request, **shape))

    # -- the shapes' calls -------------------------------------------------------------------------------------
    def _inputs(self, shape: Shape):
        w, m, device = shape.width, shape.masks, self.device
        slots = torch.arange(w, device=device)
        offsets = torch.cat([torch.arange(w + 1, device=device)] + ([torch.arange(m + 1, device=device)] if m else []))
        lay = layout(device, w + 1, [1] * (m + 1), [-1] * (m + 1)) if m else layout(device, w + 1)
        masks = self.masks(m) if m else None

        def inputs(st):
            last = st.last[:, None]
            if not w:                                        # ar: the last token alone
                return self.input_at(st, last, offsets, lay)
            parts = [last, torch.where(slots < st.draft_len[:, None], st.draft[:, :w], last)]
            if m:
                parts += [last, masks.expand(st.batch, -1)]
            return self.input_at(st, torch.cat(parts, 1), offsets, lay)
        return inputs

    def _update(self, index: int, shape: Shape):
        w, m = shape.width, shape.masks

        def update(st, logits):
            rows = self.epilogue.rows(logits, st.sampling)
            c = self.policy.constants(st.done.device)
            passive, per_request = st.passive, self.policy.per_request
            ran = torch.where(passive, 0, st.choice if per_request else index)
            held = None              # chosen freely, every request runs this shape (or, quiet, AR's)
            if per_request:          # a request that chose a wider shape than this call sits it out
                held = (~st.done & ~self.policy.covers(index, ran), st.offset.clone())
                st.done.logical_or_(held[0])
            verified_lookup, before = st.lookup_draft.clone(), st.n_out.clone()
            st.assign(~st.done, draft_len=torch.minimum(st.draft_len, c.widths[ran]))
            verify = rows[:w + 1]
            if m:
                self.epilogue.step(st, verify=verify, propose=rows[w + 2:], retain="a")
            else:
                self.epilogue.step(st, verify=verify)
            self.epilogue.observe(self.policy, st, ran, st.n_out - before, verified_lookup, passive)
            self.redraft(st, keep=(c.masks[ran] > 0) if m else None, held=held, passive=passive)
        return update

    def _quiet(self, st, logits):
        """The lean AR step, run when the host knows every live request is quiet in it (Policy.next_call): each
        verifies an empty draft (one that went quiet holding a draft drops it), and nothing else runs."""
        st.draft_len.zero_()
        self.epilogue.step(st, verify=self.epilogue.rows(logits, st.sampling))

    # -- after every step ----------------------------------------------------------------------------------------
    def redraft(self, st, keep: torch.Tensor | None = None, held=None, passive: torch.Tensor | None = None) -> None:
        """The lookup draft of the prefix after the call becomes the next draft where one is found (a point mass Q
        when sampled), unless the request keeps the proposals its packed call retained (`keep` [B], its shape
        proposes) and expects more of them (Policy.prefers_lookup); elsewhere, and for quiet requests (`passive`),
        there is no draft. Then requests that sat the step out (`held`: which, and their RNG offsets before it)
        rejoin unchanged, and the policy scores the lookup draft and chooses."""
        passive = torch.zeros_like(st.done) if passive is None else passive
        keep = torch.zeros_like(st.done) if keep is None else keep
        if self.looks_up:
            draft, length, order = self.epilogue.lookup_draft(st, self.width)
            preferred = self.epilogue.prefers_lookup(self.policy, st, length, order)
        else:
            draft, length, order = st.draft, st.draft_len, torch.zeros_like(st.draft_len)
            preferred = torch.zeros_like(st.done)
        self.epilogue.take_lookup(st, draft, length, order, preferred, keep, passive, self.sampled and self.looks_up)
        if self.looks_up:
            self.epilogue.score_lookup(self.policy, st, draft, length, order, passive)
        if held is not None:
            held, offset = held
            st.done.logical_and_(~held)
            st.offset.copy_(torch.where(held, offset, st.offset))
        self.epilogue.choose(self.policy, st, length, order, passive)
