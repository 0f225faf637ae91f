"""The adaptive schedule's bet: what each draft source earns for each request, and the call shape to run next.

A shape is one model call of fixed layout over the batch (schedules/adaptive.py): `ar` (1 row), `lookup` at
width w (the lookup draft verified alone, w + 1 causal rows) or `packed` at width w (Packed-SS with the lookup
draft where one is found and the diffusion proposal elsewhere, 2(w + 1) rows).

Per request, on the device, in the state (`AdaptiveState`):
- `look_hit` [B, W]: how often lookup draft token k is right, given a draft (a running mean, weight RATE). Each
  lookup draft is scored against the tokens the request then emits (`probe`), whatever shape ran, so a
  request decoding by AR keeps learning what lookup would earn without paying a row for it. Under greedy and
  shared-noise decoding the output does not depend on the draft, so this is exactly what verifying it accepts.
- `diffusion` [B, P]: tokens per iteration of each packed shape while it verifies diffusion drafts (a running
  mean, from its own runs once they are steady: the shape ran the iteration before too). Between runs it drifts
  back to the prior (DRIFT per iteration), so a request that left diffusion drafts tries them again at a
  bounded rate.
The next shape maximises the batch's expected tokens per unit of cost: the sum over live requests of the
expected tokens of each shape, over the cost of an iteration in that shape at this batch size (`costs`: ms
at batch 1 and COST_BATCH, measured once when the engine builds the program, width.shape_costs: the inputs,
the model call and the whole update, sampling noise and this policy included; linear in the batch size
between and beyond). AR is always a candidate, and the first on a tie.
Nothing here reads a clock while decoding; the choice only changes speed, never the output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .state import DecodeState

RATE = 0.125        # weight of a new observation in a running mean
DRIFT = 1 / 32      # per iteration, how far an unobserved diffusion estimate moves back to its prior
LOOKUP_PRIOR = 0.5  # P(lookup draft token k right | a draft), per position, without a profile
KINDS = ("ar", "lookup", "packed")
COST_BATCH = 8      # the second batch size an iteration's cost is measured at (the first is 1)


@dataclass(frozen=True)
class Shape:
    kind: str       # one of KINDS
    width: int      # draft tokens verified (0 for ar)

    @property
    def rows(self) -> int:
        return {"ar": 1, "lookup": self.width + 1, "packed": 2 * (self.width + 1)}[self.kind]

    def __str__(self) -> str:
        return self.kind if self.kind == "ar" else f"{self.kind} W={self.width}"


def shapes_for(width: int, drafts: str) -> list[Shape]:
    """The shapes an engine of draft width `width` keeps: ar, then lookup and packed at a narrow and the full
    width (lookup shapes when `drafts` has lookup, packed ones when it has diffusion), fewest rows first."""
    widths = sorted({min(3, width), width})
    kinds = {"lookup": ["lookup"], "diffusion": ["packed"], "both": ["lookup", "packed"]}[drafts]
    shapes = [Shape("ar", 0)] + [Shape(k, w) for k in kinds for w in widths]
    return sorted(shapes, key=lambda s: (s.rows, KINDS.index(s.kind)))


@dataclass
class AdaptiveState(DecodeState):
    """DecodeState plus the policy's statistics and choice (module docstring). `probe` [B, W] / `probe_len` the
    lookup draft being scored, made when the output was `probe_at` tokens long; `lookup_draft` whether the
    current draft is a lookup draft; `ran` the shape of the last step; `shape` the next one (the status table
    carries it to the host)."""
    look_hit: torch.Tensor = None
    diffusion: torch.Tensor = None
    probe: torch.Tensor = None
    probe_len: torch.Tensor = None
    probe_at: torch.Tensor = None
    lookup_draft: torch.Tensor = None
    ran: torch.Tensor = None
    shape: torch.Tensor = None


class Policy:
    """The shapes, the per-row cost model and the priors; `observe` and `choose` run on the device after a step."""

    def __init__(self, shapes: list[Shape], lookup_prior: list[float], diffusion_prior: dict[int, float],
                 costs: list[tuple[float, float]] | None = None):
        """`costs`: ms of an iteration in each shape at batch 1 and COST_BATCH (None: proportional to its rows,
        a stand-in until measured)."""
        if shapes[0] != Shape("ar", 0):
            raise ValueError("the first shape must be AR, the one every request can fall back to")
        self.shapes = shapes
        self.costs = costs or [(float(s.rows), float(COST_BATCH * s.rows)) for s in shapes]
        self.width = max(s.width for s in shapes)
        self.lookup_prior = lookup_prior[:self.width] + [lookup_prior[-1]] * (self.width - len(lookup_prior))
        self.packed = [i for i, s in enumerate(shapes) if s.kind == "packed"]
        self.diffusion_prior = [diffusion_prior[shapes[i].width] for i in self.packed]
        self._device: dict[torch.device, tuple] = {}

    def measured(self, costs: list[tuple[float, float]]) -> "Policy":
        """This policy with measured iteration costs."""
        widths = (self.shapes[i].width for i in self.packed)
        return type(self)(self.shapes, self.lookup_prior, dict(zip(widths, self.diffusion_prior)), costs)

    @classmethod
    def from_profile(cls, shapes: list[Shape], profile: dict | None) -> "Policy":
        """Priors from an acceptance profile (width.py): lookup's per-position rate from its "lookup" replay
        (tokens per iteration by width), diffusion's tokens per iteration from its "lagged" one; fixed guesses
        without one."""
        width = max(s.width for s in shapes)
        lookup = (profile or {}).get("lookup")
        per_position = ([b - a for a, b in zip([1.0] + lookup, lookup)] if lookup
                        else [LOOKUP_PRIOR ** (k + 1) for k in range(width)])
        lagged = (profile or {}).get("lagged")
        diffusion = {s.width: (lagged[min(s.width, len(lagged)) - 1] if lagged else 1.5)
                     for s in shapes if s.kind == "packed"}
        return cls(shapes, [max(p, 0.0) for p in per_position], diffusion)

    def constants(self, device) -> tuple[torch.Tensor, ...]:
        """(costs [S, 2], lookup prior [W], diffusion prior [P]) on `device`, made once per device (no transfer
        inside a step)."""
        device = torch.device(device)
        if device not in self._device:
            self._device[device] = (
                torch.tensor(self.costs, dtype=torch.float32, device=device),
                torch.tensor(self.lookup_prior, dtype=torch.float32, device=device),
                torch.tensor(self.diffusion_prior, dtype=torch.float32, device=device))
        return self._device[device]

    def new_state(self, base: DecodeState) -> AdaptiveState:
        """A request's fresh state: `base` with the statistics at their priors and no probe."""
        device = base.done.device
        _, lookup_prior, diffusion_prior = self.constants(device)
        zero = torch.zeros_like(base.n_out)
        return AdaptiveState(**base.tensors(), look_hit=lookup_prior[None].clone(),
                             diffusion=diffusion_prior[None].clone(), probe=torch.zeros_like(base.draft),
                             probe_len=zero.clone(), probe_at=zero.clone(),
                             lookup_draft=torch.zeros_like(base.done), ran=zero.clone(), shape=zero.clone())

    # -- after a step ------------------------------------------------------------------------------------------
    def score_lookup(self, st: AdaptiveState, draft: torch.Tensor, length: torch.Tensor, found: torch.Tensor) -> None:
        """Score the probe against the tokens emitted since it was made; once it is settled (a miss seen, or
        every token compared), fold it into look_hit and probe the new lookup draft (`draft`, `length`, `found`)."""
        active = ~st.done
        k = torch.arange(self.width, device=draft.device)
        compared = torch.minimum(st.n_out - st.probe_at, st.probe_len)
        seen = st.out.gather(1, (st.probe_at[:, None] + k).clamp(max=st.out.shape[1] - 1))
        right = ((seen == st.probe) & (k < compared[:, None])).long().cumprod(1).sum(1)
        settled = (right < compared) | (compared >= st.probe_len)
        observed = (settled & (st.probe_len > 0))[:, None] & (k < st.probe_len[:, None])
        hit = (k < right[:, None]).to(st.look_hit.dtype)
        st.assign(active, look_hit=torch.where(observed, st.look_hit + RATE * (hit - st.look_hit), st.look_hit))
        st.assign(active & settled, probe=draft, probe_len=torch.where(found, length, 0), probe_at=st.n_out)

    def observe(self, st: AdaptiveState, ran: int, emitted: torch.Tensor, verified_lookup: torch.Tensor) -> None:
        """After shape `ran` emitted `emitted` [B] tokens: a steady packed run that verified a diffusion draft
        updates its estimate; every other estimate drifts back to its prior."""
        _, _, prior = self.constants(st.diffusion.device)
        observed = torch.zeros_like(st.diffusion, dtype=torch.bool)
        if ran in self.packed:
            j = self.packed.index(ran)
            steady = (st.ran == ran) & ~verified_lookup
            observed[:, j] = steady
        updated = st.diffusion + RATE * (emitted[:, None].to(st.diffusion.dtype) - st.diffusion)
        drifted = st.diffusion + DRIFT * (prior - st.diffusion)
        st.assign(~st.done, diffusion=torch.where(observed, updated, drifted), ran=torch.full_like(st.ran, ran))

    def expected(self, st: AdaptiveState, length: torch.Tensor, found: torch.Tensor) -> torch.Tensor:
        """Expected tokens [B, S] of each request's next iteration in each shape, given its next lookup draft
        (`length`, `found`)."""
        k = torch.arange(self.width, device=length.device)
        gain = 1 + (st.look_hit * (k < length[:, None])).cumsum(1)                        # [B, W]: by width
        columns = []
        for i, s in enumerate(self.shapes):
            if s.kind == "ar":
                columns.append(torch.ones_like(gain[:, 0]))
                continue
            lookup = torch.where(found, gain[:, s.width - 1], 1.0)
            columns.append(lookup if s.kind == "lookup" else
                           torch.where(found, lookup, st.diffusion[:, self.packed.index(i)]))
        return torch.stack(columns, 1)

    def choose(self, st: AdaptiveState, length: torch.Tensor, found: torch.Tensor) -> None:
        """The next shape for the whole batch (every row of `shape`): the most expected tokens per ms at this
        batch size."""
        costs, _, _ = self.constants(length.device)
        tokens = (self.expected(st, length, found) * (~st.done)[:, None]).sum(0)          # [S]
        cost = costs[:, 0] + (costs[:, 1] - costs[:, 0]) * ((st.batch - 1) / (COST_BATCH - 1))
        st.shape.copy_((tokens / cost).argmax().expand_as(st.shape))
