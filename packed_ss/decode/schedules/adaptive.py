"""Adaptive: each iteration runs the call shape the policy bets on (decode/policy.py), AR always among them.

Shapes (one model call each, n = |P|, w <= W, the state's draft width):
  ar           [P^(n)]                                   the AR step
  lookup   w   [P^(n), L]                  causal         the lookup draft L, verified alone
  packed   w   [P^(n), D̄ | P^(n), MASK^w]  Packed-SS      D: the lookup draft where one is found, else the
                                                          proposal suffix the last packed call retained
A narrower shape verifies the first w draft tokens. After every step (the prefill too) the lookup draft of
the prefix after the call becomes the next draft where one is found, the policy scores drafts and picks the
next shape, and the status table carries that choice to the host, which runs it next (on CUDA an iteration
late). The program is greedy: a sampled request runs it under shared noise (SharedNoise), where the output
is the request's AR sample whatever shape each iteration takes, so every choice is free.
"""
import torch

from ..lookup import lookup_draft
from ..policy import Policy, Shape
from .base import Schedule, Step, layout


class Adaptive(Schedule):
    name = "adaptive"

    def __init__(self, model, width, params, epilogue, draft_source="both", policy: Policy | None = None):
        if not params.greedy:
            raise ValueError("the adaptive schedule runs greedy programs: sample under shared noise "
                             "(sampler='gumbel'), where every shape gives the same tokens")
        if policy is None or policy.width != width:
            raise ValueError(f"the adaptive schedule needs a Policy of width {width}")
        self.proposes = any(s.kind == "packed" for s in policy.shapes)
        super().__init__(model, width, params, epilogue, draft_source)
        self.policy = policy
        self.shapes = [[Step(self._inputs(shape), self._update(i, shape))] for i, shape in enumerate(policy.shapes)]
        self.steps = self.shapes[0]

    def new_state(self, request, **shape):
        return self.policy.new_state(super().new_state(request, **shape))

    # -- the shapes' calls -------------------------------------------------------------------------------------
    def _inputs(self, shape: Shape):
        w, device = shape.width, self.device
        slots = torch.arange(w, device=device)
        if shape.kind == "ar":
            offsets, lay = torch.zeros(1, dtype=torch.int64, device=device), layout(device, 1)
        elif shape.kind == "lookup":
            offsets, lay = torch.arange(w + 1, device=device), layout(device, w + 1)
        else:
            offsets, lay = torch.arange(w + 1, device=device).repeat(2), layout(device, w + 1, [1] * (w + 1),
                                                                                 [-1] * (w + 1))
        masks = self.masks(w) if shape.kind == "packed" else None

        def inputs(st):
            last = st.last[:, None]
            if shape.kind == "ar":
                return self.input_at(st, last, offsets, lay)
            draft = torch.where(slots < st.draft_len[:, None], st.draft[:, :w], self.mask_id if masks is not None
                                else last)
            if shape.kind == "lookup":
                return self.input_at(st, torch.cat([last, draft], 1), offsets, lay)
            return self.input_at(st, torch.cat([last, draft, last, masks.expand(st.batch, -1)], 1), offsets, lay)
        return inputs

    def _update(self, index: int, shape: Shape):
        w = shape.width

        def update(st, logits):
            rows = self.epilogue.rows(logits)
            verified_lookup, before = st.lookup_draft.clone(), st.n_out.clone()
            if shape.kind == "ar":
                self.epilogue.step(st, token=rows)
            else:
                st.assign(~st.done, draft_len=st.draft_len.clamp(max=w))
                verify = self._padded(rows[:w + 1])
                if shape.kind == "lookup":
                    self.epilogue.step(st, verify=verify)
                else:
                    self.epilogue.step(st, verify=verify, propose=rows[w + 2:], retain="a")
            self.policy.observe(st, index, st.n_out - before, verified_lookup)
            self.redraft(st, keep_proposals=shape.kind == "packed")
        return update

    def _padded(self, rows):
        """Greedy verifier rows [B, w + 1] widened to the state's W + 1 (the epilogue's shape): draft tokens
        past w are never compared (draft_len <= w), so the padding is never read."""
        arg = rows.arg
        return type(rows)(arg=torch.cat([arg, arg[:, -1:].expand(-1, self.width + 1 - arg.shape[1])], 1),
                          vocab=rows.vocab)

    # -- after every step ----------------------------------------------------------------------------------------
    def redraft(self, st, keep_proposals: bool = True) -> None:
        """The lookup draft of the prefix after the call replaces the draft where one is found (elsewhere the
        packed call's retained proposals stay, or, after another shape, no draft); the policy scores it and
        picks the next shape."""
        if self.looks_up:
            draft, length, found = lookup_draft(st, self.width)
        else:
            draft, length, found = st.draft, st.draft_len, torch.zeros_like(st.done)
        otherwise = st.draft_len if keep_proposals and self.proposes else torch.zeros_like(st.draft_len)
        st.assign(~st.done, draft=torch.where(found[:, None], draft, st.draft),
                  draft_len=torch.where(found, length, otherwise), lookup_draft=found)
        if self.looks_up:
            self.policy.score_lookup(st, draft, length, found)
        self.policy.choose(st, length, found)
