"""Shared-noise sampling (../shared/DESIGN.md §12): the sampled request as a greedy one on its draws.

AR sampling draws output token j from p_j, the target after temperature, top-k and top-p, with noise keyed by
the request's seed and the output position j alone. Two couplings of that noise (the `sampler`):
- "gumbel", Gumbel-max: argmax_x (log p_j(x) + g(seed, j, x)), g standard Gumbel noise keyed by the token too,
  computed as the exponential race argmax_x p_j(x) / E(seed, j, x), E = exp(-g) standard exponential noise
  (sampling.exponential_noise; one logarithm per token). Drafts agree with the target with probability at
  least (1 - TV) / (1 + TV).
- "inverse-cdf": the token where p_j's cumulative mass in token order first exceeds u(seed, j) of its total,
  u = sampling.philox_uniform(seed, j)[0]: the rejection rule's own AR draw (sampling.inverse_cdf), so a
  request writes the text of schedule="ar" under the rejection sampler. One uniform a row, not one per token.
Either is exactly a sample from p_j. A drafter that proposes with the same noise (its own q_j in place of p_j)
and a verifier that accepts a draft token when it equals its own draw make every schedule emit exactly that AR
sample, by the greedy induction: the same tokens whatever the schedule, width, batch slot or drafter
(drafter-invariant speculative decoding: Daliri, Musco and Suresh, arXiv 2408.07978). A position's noise
decides only the token kept there, so the output follows the AR distribution.

So a program decodes under this rule as its greedy self, every call's logits replaced by scores whose argmax is
the row's draw: nothing is stored for a draft but its token (no Q), verification is the greedy comparison, and
either epilogue runs unchanged. Which output position a row's logits predict follows from the call: a causal
anchor at position t predicts the token at t + 1, a mask row (scratch rows: drafts, any-order queries) the
token at its own position; output token j sits at position prompt_len + j.
"""
from __future__ import annotations

import torch

from ..runtime import ModelInput, Step
from .epilogue import NativeEpilogue
from .epilogue.operator import noise_inverse_cdf, noise_race
from . import sampling
from .sampling import Sampling, truncated_probs

DRAFT_SUPPORT = 64     # the drafter's likeliest tokens its shared-noise draw ranks (draft_tokens)


