"""What every left-to-right schedule shares: its state, its layouts, and the prefill call."""
from __future__ import annotations

import torch

from ...model.attention import Layout
from ...runtime import ModelInput, Request, Step
from ...runtime.program import Program
from ...runtime.staging import staged
from ..epilogue import Epilogue
from ..lookup import CONTEXT, drafts_by_lookup
from ..state import DecodeState, q_dtype

DRAFT_SOURCES = ("diffusion", "lookup", "both")


def layout(device, n_anchor: int, scratch_seg=(), scratch_see=()) -> Layout:
    """Anchors 0..n_anchor-1 (causal, cached) followed by scratch rows with the given seg / see.

    Left to right, every scratch row drafts (a proposal region, a draft call, a branch, the prefill's masks),
    so the drafting adapter applies from the first scratch row on."""
    seg = torch.tensor([0] * n_anchor + list(scratch_seg), dtype=torch.int64)
    see = torch.tensor(list(range(n_anchor)) + list(scratch_see), dtype=torch.int64)
    return Layout(n_anchor, seg, see, n_anchor if len(seg) > n_anchor else None).to(device)


class Schedule(Program):
    """A decoding schedule, the program the runtime drives: `prefill(*prompts)`, then `steps` until done.

    Subclasses set `name`, `proposes` (whether its calls draft by diffusion, the prefill's W+1 positions too) and
    `steps`; each step builds one input [B, R] for the whole batch and ends in one call of the epilogue on its
    logits [B, R, V] (torch or native: the same calls, the same tokens), then, if it chose the next draft,
    in `redraft`. `sampled`: whether its requests sample, each with its own settings (the batch state's
    `sampling`), or decode greedily. `draft_source`: where drafts come from, "diffusion" (the model's mask rows), "lookup"
    (n-gram matches in the prompt and output, decode/lookup.py: no draft without a match) or "both" (the
    lookup draft where there is a match, the diffusion proposal elsewhere); None for AR, which does not draft.
    """
    proposes = True
    # Both drafters by default, by measurement (bench/RESULTS.md, "Two drafters"): on HumanEval the shipped
    # model's greedy Packed-SS runs 3.9x AR with both against 1.2x with diffusion drafts alone, and at T = 1,
    # where lookup drafts are rarely accepted, costs about 7% at the same width.
    draft_sources = ("both", "diffusion", "lookup")

    def __init__(self, model, width: int, sampled: bool, epilogue: Epilogue, draft_source: str | None = "diffusion"):
        self.model, self.width, self.sampled, self.epilogue = model, width, sampled, epilogue
        self.draft_source = draft_source
        self.looks_up = drafts_by_lookup(draft_source)
        self.block = width + 1                 # the most tokens one iteration emits
        self.reserve = 2 * self.block          # cache slots a call may write past the output
        self.device = model.device
        self.mask_id = model.cfg.mask_token_id
        self.mask_row = self.masks(width) if self.proposes else None
        self.steps: list[Step] = []

    def masks(self, n: int) -> torch.Tensor:
        return torch.full((n,), self.mask_id, dtype=torch.int64, device=self.device)

    @staticmethod
    def input_at(st: DecodeState, tokens: torch.Tensor, offsets: torch.Tensor, layout: Layout) -> ModelInput:
        """The batch's rows `tokens` [B, R] at positions cache_len + offsets, over each request's cache."""
        return ModelInput(tokens, st.cache_len[:, None] + offsets, layout, st.cache_len)

    def masks_for(self, st: DecodeState) -> torch.Tensor:
        """MASK^W for every request: [B, W]."""
        return self.mask_row.expand(st.batch, -1)

    def new_state(self, request: Request, out_len=None, stop_slots=None, sequence_slots=None,
                  device=None) -> DecodeState:
        """A request's fresh state (on `device`, default the model's; admission builds it on the host).
        One-token stop sequences join the stop ids; longer ones are matched after emit (stop_at_sequences).
        Sampled, the stored Q is dense: its token ids (idx = token, which retaining proposals keeps) are written
        once, so that a draft's Q is a write of its probabilities alone."""
        stop_ids = set(request.stop_ids) | {s[0] for s in request.stop_sequences if len(s) == 1}
        sequences = [s for s in request.stop_sequences if len(s) > 1]
        support = self.model.cfg.vocab_size if self.sampled else 1
        st = DecodeState.new(self.width, support, request.max_new_tokens, stop_ids, request.seed,
                             device or self.device, out_len, stop_slots, sequences, sequence_slots,
                             len(request.prompt), q_dtype(self.model), request.prompt if self.looks_up else (),
                             CONTEXT if self.looks_up else 0, request.params)
        return st

    def redraft(self, st: DecodeState) -> None:
        """After a step that chose the next draft: the lookup continuation of the verified sequence replaces it
        where one is found ("both"), or is the only draft ("lookup"); a lookup draft's Q is a point mass."""
        if not self.looks_up:
            return
        draft, length, order = self.epilogue.lookup_draft(st, self.width)
        everyone, no_one = torch.ones_like(st.done), torch.zeros_like(st.done)
        keep = everyone if self.draft_source == "both" else no_one
        self.epilogue.take_lookup(st, draft, length, order, preferred=everyone, keep=keep, passive=no_one,
                                  point_mass=self.sampled)

    # -- the first call: prompt (causal, cached) plus W+1 masks (paper E.2) ---------------------------
    def prefill(self, *prompts: torch.Tensor, cached=None) -> Step:
        """The first call of requests admitted together, one row of [prompt, MASK^(W+1)] each: a prompt's
        last row draws its first token, its W+1 mask rows, which see that prompt alone, draft its first block.
        Prompts shorter than the longest are padded after their end with anchors whose K/V land in cache
        slots no later call sees (the cache length stops at the prompt), so a request's rows compute what they
        compute alone. `cached` (ints, default 0): how many tokens of each prompt its cache holds already
        (the chunks of a long prompt, `Runtime.prefix`); `prompts` (host tensors) are then what follows them.
        Built on the host and staged (runtime/staging.py): admission does not wait for the device."""
        cached = torch.tensor(cached or [0] * len(prompts), dtype=torch.int64)
        lengths = torch.tensor([p.numel() for p in prompts])
        n, n_masks = max(p.numel() for p in prompts), self.block if self.proposes else 0
        pad = self.mask_id if self.mask_id is not None else 0     # any token: no later call sees it
        fill = lambda k: torch.full((k,), pad, dtype=torch.int64)                   # noqa: E731
        tokens = torch.stack([torch.cat([p, fill(n - p.numel()), fill(n_masks)]) for p in prompts])
        anchors, masks = torch.arange(n), torch.arange(n_masks)
        positions = cached[:, None] + torch.cat([anchors.expand(len(prompts), -1), lengths[:, None] + masks], 1)
        see = torch.cat([anchors.expand(len(prompts), -1), (lengths - 1)[:, None].expand(-1, n_masks)], 1)
        seg = torch.tensor([0] * n + [1] * n_masks)
        rows = torch.cat([(lengths - 1)[:, None], n + masks.expand(len(prompts), -1)], 1)   # [B, 1 + n_masks]
        tokens, positions, see, seg, rows, cached, ends = (
            staged(t, self.device) for t in (tokens, positions, see, seg, rows, cached, cached + lengths - 1))
        lay = Layout(n, seg, see, n if n_masks else None)

        def update(st: DecodeState, logits: torch.Tensor) -> None:
            st.cache_len.copy_(ends)          # the last prompt row plays the role of `last` when emitting
            ours = self.epilogue.rows(logits, st.sampling)
            self.epilogue.step(st, token=ours[:1], propose=ours[1:] if n_masks else None,
                               retain="a" if n_masks else None)
            self.redraft(st)

        return Step(lambda st: ModelInput(tokens, positions, lay, cached, rows), update)
