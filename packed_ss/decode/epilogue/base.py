"""The step epilogue interface: what a schedule calls after its model call.

A decode step ends with acceptance, the correction or bonus draw, emit with the stop rules, the cache
length advance and the retain of the proposal suffix with its Q. Two objects implement it with the same
calls and bit-identical results: `TorchEpilogue` (plain torch, the reference; it compiles with
torch.compile) and `NativeEpilogue` (csrc/, one call per step). A schedule holds one of them and has a
single update path. After the step, the next draft (`lookup_draft`, taken by `take_lookup` with a point mass Q
when sampled) and the adaptive schedule's policy (its statistics: `observe`, `score_lookup`, `prefers_lookup`; its
choice: `choose`) go through the epilogue too: the native one runs them in C++ on the CPU (csrc/lookup.h,
policy.h), where a few dozen small torch ops each would cost more than the rest of the step.

What an epilogue consumes: the model's logits, processed by `rows(logits, sampling)` into the argmax of each row
(greedy) or the truncated distribution of each row (sampled: `truncated_probs` with each request's settings, dense:
idx None). It also takes sparse distributions (idx/prob sorted by decreasing probability, a support of K tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ... import host
from ..lookup import lookup_draft
from ..sampling import Sampling, truncated_probs
from ..state import DecodeState, stop_at_sequences


@dataclass
class Rows:
    """Runs of model rows as an epilogue consumes them, one run per request of the batch: argmax `arg` [B, R]
    (greedy), or the truncated distribution (`idx`, `prob`) [B, R, K] (sampled); `idx` is None when the
    distribution is dense (idx = token). Indexing slices every request's rows alike: `rows[:W]` holds
    each request's first W rows."""
    arg: torch.Tensor | None = None
    idx: torch.Tensor | None = None
    prob: torch.Tensor | None = None
    vocab: int = 0

    def __getitem__(self, rows: slice) -> "Rows":
        if self.arg is not None:
            return Rows(arg=self.arg[:, rows], vocab=self.vocab)
        return Rows(idx=None if self.idx is None else self.idx[:, rows], prob=self.prob[:, rows], vocab=self.vocab)

    def __len__(self) -> int:
        """Rows per request."""
        t = self.arg if self.arg is not None else self.prob
        return 0 if t is None else t.shape[1]

    def widened(self, rows: int) -> "Rows":
        """These rows widened to `rows` per request with copies of the last."""
        def widen(t):
            return None if t is None else torch.cat([t, t[:, -1:].expand(-1, rows - t.shape[1], *t.shape[2:])], 1)
        return Rows(arg=widen(self.arg), idx=widen(self.idx), prob=widen(self.prob), vocab=self.vocab)

    @property
    def k(self) -> int:
        return 0 if self.prob is None else self.prob.shape[2]


class Verified(NamedTuple):
    """A verification's outcome, from `verify` to its `commit`: the emitted tokens C [B, W+1] (the first A
    meaningful), A [B], and `draws`, what the commit goes on from: the torch epilogue's uniforms of the call
    (None when greedy), the native one's result buffer [B, W+3] (C and A are views of it)."""
    emitted: torch.Tensor
    n_accept: torch.Tensor
    draws: torch.Tensor | None


