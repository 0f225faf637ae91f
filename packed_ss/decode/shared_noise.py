"""Shared-noise sampling (Gumbel-max; ../shared/DESIGN.md §12): the sampled request as a greedy one on scores.

AR sampling by Gumbel-max draws output token j as argmax_x (log p_j(x) + g(seed, j, x)), p_j the target after
temperature, top-k and top-p, g standard Gumbel noise keyed by the request's seed, the output position j and
the token: exactly a sample from p_j. It is computed as the exponential race argmax_x p_j(x) / E(seed, j, x),
E = exp(-g) standard exponential noise (sampling.exponential_noise; one logarithm per token). A drafter that proposes with the same noise,
argmax_x (log q_j(x) + g(seed, j, x)), and a verifier that accepts a draft token when it equals its own
perturbed argmax make every schedule emit exactly that AR sample, by the greedy induction: the same tokens
whatever the schedule, width, batch slot or drafter (drafter-invariant speculative decoding: Daliri, Musco
and Suresh, arXiv 2408.07978). A position's noise decides only the token kept there, so the output follows
the AR distribution; drafts agree with the target with probability at least (1 - TV) / (1 + TV).

So a program decodes under this rule as its greedy self, every call's logits replaced by the perturbed
scores: nothing is stored for a draft but its token (no Q), verification is the greedy comparison, and
either epilogue runs unchanged. Which output position a row's logits predict follows from the call: a causal
anchor at position t predicts the token at t + 1, a mask row (scratch rows: drafts, any-order queries) the
token at its own position; output token j sits at position prompt_len + j.
"""
from __future__ import annotations

import torch

from ..runtime import ModelInput, Step
from .epilogue import NativeEpilogue
from .epilogue.operator import noise_race
from . import sampling
from .sampling import Sampling, truncated_probs

DRAFT_SUPPORT = 64     # the drafter's likeliest tokens its shared-noise race ranks (draft_tokens)


def torch_race(seed: torch.Tensor, position: torch.Tensor, prob: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    """The shared-noise sample of every row of prob [B, R, K] (the truncated target; idx [B, R, K] its tokens, or
    None: dense), keyed by (seed [B], position [B, R]): the token of the first entry of largest p / E (torch
    ops; the native module's is the operator noise_race, the same up to the logarithm's last bit)."""
    tokens = idx if idx is not None else torch.arange(prob.shape[-1], device=prob.device).expand(prob.shape)
    score = prob.to(torch.float64) / sampling.exponential_noise(seed[:, None].expand_as(position), position, tokens)
    return tokens.gather(-1, score.argmax(-1, keepdim=True))[..., 0]


def target_tokens(logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, settings: Sampling,
                  race=torch_race) -> torch.Tensor:
    """The shared-noise samples [B, R] of target rows logits [B, R, V] at output positions `position`: the token
    of largest p(x) / E(seed, j, x) over p truncated as the target is, with each request's `settings` [B]."""
    return race(seed, position, truncated_probs(logits, settings), None)


def draft_tokens(logits: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, settings: Sampling,
                 race=torch_race) -> torch.Tensor:
    """The drafter's proposals [B, R] from drafting rows: the same race over its DRAFT_SUPPORT likeliest tokens
    (after temperature; at temperature 0 its argmax) only. Any drafter keeps the output exact here (a draft is
    accepted when it equals the target's own sample), so the drafter skips the target's truncation and ranks a
    few tokens, not the vocabulary."""
    vals, idx = logits.topk(min(DRAFT_SUPPORT, logits.shape[-1]), -1)
    vals = vals.to(torch.promote_types(vals.dtype, torch.float32))
    temperature = settings.temperature.to(vals.dtype)[:, None, None]
    prob = torch.softmax(vals / torch.where(temperature > 0, temperature, 1.0), -1)
    argmax = (torch.arange(prob.shape[-1], device=prob.device) == 0).to(prob.dtype)       # idx is in order
    return race(seed, position, torch.where(temperature > 0, prob, argmax), idx)


def perturbed_scores(logits: torch.Tensor, inp: ModelInput, seed: torch.Tensor, prompt_len: torch.Tensor,
                     settings: Sampling, race=torch_race) -> torch.Tensor:
    """Scores for every row of logits [B, R, V] of the call `inp` whose argmax is the row's shared-noise sample
    (one-hot): the token of largest p(x) / E(seed, j, x), j the output position the row predicts, E standard
    exponential noise, p truncated as the target is (target_tokens) on the rows before the layout's drafting
    rows, the drafter's few likeliest tokens on those (draft_tokens): argmax_x (log p(x) + g(x)) with
    g = -log E Gumbel noise."""
    rows = logits.shape[1]
    causal = torch.arange(rows, device=logits.device) < inp.layout.n_anchor
    position = (inp.positions + causal - prompt_len[:, None]).clamp(min=0)                 # [B, R]
    split = rows if inp.layout.draft_from is None else inp.layout.draft_from
    tokens = target_tokens(logits[:, :split], seed, position[:, :split].contiguous(), settings, race)
    if split < rows:
        drafts = draft_tokens(logits[:, split:], seed, position[:, split:].contiguous(), settings, race)
        tokens = torch.cat([tokens, drafts], 1)
    return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, tokens[..., None], 1.0)


class SharedNoise:
    """A greedy program (schedule, epilogue, state without Q) whose requests sample, each with its own settings (the
    state's `sampling`), by shared noise: each of its calls' logits become `perturbed_scores` before the step's
    update. Everything else is the program's. The noise comes from the native module with the native epilogue
    (csrc/noise.h), from torch ops otherwise."""

    def __init__(self, program):
        if program.sampled:
            raise ValueError("shared-noise sampling runs a greedy program")
        self.program = program
        self.race = noise_race if isinstance(program.epilogue, NativeEpilogue) else torch_race
        self.shapes = [[self.perturbed(step) for step in steps] for steps in program.shapes]
        self.steps = self.shapes[0]

    def __getattr__(self, name):
        return getattr(self.program, name)

    def scores(self, st, inp: ModelInput, logits: torch.Tensor) -> torch.Tensor:
        return perturbed_scores(logits, inp, st.seed, st.prompt_len, st.sampling, self.race)

    def perturbed(self, step: Step) -> Step:
        """The step with its logits perturbed; the rows' positions are those of the step's input, built again from
        the state (a step's input is a function of the state, which the model call leaves as it was)."""
        return Step(step.inputs, lambda st, logits: step.update(st, self.scores(st, step.inputs(st), logits)))

    def prefill(self, *prompts: torch.Tensor, cached=None) -> Step:
        return self.perturbed(self.program.prefill(*prompts, cached=cached))

    def resume(self, st, call) -> None:
        self.program.resume(st, lambda inp: self.scores(st, inp, call(inp)))
