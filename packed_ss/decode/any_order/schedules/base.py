"""What every any-order schedule shares: the state, the prompt call, drafting, verification and the end
of an iteration (paper Alg. 3, E.2, E.6)."""
from __future__ import annotations

import torch

from ....model.attention import Layout
from ....runtime import ModelInput, Request, Step
from ....runtime.program import Program
from ....runtime.staging import staged
from ...epilogue import Epilogue
from ...sampling import inverse_cdf, philox_uniform, truncated_probs
from ...state import DecodeState, q_dtype
from ..rules import commit, drafts, hold_if_crowded, pending, plan, record, window_size
from ..state import AnyOrderState


def confidence(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The probability each row gives its token (a draft's or a verifier's confidence score, E.6)."""
    return logits.float().softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)


def one_request(step: Step) -> Step:
    """A step written for one request's state, on the runtime's batch of one: an any-order call's layout
    follows its request's own window, so requests cannot share a call."""
    def inputs(st: AnyOrderState) -> ModelInput:
        inp = step.inputs(st.request())
        rows = None if inp.logit_rows is None else inp.logit_rows[None]
        return ModelInput(inp.tokens[None], inp.positions[None], inp.layout, inp.cache_len[None], rows)

    def update(st: AnyOrderState, logits: torch.Tensor) -> None:
        step.update(st.request(), logits[0])
    return Step(inputs, update)


class AnyOrderSchedule(Program):
    """prefill(prompt) caches the prompt in one counted call (E.2); `steps` are one iteration of Alg. 3.

    Every call has a fixed shape: `n_pending` N slots (1; the threshold decoder W), W O slots where the
    schedule verifies, then its mask queries; rows beyond p and u_t are inert padding. An iteration that
    leaves more rows pending than that (a stop sequence truncated P_t after cache rows had seen a dropped
    token) sets `hold`, and `resume()` runs the next iteration with a call wide enough for them. Sampling
    draws uniforms from Philox keyed by (seed, offset), the offset advancing once per call: [0, u_t] for
    acceptance and the residual or fresh draw, [W+1, 2W+1) for drafts.
    """
    verifies = True   # counts toward n_verify / n_accepted
    max_batch = 1     # requests in a batch: a call's layout follows its request's own window
    cache_in_order = False   # the cache holds accepted tokens in acceptance order, not output order

    def __init__(self, model, width: int, sampled: bool, epilogue: Epilogue, order: str = "ltr",
                 n_pending: int | None = None):
        self.model, self.width, self.sampled, self.epilogue, self.order = model, width, sampled, epilogue, order
        self.n_pending = n_pending or self.pending_slots()
        self.device, self.mask_id = model.device, model.cfg.mask_token_id
        # the epilogue verifies a DecodeState: this one holds D_{t-1} in rank order, its Q and the RNG key
        support = model.cfg.vocab_size if sampled else 1
        self.ranked = DecodeState.new(width, support, 1, [], 0, self.device, q_dtype=q_dtype(model))
        self.block = width + 1   # an iteration resolves positions of a window that starts at n_out
        self.ranks = torch.arange(width, device=self.device)
        self.steps: list[Step] = [one_request(step) for step in self.build()]
        self.reserve = self.n_pending + width   # cache slots a call may write past the output: its anchors

    def pending_slots(self) -> int:
        return 1

    def build(self) -> list[Step]:
        raise NotImplementedError

    def new_state(self, request: Request, out_len: int | None = None, stop_slots: int | None = None,
                  sequence_slots: tuple[int, int] | None = None, device=None) -> AnyOrderState:
        """A request's fresh state (on `device`, default the model's). Stop ids are stop sequences of length 1: one table of stop_slots + sequence_slots[0] rows."""
        support = self.model.cfg.vocab_size if self.sampled else 1
        stops = [(t,) for t in request.stop_ids] + [tuple(s) for s in request.stop_sequences]
        n_seq, seq_len = sequence_slots or (0, 1)
        return AnyOrderState.new(self.width, support, len(request.prompt), request.max_new_tokens, request.seed,
                                 stops, device or self.device, out_len, ((stop_slots or 0) + n_seq, seq_len),
                                 q_dtype(self.model), request.params)

    def prefill(self, *prompts: torch.Tensor, cached=None) -> Step:
        """The prompt as causal anchors at positions 0..n0-1 (one counted call), then the first window. One
        request at a time (`max_batch`). `cached`: how many prompt tokens its cache holds already (the chunks
        of a long prompt, `Runtime.prefix`); `prompts` (a host tensor) is then what follows them."""
        (prompt,) = prompts
        start = (cached or [0])[0]
        anchors = torch.arange(prompt.numel())
        layout = Layout(prompt.numel(), staged(torch.zeros_like(anchors), self.device), staged(anchors, self.device))
        prompt, positions = staged(prompt, self.device), staged(start + anchors, self.device)
        start, read = staged(torch.tensor(start), self.device), staged(anchors[:0], self.device)   # no logits read

        def update(st: AnyOrderState, logits: torch.Tensor) -> None:
            active = self.active(st)
            st.assign(active, nfe=st.nfe + 1)
            plan(st, self.order, active)
        return one_request(Step(lambda st: ModelInput(prompt, positions, layout, start, read), update))

    def resume(self, st: AnyOrderState, call) -> None:
        """While held: run the next iteration with every pending row in its N region (host reads allowed)."""
        one = st.request()
        while bool(one.hold) and not bool(one.done):
            wide = type(self)(self.model, self.width, self.sampled, self.epilogue, self.order,
                              n_pending=int(pending(one)))
            one.hold.fill_(False)
            for step in wide.steps:
                step.fold(st, call(step.inputs(st)))

    def finish(self, st: AnyOrderState, fetch) -> dict:
        return {"iterations": st.request().iterations(fetch)}

    # -- helpers of the steps ----------------------------------------------------------------------------
    @staticmethod
    def active(st: AnyOrderState) -> torch.Tensor:
        return ~(st.done | st.hold)

    def uniforms(self, st: AnyOrderState, active) -> torch.Tensor | None:
        """This call's uniforms (None when greedy); the offset advances once per call, on the device, so a step
        verifies (`verify`, whose epilogue draws the same uniforms from the key before the advance) first."""
        if not self.sampled:
            return None
        u = philox_uniform(st.seed, st.offset, 2 * self.width + 2)
        st.assign(active, offset=st.offset + 1)
        return u

    def old_tokens(self, st: AnyOrderState) -> torch.Tensor:
        """O: D_{t-1} at each rank of pi_t, a mask where a rank has no draft."""
        tok = drafts(st)[0]
        return torch.where(tok >= 0, tok, self.mask_id)

    def propose(self, st: AnyOrderState, logits: torch.Tensor, u: torch.Tensor | None):
        """Drafts from mask rows in rank order (line 8): (tokens, scores, Q: dense, or None); a score is the
        probability the proposal gave its own token."""
        if u is None:
            z = logits.argmax(-1)
            return z, confidence(logits, z), None
        prob = truncated_probs(logits, st.sampling)
        z = inverse_cdf(prob, u[self.width + 1: 2 * self.width + 1])
        return z, prob.gather(-1, z[:, None])[:, 0], prob

    def verify(self, st: AnyOrderState, logits: torch.Tensor):
        """(token at each rank, h_t, kappa_t) from the verifier rows M in rank order (lines 6-7, 9), by the
        epilogue.

        Greedy: the argmax, h = leading ranks whose draft equals it. Sampled: rejection sampling against each
        draft's stored Q up to kappa_t; a rank without a draft is drawn from p. The epilogue verifies W + 1
        rows (the LTR bonus row last): here the last M row again, with the residual drawn at u[u_t]; with
        all u_t drafts accepted Alg. 3 takes no extra token, and that draw is dropped. Its uniforms are the call's,
        from the state's key: a step verifies before `uniforms` advances it. `ranked` is the epilogue's view of
        the draft in rank order, written whole here before each use."""
        tok, kappa, q_prob = drafts(st)
        self.ranked.seed.copy_(st.seed)
        self.ranked.offset.copy_(st.offset)
        self.ranked.draft.copy_(torch.where(tok >= 0, tok, 0))
        self.ranked.draft_len.copy_(kappa)
        if self.sampled:
            self.ranked.q_prob.copy_(q_prob)
        rows = self.epilogue.rows(torch.cat([logits, logits[-1:]])[None], st.sampling)
        verified = self.epilogue.verify(self.ranked, rows, residual=window_size(st)[None])
        return verified.emitted[0, :self.width], verified.n_accept[0] - 1, kappa

    def accept(self, st: AnyOrderState, active, verified, h, kappa) -> torch.Tensor:
        """Lines 10-13: accept ranks < A_t = min(h_t + 1, u_t); N and the O rows of ranks < h_t stay in the
        cache (written in place: a cache-length advance), the verifier's own token waits as pending. Where
        all kappa_t >= 1 drafts were accepted and the window goes on, that token is a fresh draw from p at
        rank kappa_t (the bonus, counted in `n_bonus`)."""
        u = window_size(st)
        a = torch.minimum(h + 1, u)
        st.assign(active, n_bonus=st.n_bonus + ((h == kappa) & (kappa > 0) & (h < u)).long())
        commit(st, active, st.rank_pos, verified, self.ranks < a, n_cached=st.n_acc + h)
        return a

    def close(self, st: AnyOrderState, active, u, a, h, p, rows, order=None) -> None:
        """The iteration's trace row and counters, then pi_{t+1} (chosen before the next call) and `hold`."""
        record(st, active, st.rank_pos if order is None else order,
               window=u, accepted=a, drafts_accepted=h, pending_rows=p, rows=rows)
        st.assign(active, nfe=st.nfe + 1)
        if self.verifies:
            st.assign(active, n_verify=st.n_verify + 1, n_accepted=st.n_accepted + h)
        plan(st, self.order, active)
        hold_if_crowded(st, active, self.n_pending)