class Epilogue:
    """One schedule's epilogue: its device, width and whether its requests sample (each request's settings are
    its batch state's, `DecodeState.sampling`).

    `step` runs a whole epilogue: verify the stored draft against `verify` (up to B rows per request: a draft
    verifies within them, at most R - 1 of its tokens, so a call verifying short drafts passes only the rows
    they need) or draw one AR token from `token` (row 0); emit; then, if `retain` is given, the next draft is `propose`[shift:] with its Q,
    shift = the emitted count ("a") or a fixed number of rows. `verify` + `commit` split it where a schedule
    picks its proposal rows from the verification outcome (Quadratic-SS). Every call draws this call's
    uniforms from (seed, offset) once and advances the offset on the device.
    """

    def __init__(self, device, width: int, sampled: bool):
        self.device = torch.device(device)
        self.width, self.block, self.sampled = width, width + 1, sampled

    def rows(self, logits: torch.Tensor, sampling: Sampling) -> Rows:
        """Argmax (greedy) or truncated distribution (sampled: dense, each request's `sampling` [B]) of every row of
        logits [B, R, V]."""
        vocab = logits.shape[-1]
        if not self.sampled:
            return Rows(arg=logits.argmax(-1), vocab=vocab)
        return Rows(prob=truncated_probs(logits, sampling).contiguous(), vocab=vocab)

    def lookup_draft(self, st: DecodeState, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next lookup draft of each request, its length and its match's order (lookup.lookup_draft)."""
        return lookup_draft(st, width)

    def point_mass(self, st: DecodeState, draft: torch.Tensor, rows: torch.Tensor) -> None:
        """A lookup draft's stored Q, in place in the `rows` [B] that take one: all mass on each draft token (the
        dense layout, idx = token, written once by Schedule.new_state)."""
        st.q_prob.masked_fill_(rows[:, None, None], 0.0)
        at = draft.clamp(min=0)[:, :, None]
        st.q_prob.scatter_(2, at, torch.where(rows[:, None, None], 1.0, st.q_prob.gather(2, at)))

    def take_lookup(self, st: DecodeState, draft: torch.Tensor, length: torch.Tensor, order: torch.Tensor,
                    preferred: torch.Tensor, keep: torch.Tensor, passive: torch.Tensor, point_mass: bool) -> None:
        """The next draft of a schedule that drafts by lookup (Schedule.redraft, Adaptive.redraft): an unfinished
        request takes its lookup `draft` [B, W] (`length`) where one was found (`order` > 0), it is `preferred` to the
        proposals its call kept or none were kept (`keep`), and the request is not quiet (`passive`), with a point
        mass Q if `point_mass`; otherwise it keeps its proposals where it kept them and is not quiet, else it has no
        draft. `st.lookup_draft` says which requests took a lookup draft, where the state has those flags (the
        adaptive schedule's)."""
        lookup = (order > 0) & (preferred | ~keep) & ~passive
        flags = {"lookup_draft": lookup} if hasattr(st, "lookup_draft") else {}
        st.assign(~st.done, draft=torch.where(lookup[:, None], draft, st.draft),
                  draft_len=torch.where(lookup, length, torch.where(keep & ~passive, st.draft_len, 0)), **flags)
        if point_mass:
            self.point_mass(st, draft, lookup & ~st.done)

    def observe(self, policy, st, ran: torch.Tensor, emitted: torch.Tensor, verified_lookup: torch.Tensor,
                passive: torch.Tensor | None = None) -> None:
        """The adaptive schedule's diffusion estimates after the step (policy.Policy.observe)."""
        policy.observe(st, ran, emitted, verified_lookup, passive)

    def score_lookup(self, policy, st, draft: torch.Tensor, length: torch.Tensor, order: torch.Tensor,
                     passive: torch.Tensor | None = None) -> None:
        """The adaptive schedule's lookup statistics after the step (policy.Policy.score_lookup)."""
        policy.score_lookup(st, draft, length, order, passive)

    def prefers_lookup(self, policy, st, length: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Which requests [B] give a packed call their lookup draft (policy.Policy.prefers_lookup)."""
        return policy.prefers_lookup(st, length, order)

    def choose(self, policy, st, length: torch.Tensor, order: torch.Tensor, passive: torch.Tensor | None = None):
        """The adaptive schedule's choice after the step (policy.Policy.choose)."""
        policy.choose(st, length, order, passive)

    def step(self, st: DecodeState, *, verify: Rows | None = None, token: Rows | None = None,
             propose: Rows | None = None, retain: str | int | None = None) -> None:
        start = self._mark(st)
        self._step(st, verify, token, propose, retain)
        self._stop_at_sequences(st, start)

    def verify(self, st: DecodeState, verify: Rows, residual: torch.Tensor | None = None) -> Verified:
        """First half of a draft verification: acceptance and the correction / bonus draw, for `commit` to go on
        from. `residual` [B]: the uniform index of that draw, W by default (the any-order
        steps verify u_t <= W ranks and draw at u_t). Without it, a sampled empty draft's verification is an AR
        step: its token is drawn as `token` draws one (u_0, the row's own order), so a request that does not
        speculate draws AR's sample for its seed."""
        raise NotImplementedError

    def commit(self, st: DecodeState, verified: Verified, *, propose: Rows | None, retain: str | int | None) -> None:
        """Second half, with what `verify` returned for st: emit, count, retain."""
        start = self._mark(st)
        self._commit(st, verified, propose, retain)
        self._stop_at_sequences(st, start)

    # -- stop sequences of several tokens: matched on the device after emit, for either implementation ------
    @staticmethod
    def _mark(st: DecodeState) -> torch.Tensor | None:
        """n_out before the step, where stop sequences are to be matched after it: not where the tables have no
        slots, nor on the CPU, eagerly, where no request has a sequence (each unused slot ends in -2)."""
        if not st.stop_seqs.shape[1]:
            return None
        if host.reads_are_free(st.stop_seqs) and not (st.stop_seqs[..., -1] != -2).any():
            return None
        return st.n_out.clone()

    @staticmethod
    def _stop_at_sequences(st: DecodeState, start: torch.Tensor | None) -> None:
        if start is not None:
            stop_at_sequences(st, start)

    def _step(self, st, verify, token, propose, retain) -> None:
        raise NotImplementedError

    def _commit(self, st, verified, propose, retain) -> None:
        raise NotImplementedError