def torch_race(seed: torch.Tensor, position: torch.Tensor, prob: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    """The shared-noise sample of every row of prob [B, R, K] (the truncated target; idx [B, R, K] its tokens, or
    None: dense), keyed by (seed [B], position [B, R]): the token of the first entry of largest p / E (torch
    ops; the native module's is the operator noise_race, the same up to the logarithm's last bit)."""
    tokens = idx if idx is not None else torch.arange(prob.shape[-1], device=prob.device).expand(prob.shape)
    score = prob.to(torch.float64) / sampling.exponential_noise(seed[:, None].expand_as(position), position, tokens)
    return tokens.gather(-1, score.argmax(-1, keepdim=True))[..., 0]


def torch_inverse_cdf(seed: torch.Tensor, position: torch.Tensor, prob: torch.Tensor,
                      idx: torch.Tensor | None) -> torch.Tensor:
    """The inverse-CDF draw of every row of prob [B, R, K] (idx as torch_race's), keyed by (seed [B], position
    [B, R]): sampling.inverse_cdf of the row in token order with the uniform philox_uniform(seed, position)[0]
    (torch ops; the native module's is the operator noise_inverse_cdf, the same up to a sum's last bit)."""
    if idx is not None:
        idx, order = idx.sort(-1)
        prob = prob.gather(-1, order)
    u = sampling.philox_uniform(seed[:, None].expand_as(position).reshape(-1), position.reshape(-1), 1)
    j = sampling.inverse_cdf(prob, u[:, 0].view(position.shape))
    return j if idx is None else idx.gather(-1, j[..., None])[..., 0]


DRAWS = {"gumbel": (torch_race, noise_race), "inverse-cdf": (torch_inverse_cdf, noise_inverse_cdf)}  # torch, native


def target_tokens(logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, settings: Sampling,
                  draw=torch_race) -> torch.Tensor:
    """The shared-noise samples [B, R] of target rows logits [B, R, V] at output positions `position`: the draw
    `draw` (one of DRAWS) makes from p truncated as the target is, with each request's `settings` [B]."""
    return draw(seed, position, truncated_probs(logits, settings), None)


def draft_tokens(logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, settings: Sampling,
                 draw=torch_race) -> torch.Tensor:
    """The drafter's proposals [B, R] from drafting rows: the same draw over its DRAFT_SUPPORT likeliest tokens
    (after temperature; at temperature 0 its argmax) only. Any drafter keeps the output exact here (a draft is
    accepted when it equals the target's own sample), so the drafter skips the target's truncation and ranks a
    few tokens, not the vocabulary."""
    vals, idx = logits.topk(min(DRAFT_SUPPORT, logits.shape[-1]), -1)
    vals = vals.to(torch.promote_types(vals.dtype, torch.float32))
    temperature = settings.temperature.to(vals.dtype)[:, None, None]
    prob = torch.softmax(vals / torch.where(temperature > 0, temperature, 1.0), -1)
    argmax = (torch.arange(prob.shape[-1], device=prob.device) == 0).to(prob.dtype)       # idx is in order
    return draw(seed, position, torch.where(temperature > 0, prob, argmax), idx)


def perturbed_scores(logits: torch.Tensor, inp: ModelInput, seed: torch.Tensor, prompt_len: torch.Tensor,
                     settings: Sampling, draw=torch_race) -> torch.Tensor:
    """Scores for every row of logits [B, K, V] of the call `inp` (its rows, or its `logit_rows`) whose argmax is
    the row's shared-noise sample (one-hot): what `draw` makes at j, the output position the row predicts, from p
    truncated as the target is (target_tokens) on the rows before the layout's drafting rows, from the drafter's
    few likeliest tokens on those (draft_tokens)."""
    call_rows = inp.positions.shape[1]
    if inp.logit_rows is None:
        row, positions = torch.arange(call_rows, device=logits.device), inp.positions
    else:
        row, positions = inp.logit_rows, inp.positions.gather(1, inp.logit_rows)
    position = (positions + (row < inp.layout.n_anchor) - prompt_len[:, None]).clamp(min=0)
    drafting = 0 if inp.layout.draft_from is None else call_rows - inp.layout.draft_from   # the last rows read
    split = logits.shape[1] - drafting
    tokens = target_tokens(logits[:, :split], seed, position[:, :split].contiguous(), settings, draw)
    if drafting:
        drafts = draft_tokens(logits[:, split:], seed, position[:, split:].contiguous(), settings, draw)
        tokens = torch.cat([tokens, drafts], 1)
    return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, tokens[..., None], 1.0)


class SharedNoise:
    """A greedy program (schedule, epilogue, state without Q) whose requests sample, each with its own settings (the
    state's `sampling`), by shared noise coupled as `coupling` (a key of DRAWS): each of its calls' logits become
    `perturbed_scores` before the step's update. Everything else is the program's. The draws come from the native
    module with the native epilogue (csrc/noise.h; the inverse CDF on the CPU), from torch ops otherwise."""

    def __init__(self, program, coupling: str):
        if program.sampled:
            raise ValueError("shared-noise sampling runs a greedy program")
        if coupling not in DRAWS:
            raise ValueError(f"coupling must be one of {tuple(DRAWS)}, got {coupling!r}")
        self.program = program
        torch_draw, native_draw = DRAWS[coupling]
        native = isinstance(program.epilogue, NativeEpilogue) and \
            (coupling == "gumbel" or program.epilogue.device.type == "cpu")   # no CUDA inverse CDF: torch's there
        self.draw = native_draw if native else torch_draw
        self.shapes = [[self.perturbed(step) for step in steps] for steps in program.shapes]
        self.steps = self.shapes[0]

    def __getattr__(self, name):
        return getattr(self.program, name)

    def scores(self, st, inp: ModelInput, logits: torch.Tensor) -> torch.Tensor:
        return perturbed_scores(logits, inp, st.seed, st.prompt_len, st.sampling, self.draw)

    def perturbed(self, step: Step) -> Step:
        """The step with its logits perturbed; the rows' positions are those of the step's input, built again from
        the state (a step's input is a function of the state, which the model call leaves as it was)."""
        return Step(step.inputs, lambda st, logits: step.update(st, self.scores(st, step.inputs(st), logits)))

    def prefill(self, *prompts: torch.Tensor, cached=None) -> Step:
        return self.perturbed(self.program.prefill(*prompts, cached=cached))

    def resume(self, st, call) -> None:
        self.program.resume(st, lambda inp: self.scores(st, inp, call(inp)))
