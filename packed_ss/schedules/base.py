"""What every schedule shares: the call abstraction, drafting from mask rows, and the prefill call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..acceptance import verify_greedy, verify_sampled
from ..attention import Layout
from ..epilogue import NativeEpilogue
from ..sampling import SamplingParams, philox_uniform, sample_sparse, truncated_probs
from ..state import DecodeState, emit, retain


@dataclass
class Step:
    """One model call: a static layout, how to build its input, and how to fold its logits into state."""
    layout: Layout
    inputs: Callable[[DecodeState], tuple[torch.Tensor, torch.Tensor]]   # -> (tokens, positions)
    update: Callable[[DecodeState, torch.Tensor], None]


def layout(device, n_anchor: int, scratch_seg=(), scratch_see=()) -> Layout:
    """Anchors 0..n_anchor-1 (causal, cached) followed by scratch rows with the given seg / see."""
    seg = torch.tensor([0] * n_anchor + list(scratch_seg), dtype=torch.int64)
    see = torch.tensor(list(range(n_anchor)) + list(scratch_see), dtype=torch.int64)
    return Layout(n_anchor, seg, see).to(device)


class Schedule:
    """A decoding schedule: `prefill(prompt)` then `steps` repeated until the state is done.

    Subclasses set `name`, `drafts` (whether the prefill call also drafts W+1 positions) and `steps`.
    Each step's `update` is written in plain torch (the reference, as in the paper's algorithms); with
    `native=True` the steps use `update_native` instead: the same algorithm, in one call of the compiled
    epilogue (packed_ss/epilogue.py, csrc/) after the same logits processing.
    """
    name = ""
    drafts = True

    def __init__(self, model, width: int, params: SamplingParams, native: bool = False):
        self.model, self.width, self.params = model, width, params
        self.block = width + 1
        self.device = model.device
        self.mask_id = model.cfg.mask_token_id
        self.n_uniform = 2 * self.block + 1  # [0, W]: acceptance + correction, [B, 2B]: drafts
        self.epilogue = NativeEpilogue(self.device, width, params) if native else None
        self.steps: list[Step] = []

    def pick(self, update, update_native):
        """The update a step uses: the torch reference, or its compiled-epilogue twin."""
        return update_native if self.epilogue is not None else update

    # -- helpers shared by the schedules -------------------------------------------------------------
    def uniforms(self, st: DecodeState) -> torch.Tensor | None:
        """This call's uniforms (None when greedy); the offset advances once per call, on the device."""
        if self.params.greedy:
            return None
        u = philox_uniform(st.seed, st.offset, self.n_uniform)
        st.offset.add_(1)
        return u

    def masks(self, n: int) -> torch.Tensor:
        return torch.full((n,), self.mask_id, dtype=torch.int64, device=self.device)

    def propose(self, logits: torch.Tensor, u: torch.Tensor | None):
        """Draft tokens from mask-row logits [Z, V]: argmax, or a sample (uniforms u[B:]) with its sparse Q."""
        if self.params.greedy:
            return logits.argmax(-1), None, None
        idx, prob = truncated_probs(logits, self.params)
        return sample_sparse(idx, prob, u[self.block: self.block + logits.shape[0]]), idx, prob

    def verify(self, st: DecodeState, logits: torch.Tensor, u: torch.Tensor):
        """(emitted [B], A) for the verifier rows [last, d_1..d_W] against the stored draft."""
        if self.params.greedy:
            return verify_greedy(st.draft, st.draft_len, logits)
        return verify_sampled(st.draft, st.draft_len, st.q_idx, st.q_prob, logits, u, self.params)

    def commit(self, st: DecodeState, emitted, n_accept, active) -> torch.Tensor:
        """Emit and count one verification call; returns the number of tokens appended."""
        a = emit(st, emitted, n_accept)
        st.assign(active, nfe=st.nfe + 1, n_verify=st.n_verify + 1,
                  n_accepted=st.n_accepted + (a - 1).clamp(min=0))
        return a

    # -- the first call: prompt (causal, cached) plus W+1 masks (paper E.2) ---------------------------
    def prefill(self, prompt: torch.Tensor) -> Step:
        n0, n_masks = prompt.numel(), self.block if self.drafts else 0
        lay = layout(self.device, n0, [1] * n_masks, [n0 - 1] * n_masks)
        tokens = torch.cat([prompt, self.masks(n_masks)])
        positions = torch.arange(n0 + n_masks, device=self.device)

        def update(st: DecodeState, logits: torch.Tensor) -> None:
            active = ~st.done
            st.cache_len.fill_(n0 - 1)  # the last prompt row plays the role of `last` when emitting
            u = self.uniforms(st)
            first = self.sample_token(logits[n0 - 1], u)
            a = emit(st, first[None], torch.ones((), dtype=torch.int64, device=self.device))
            st.assign(active, nfe=st.nfe + 1)
            if n_masks:
                retain(st, *self.propose(logits[n0:], u), a, active)

        def update_native(st: DecodeState, logits: torch.Tensor) -> None:
            st.cache_len.fill_(n0 - 1)
            rows = self.epilogue.rows(logits[n0 - 1:])     # the last prompt row, then the W+1 mask rows
            self.epilogue.step(st, token=rows[:1], propose=rows[1:] if n_masks else None,
                               retain="a" if n_masks else None)

        return Step(lay, lambda st: (tokens, positions), self.pick(update, update_native))

    def sample_token(self, logits: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
        """One AR token from a single row of logits, drawn with u[0]."""
        if self.params.greedy:
            return logits.argmax(-1)
        return sample_sparse(*truncated_probs(logits, self.params), u[0])
