"""What the runtime drives: a program's steps, each one model call and an in-place state update.

A *program* is a schedule bound to a model, width, epilogue and whether its requests sample (each request's
settings are rows of the state): a `Program` (below; the
schedules of both decode orders derive from it, and a wrapper such as decode/shared_noise.SharedNoise offers
the same attributes). Its state is a dataclass of device tensors, each with a leading batch dimension (a row
per request: `new_state` makes a batch of one, `DeviceState.cat` stacks them), with at least `done`, `n_out`,
`out` (out[b, :n_out[b]] is final output), `nfe`, `n_verify`, `n_accepted`, `n_bonus`, `accepted_at` [B, W]
(verifications that accepted draft position k, kept by `Step.fold`), and may have `hold` (set by a step when
the host must run `program.resume` before the next iteration). Steps are fixed-shape, read nothing on the host,
build their input from the state alone, and change nothing once the state is done (or held). The host polls after the last step of every iteration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from ..model.attention import Layout
from .request import Request


class ModelInput(NamedTuple):
    tokens: torch.Tensor      # [B, R] int64, a row of R per request
    positions: torch.Tensor   # [B, R] int64
    layout: Layout            # shared by the batch; n_anchor static, seg / see device tensors
    cache_len: torch.Tensor   # [B] int64: valid cache slots before the call; anchors go to cache_len + i
    logit_rows: torch.Tensor | None = None    # [B, K] int64: the rows whose logits the call returns (None: all);
    #                                           a layout's drafting rows, if any, all of them and last


@dataclass
class Step:
    """One model call: how to build its input from the state, and how to fold its logits back in."""
    inputs: Callable[[Any], ModelInput]
    update: Callable[[Any, torch.Tensor], None]

    def fold(self, st, logits: torch.Tensor) -> None:
        """`update`, then the acceptance per draft position of the verification it made, if any (a step
        verifies at most once per request): every epilogue counts the accepted draft tokens, and this turns
        the step's increment into `accepted_at` (vLLM's accepted tokens per position)."""
        before = st.n_accepted.clone()
        self.update(st, logits)
        positions = torch.arange(st.accepted_at.shape[1], device=before.device)
        st.accepted_at.add_(positions < (st.n_accepted - before)[:, None])


class Program:
    """The interface the runtime drives, with the defaults a schedule keeps unless it says otherwise.

    `block`: the most tokens one iteration adds to the output; `reserve`: the cache positions a call may write
    past the output; `steps`: one iteration; `entry`: the step a request's first iteration starts at (Linear-SS:
    its prefill drafted already); `max_batch`: how many requests may share a batch (None: no limit of its own);
    `cache_in_order`: whether committed cache position len(prompt) + i holds output token i (the prefix cache
    publishes outputs only then); `policy`: the policy that picks each iteration's call shape among `shapes`
    (decode/policy.py; None: one shape, `steps`). What the engine checks before building one: `draft_sources`,
    where its drafts may come from (checks.check_drafts), its default first (none: it does not draft);
    `proposes`, whether its calls feed the model mask rows whatever the source (so it needs a drafting mode);
    and `replay`, the acceptance profile's replay that predicts its tokens per iteration (width.profile_kind;
    None: no profile picks its width)."""
    name = ""
    draft_sources: tuple[str, ...] = ()
    proposes = False
    replay: str | None = None
    block: int
    reserve: int
    steps: list[Step]
    entry = 0
    max_batch: int | None = None
    cache_in_order = True
    policy = None

    @property
    def shapes(self) -> list[list[Step]]:
        """The call shapes an iteration may take, each its list of steps."""
        return [self.steps]

    def new_state(self, request: Request, out_len: int | None = None, stop_slots: int | None = None,
                  sequence_slots: tuple[int, int] | None = None, device=None):
        """A request's fresh state, a batch of one (on `device`, default the model's; admission builds it on the
        host), with room for `out_len` tokens and the stop tables' shapes of the batch it joins."""
        raise NotImplementedError

    def prefill(self, *prompts: torch.Tensor, cached: list[int] | None = None) -> Step:
        """The first call of requests admitted together, their fresh states stacked (`cached`: the prompt tokens
        each one's cache holds already; `prompts` are what follows them)."""
        raise NotImplementedError

    def resume(self, st, call: Callable[[ModelInput], torch.Tensor]) -> None:
        """A held request's next iteration, run by the host (`call`: the model on its cache)."""
        raise RuntimeError(f"{type(self).__name__} never holds a request")

    def finish(self, st, fetch: Callable[[torch.Tensor], list]) -> dict:
        """What a finished request's result carries besides the counts and output (GenerateResult's fields)."""
        return {}


def call_layouts(program) -> list[Layout]:
    """The layouts of one decode iteration's calls, in call order, of a program (a schedule bound by
    `Engine.program`). Calls take their inputs from a decoding state; the layouts do not depend on it."""
    state = program.new_state(Request(prompt=[0], max_new_tokens=1, seed=0, stop_ids=[], stop_sequences=[]))
    return [step.inputs(state).layout for step in program.steps]
