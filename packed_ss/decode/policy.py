"""The adaptive schedule's bet: what each draft source earns for each request, and the call shape to run next.

A shape is one model call of fixed layout over the batch (schedules/adaptive.py), named by the draft tokens it
verifies (w) and the mask rows it proposes from (m): `ar` (w = m = 0, one row), `lookup` (m = 0: the lookup draft
verified alone, w + 1 causal rows) or `packed` (Packed-SS: w + 1 verifier rows, the lookup draft where one is
found, else the proposals the last packed call retained, and m + 1 proposal rows). The shapes an engine keeps
are closed under the widest of two (`cover`), so that requests that chose different shapes share one call.

Per request, on the device, in the state (`AdaptiveState`):
- `look_hit` [B, N + 1, W]: how often lookup draft token k is right, given a draft that follows a match of n
  tokens (its order, row n; lookup.py tries N = max(NGRAMS) down to 1), and in row 0 given any draft, a running
  mean of weight RATE. The order tells a lot: on SmolLM2's greedy HumanEval outputs a draft after a 4-token
  match had its first token right 91% of the time and 5.9 of 8 on average, after a 1-token match 28% and 1.0
  (bench/lookup_orders.py). Each lookup draft is scored against the tokens the request then emits (`probe`),
  whatever shape ran, so a request decoding by AR keeps learning what lookup would earn without paying a row for
  it. Under greedy and shared-noise decoding the output does not depend on the draft, so this is exactly what
  verifying it accepts.
- `look_order` [B, N + 1]: how often a lookup finds a match of each order (row 0: none), a running mean of weight
  RATE, from a longest match every time.
- `diffusion` [B, P]: tokens per iteration of each packed shape while it verifies diffusion drafts (a running
  mean, from its own runs once they are steady: the shape ran the iteration before too). Between runs it drifts
  back to the prior (DRIFT per iteration), so a request that left diffusion drafts tries them again at a
  bounded rate.
Two ways to choose, by what the output may depend on:
- free (greedy, and sampling under shared noise, where a request's tokens do not depend on the shapes): the
  batch's shape maximises what it earns per unit of cost, the expected tokens of the live requests in each
  shape, each gained token valued by the calls it saves (`batch_tokens`: while requests wait for a slot, a
  share of a call; else a row, and the whole call only for the least any request gains), over the cost of an
  iteration in that shape at this batch size (`costs`: ms at batch 1 and COST_BATCH, measured once when the
  engine builds the program, Runtime.shape_costs: inputs, model call and the whole update, sampling and this
  policy included; linear in the batch size between and beyond);
- per request (the rejection sampler, whose drafts and draws depend on the width): each request picks its own
  shape from its own statistics and the costs at COST_BATCH, priced as the one request of a full batch that
  speculates (`marginal`: the whole batch pays for the cover of the choices; the costs are fixed when the engine
  starts, so a request alone bets like one in a batch), so its tokens depend on its own tokens and draws alone
  (the greedy requests of such a batch, whose tokens depend on nothing of the kind, choose freely among themselves);
  the call runs the cover of the live requests' shapes, every request verifying within its own width and
  keeping proposals only if its shape proposes. A request whose shape the call does not cover (the host's
  choice runs an iteration late on CUDA) sits that iteration out, unchanged.
AR is always a candidate, and wins unless a shape promises MARGIN more tokens per ms (the costs are measured on a
machine that may be busy, and a wrong bet costs more than a missed one).
Quiet periods: a request whose own best shape is AR (per request; free, when the batch's is) goes quiet for
DOZE of its calls, or, while AR is its best bet for the iterations to come too (`potential`: a full lookup draft as
often as one is found), for a run of QUIET_RUNS[0] calls that doubles each time up to QUIET_RUNS[1] and falls back
once a draft could pay. Each full iteration costs more than the lean AR step (0.6 ms on the shipped model on a 2-core
CPU with the native epilogue: lookup, scoring, the choice), so a run that starts long keeps a request no draft pays
for near AR's cost.
The period ends at a call count (`quiet_until`, against the state's nfe), so nothing counts it down. A
quiet request is passive in every call: it verifies an empty draft, and nothing of its statistics, draft or choice
changes. The status table carries each request's choice and the calls it stays quiet for; when every live request
stays quiet through the next call (`next_call`, on the host) the host runs the lean AR step (shape index QUIET:
the AR call and its verification, nothing else), so that decoding at AR costs what AR costs. Whether a request is
quiet depends on its own statistics alone, so the output still depends on its own tokens and draws.
Nothing here reads a clock while decoding; the choice only changes speed, never the output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .lookup import NGRAMS, drafts_by_lookup
from .state import DecodeState

RATE = 0.125        # weight of a new observation in a running mean
DRIFT = 1 / 32      # per iteration, how far an unobserved diffusion estimate moves back to its prior
LOOKUP_PRIOR = 0.5  # P(lookup draft token k right | a draft), per position, without a profile
COST_BATCH = 8      # the second batch size an iteration's cost is measured at (the first is 1)
MARGIN = 1.1       # how much more than AR's tokens per ms another shape must promise
DOZE = 2            # a quiet period's length while a draft could still pay
QUIET_RUNS = (8, 64)  # ... while none could: the first, and the longest it doubles to
QUIET = -1          # the call shape when every live request stays quiet: the program's last


@dataclass(frozen=True)
class Shape:
    width: int          # draft tokens verified (0: ar)
    masks: int = 0      # mask rows proposing the next draft (0: no proposal region)

    @property
    def kind(self) -> str:
        return "ar" if self.width == 0 else ("lookup" if self.masks == 0 else "packed")

    @property
    def rows(self) -> int:
        return self.width + 1 + (self.masks + 1 if self.masks else 0)

    def __str__(self) -> str:
        return {"ar": "ar", "lookup": f"lookup W={self.width}", "packed": f"packed W={self.width}/{self.masks}"}[
            self.kind]


AR = Shape(0)
NARROW = 3     # the narrow width of the lookup and packed shapes


def shapes_for(width: int, drafts: str, masks: int = NARROW) -> list[Shape]:
    """The shapes an engine of draft width `width` keeps, fewest rows first: ar, lookup at a narrow and the full
    width when `drafts` has lookup, and when it has diffusion packed shapes proposing from `masks` mask rows
    (verifying as many, and with lookup drafts the full width too). Closed under `cover`."""
    narrow, masks = min(NARROW, width), min(masks, width)
    shapes = {AR}
    if drafts_by_lookup(drafts):
        shapes |= {Shape(narrow), Shape(width)}
    if drafts in ("diffusion", "both"):
        shapes |= {Shape(masks, masks)} | ({Shape(narrow, masks), Shape(width, masks)} if drafts == "both" else set())
        shapes |= {Shape(max(a.width, masks), masks) for a in set(shapes)}
    return sorted(shapes, key=lambda s: (s.rows, s.width))


@dataclass
class AdaptiveState(DecodeState):
    """DecodeState plus the policy's statistics and choice (module docstring). `probe` [B, W] / `probe_len` the
    lookup draft being scored, made when the output was `probe_at` tokens long after a match of `probe_order`
    tokens; `lookup_draft` whether the current draft is a lookup draft; `ran` the shape of the last step;
    `choice` the request's shape for the next one; `quiet_until` the call count (nfe) its quiet period ends at,
    `quiet_run` the length of its next one; `queued` whether requests wait for a slot of the batch (the same in
    every row, written by the scheduler before each iteration). The status table carries `choice` and `quiet` to
    the host."""
    look_hit: torch.Tensor = None
    look_order: torch.Tensor = None
    diffusion: torch.Tensor = None
    probe: torch.Tensor = None
    probe_len: torch.Tensor = None
    probe_at: torch.Tensor = None
    probe_order: torch.Tensor = None
    lookup_draft: torch.Tensor = None
    ran: torch.Tensor = None
    choice: torch.Tensor = None
    quiet_until: torch.Tensor = None
    quiet_run: torch.Tensor = None
    queued: torch.Tensor = None

    @property
    def passive(self) -> torch.Tensor:
        """Which requests [B] are quiet in the next call."""
        return self.nfe < self.quiet_until

    @property
    def quiet(self) -> torch.Tensor:
        """The calls [B] each request stays quiet for."""
        return (self.quiet_until - self.nfe).clamp(min=0)


class Constants(NamedTuple):
    costs: torch.Tensor             # [S, 2]: ms per iteration at batch 1 and COST_BATCH
    lookup_prior: torch.Tensor      # [W]
    diffusion_prior: torch.Tensor   # [P]
    widths: torch.Tensor            # [S]: draft tokens each shape verifies
    masks: torch.Tensor             # [S]: mask rows each shape proposes from
    packed: torch.Tensor            # [P]: the packed shapes' indices
    estimate: torch.Tensor          # [S]: a packed shape's column of the diffusion estimates (0 for the others)
    orders: torch.Tensor            # [N + 1]: 0 .. N, the rows of look_hit (0: any draft) and look_order (0: none)


class Policy:
    """The shapes, the per-row cost model and the priors; `observe`, `score_lookup` and `choose` run on the device
    after a step (through the epilogue, whose native one runs them in C++ on the CPU: csrc/policy.h)."""

    def __init__(self, shapes: list[Shape], lookup_prior: list[float], diffusion_prior: dict[Shape, float],
                 costs: list[tuple[float, float]] | None = None, per_request: bool = False):
        """`costs`: ms of an iteration in each shape at batch 1 and COST_BATCH (None: proportional to its rows,
        a stand-in until measured); `lookup_prior` one rate per draft position of the state (its width). `per_request`:
        each request chooses alone (module docstring)."""
        if shapes[0] != AR:
            raise ValueError("the first shape must be AR, the one every request can fall back to")
        if any(Shape(max(a.width, b.width), max(a.masks, b.masks)) not in shapes for a in shapes for b in shapes):
            raise ValueError("the shapes must hold the cover of any two of them")
        self.shapes, self.per_request = shapes, per_request
        self.costs = costs or [(float(s.rows), float(COST_BATCH * s.rows)) for s in shapes]
        alone, batched = self.costs[0]
        self.row = (batched - alone) / (COST_BATCH - 1)     # ms an AR call costs per row (batch_tokens)
        self.call = max(alone - self.row, 0.0)              # ... and for the call itself
        self.width = len(lookup_prior)      # the state's draft width
        self.lookup_prior = lookup_prior
        self.packed = [i for i, s in enumerate(shapes) if s.kind == "packed"]
        self.diffusion_prior = [diffusion_prior[shapes[i]] for i in self.packed]
        self._device: dict[torch.device, tuple] = {}

    def measured(self, costs: list[tuple[float, float]], per_request: bool = False) -> "Policy":
        """This policy with measured iteration costs, choosing per request or not."""
        shapes = (self.shapes[i] for i in self.packed)
        return type(self)(self.shapes, self.lookup_prior, dict(zip(shapes, self.diffusion_prior)), costs, per_request)

    @classmethod
    def from_profile(cls, shapes: list[Shape], profile: dict | None, width: int | None = None) -> "Policy":
        """Priors from an acceptance profile (width.py): lookup's per-position rate from its "lookup" replay
        (tokens per iteration by width), diffusion's tokens per iteration from its "lagged" one; fixed guesses
        without one."""
        width = width or max(s.width for s in shapes)
        lookup = (profile or {}).get("lookup")
        per_position = ([b - a for a, b in zip([1.0] + lookup, lookup)] if lookup
                        else [LOOKUP_PRIOR ** (k + 1) for k in range(width)])
        lagged = (profile or {}).get("lagged")
        diffusion = {s: (lagged[min(s.masks, len(lagged)) - 1] if lagged else 1.5) for s in shapes if s.kind == "packed"}
        per_position = (per_position + per_position[-1:] * width)[:width]
        return cls(shapes, [max(p, 0.0) for p in per_position], diffusion)

    def constants(self, device) -> "Constants":
        """The policy's numbers as tensors on `device`, made once per device (no transfer inside a step)."""
        device = torch.device(device)
        if device not in self._device:
            self._device[device] = Constants(
                torch.tensor(self.costs, dtype=torch.float32, device=device),
                torch.tensor(self.lookup_prior, dtype=torch.float32, device=device),
                torch.tensor(self.diffusion_prior, dtype=torch.float32, device=device),
                torch.tensor([s.width for s in self.shapes], device=device),
                torch.tensor([s.masks for s in self.shapes], device=device),
                torch.tensor(self.packed, dtype=torch.int64, device=device),
                torch.tensor([self.packed.index(i) if i in self.packed else 0 for i in range(len(self.shapes))],
                             device=device),
                torch.arange(max(NGRAMS) + 1, device=device))
        return self._device[device]

    def new_state(self, base: DecodeState) -> AdaptiveState:
        """A request's fresh state: `base` with the statistics at their priors and no probe."""
        device = base.done.device
        c = self.constants(device)
        zero = torch.zeros_like(base.n_out)
        return AdaptiveState(**base.tensors(),
                             look_hit=c.lookup_prior.expand(1, len(c.orders), -1).clone(),
                             look_order=(c.orders == c.orders[-1]).to(torch.float32)[None],
                             diffusion=c.diffusion_prior[None].clone(), probe=torch.zeros_like(base.draft),
                             probe_len=zero.clone(), probe_at=zero.clone(), probe_order=zero.clone(),
                             lookup_draft=torch.zeros_like(base.done), ran=zero.clone(), choice=zero.clone(),
                             quiet_until=zero.clone(), quiet_run=torch.full_like(zero, QUIET_RUNS[0]),
                             queued=torch.zeros_like(base.done))

    # -- after a step ------------------------------------------------------------------------------------------
    def score_lookup(self, st: AdaptiveState, draft: torch.Tensor, length: torch.Tensor, order: torch.Tensor,
                     passive: torch.Tensor | None = None) -> None:
        """Score the probe against the tokens emitted since it was made; once it is settled (a miss seen, or
        every token compared), fold it into its order's row of look_hit and row 0 (any order) and probe the new
        lookup draft (`draft`, `length`, `order`); count the order of its match. `passive` [B]: quiet requests,
        left as they are."""
        c = self.constants(draft.device)
        active = ~st.done if passive is None else ~st.done & ~passive
        k = torch.arange(self.width, device=draft.device)
        compared = torch.minimum(st.n_out - st.probe_at, st.probe_len)
        seen = st.out.gather(1, (st.probe_at[:, None] + k).clamp(max=st.out.shape[1] - 1))
        right = ((seen == st.probe) & (k < compared[:, None])).long().cumprod(1).sum(1)
        settled = (right < compared) | (compared >= st.probe_len)
        observed = (settled & (st.probe_len > 0))[:, None] & (k < st.probe_len[:, None])
        rows = (c.orders == st.probe_order[:, None]) | (c.orders == 0)                          # [B, N + 1]
        observed = observed[:, None] & rows[:, :, None]                                        # [B, N + 1, W]
        hit = (k < right[:, None]).to(st.look_hit.dtype)[:, None]
        matched = (c.orders == order[:, None]).to(st.look_order.dtype)
        st.assign(active, look_hit=torch.where(observed, st.look_hit + RATE * (hit - st.look_hit), st.look_hit),
                  look_order=st.look_order + RATE * (matched - st.look_order))
        st.assign(active & settled, probe=draft, probe_len=torch.where(order > 0, length, 0), probe_at=st.n_out,
                  probe_order=order)

    def observe(self, st: AdaptiveState, ran: torch.Tensor, emitted: torch.Tensor,
                verified_lookup: torch.Tensor, passive: torch.Tensor | None = None) -> None:
        """After a step in which request b ran shape ran[b] and emitted emitted[b] tokens: a steady packed run (the
        same shape the step before) that verified a diffusion draft updates that shape's estimate; every other
        estimate drifts back to its prior. Quiet requests (`passive`) are left as they are."""
        c = self.constants(st.diffusion.device)
        observed = (ran[:, None] == c.packed) & ((st.ran == ran) & ~verified_lookup)[:, None]           # [B, P]
        updated = st.diffusion + RATE * (emitted[:, None].to(st.diffusion.dtype) - st.diffusion)
        drifted = st.diffusion + DRIFT * (c.diffusion_prior - st.diffusion)
        active = ~st.done if passive is None else ~st.done & ~passive
        st.assign(active, diffusion=torch.where(observed, updated, drifted), ran=ran)

    def covers(self, shape: int, choice: torch.Tensor) -> torch.Tensor:
        """Whether the call shape `shape` covers each request's chosen shape `choice` [B]."""
        c = self.constants(choice.device)
        return (c.widths[choice] <= self.shapes[shape].width) & (c.masks[choice] <= self.shapes[shape].masks)

    def cover(self, choices) -> int:
        """The index of the fewest-rows shape covering every shape index in `choices` (AR for none)."""
        chosen = [self.shapes[i] for i in choices] or [AR]
        return self.shapes.index(Shape(max(s.width for s in chosen), max(s.masks for s in chosen)))

    def next_call(self, rows: list[tuple[int, int] | None], lag: int) -> int:
        """On the host, the shape of the next call from the status table `lag` iterations old: `rows` holds each live
        request's (choice, quiet calls left), None for one admitted after the table. QUIET when every one stays
        quiet through the next call (the `lag` calls already issued count against its quiet period), else the
        cover of their choices."""
        if rows and all(row is not None and row[1] > lag for row in rows):
            return QUIET
        return self.cover([row[0] for row in rows if row is not None])

    @staticmethod
    def joined(shape: int) -> int:
        """The next call's shape once a request joins the batch after the status table `shape` was chosen from:
        the same, except that the lean AR step (QUIET), which takes every live request for quiet, becomes the AR
        call, where the newcomer sits out unless it chose AR (as next_call's None rows do)."""
        return 0 if shape == QUIET else shape

    def hit_of(self, st: AdaptiveState, order: torch.Tensor) -> torch.Tensor:
        """How often each token [B, W] of each request's lookup draft is right, by the order of its match."""
        return st.look_hit.gather(1, order[:, None, None].expand(-1, 1, self.width)).squeeze(1)

    def lookup_gain(self, hit: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """Expected tokens [B, W] of an iteration verifying each request's lookup draft (`length` tokens, each right
        as often as `hit` [B, W] says) at widths 1..W."""
        k = torch.arange(self.width, device=length.device)
        return 1 + (hit * (k < length[:, None])).cumsum(1)

    def prefers_lookup(self, st: AdaptiveState, length: torch.Tensor, order: torch.Tensor,
                       gain: torch.Tensor | None = None) -> torch.Tensor:
        """Which requests [B] a packed call should give their lookup draft rather than the retained proposals: those
        with a lookup draft expected to earn as much as their best diffusion estimate (`gain`: lookup_gain, if
        already at hand)."""
        if not self.packed:
            return order > 0
        gain = self.lookup_gain(self.hit_of(st, order), length) if gain is None else gain
        return (order > 0) & (gain[:, -1] >= st.diffusion.amax(1))

    def expected(self, st: AdaptiveState, length: torch.Tensor, order: torch.Tensor,
                 hit: torch.Tensor | None = None) -> torch.Tensor:
        """Expected tokens [B, S] of each request's next iteration in each shape, given its next lookup draft
        (`length`, the `order` of its match, 0 for none; `hit`: how often its tokens are right, by default its
        order's look_hit): AR one, a lookup shape verifies the lookup draft, a packed one the lookup draft where
        the request prefers it (prefers_lookup), else its diffusion draft."""
        c = self.constants(length.device)
        gain = self.lookup_gain(self.hit_of(st, order) if hit is None else hit, length)
        at_width = gain[:, c.widths.clamp(min=1) - 1]                                        # [B, S]
        drafted = torch.where((order > 0)[:, None] & (c.widths > 0), at_width, 1.0)
        if not self.packed:
            return drafted
        preferred = self.prefers_lookup(st, length, order, gain)
        packed = torch.where(preferred[:, None], at_width, st.diffusion[:, c.estimate])
        return torch.where(c.masks > 0, packed, drafted)

    def choose(self, st: AdaptiveState, length: torch.Tensor, order: torch.Tensor,
               passive: torch.Tensor | None = None) -> None:
        """Each request's shape for the next iteration (`choice`): free, the most expected tokens per ms of the batch
        at its size (every row holds it); per request, each request's most expected tokens per ms at its `marginal`
        cost, except that the greedy rows of a sampled batch, whose tokens do not depend on the shapes, make the
        free choice among themselves (the host runs the cover of the choices). Quiet requests (`passive`) keep
        theirs; a request whose own best (free: the batch's) is AR goes quiet (module docstring). The native
        epilogue makes the same choice in C++ on the CPU (csrc/policy.h, the same float32 operations)."""
        c = self.constants(length.device)
        passive = torch.zeros_like(st.done) if passive is None else passive
        choosing = ~st.done & ~passive
        expected = self.expected(st, length, order)                                        # [B, S]
        at_batch = c.costs[:, 0] + (c.costs[:, 1] - c.costs[:, 0]) * ((st.batch - 1) / (COST_BATCH - 1))
        if self.per_request:
            greedy = st.sampling.temperature == 0
            free = self.best(self.batch_tokens(st, expected, choosing & greedy, at_batch[0]), at_batch)
            cost = torch.where(greedy[:, None], at_batch, self.marginal(c))                 # [B, S]
            own = torch.where(greedy, free, self.best(expected, cost))                      # [B]
            st.assign(choosing, choice=own)
        else:
            cost = at_batch
            st.choice.copy_(self.best(self.batch_tokens(st, expected, choosing, cost[0]), cost).expand_as(st.choice))
            own = st.choice
        hopeless = self.best(self.potential(st, length), cost) == 0
        st.assign(choosing & (own == 0), quiet_until=st.nfe + torch.where(hopeless, st.quiet_run, DOZE))
        st.assign(choosing & (own == 0) & hopeless, quiet_run=(2 * st.quiet_run).clamp(max=QUIET_RUNS[1]))
        st.assign(choosing & ~hopeless, quiet_run=torch.full_like(st.quiet_run, QUIET_RUNS[0]))

    def batch_tokens(self, st: AdaptiveState, expected: torch.Tensor, choosing: torch.Tensor,
                     ar_cost: torch.Tensor) -> torch.Tensor:
        """What each shape's iteration earns a batch [S], in tokens of AR's worth (`ar_cost`: AR's iteration at this
        batch size). While requests wait for a slot (`queued`), a request that ends sooner lets one of them in
        sooner, so every gained token is worth a token. Otherwise the batch's calls end with its slowest request: a
        token a request gains beyond AR's one saves its row in a later call (`row`: the AR cost's slope per row),
        and only the least any live request gains (a quiet one: none) also saves whole calls (`call`: the rest of
        an AR call; both fixed with the costs). Alone, each gained token is worth a token; in a batch of requests
        that gain alike, too; where some gain and others do not, less. A batch decoded to its end pays for wide
        calls that shorten none but the quick requests: a batch of 8 at T = 0.7 made 1.09-1.25 tokens per
        request-call and ran as many calls as AR (bench/RESULTS.md)."""
        gain = torch.where(choosing[:, None], expected - 1, 0.0)                              # [B, S]
        least = torch.where(st.done[:, None], gain.amax(0), gain).amin(0)                     # [S]
        total = gain.sum(0, dtype=torch.float64).to(gain.dtype)      # accumulated in double, as csrc/policy.h
        closed = (self.row * total + self.call * least) * st.batch / ar_cost
        return choosing.sum() + torch.where(st.queued.any(), total, closed)

    @staticmethod
    def marginal(c: "Constants") -> torch.Tensor:
        """ms [S] a request pays for an iteration in each shape, priced as the one request in a full batch
        (COST_BATCH) that speculates: its share of the AR call plus the whole cost of the wider shape."""
        return c.costs[0, 1] / COST_BATCH + (c.costs[:, 1] - c.costs[0, 1])

    def potential(self, st: AdaptiveState, length: torch.Tensor) -> torch.Tensor:
        """Expected tokens [B, S] of each shape at a coming iteration: with a full lookup draft as often as one is
        found (`look_order`), right as often as any of its drafts (row 0 of look_hit: a rarely seen order's row
        stays near its prior, which comes from greedy text), else with none."""
        found = 1 - st.look_order[:, 0]
        hit = st.look_hit[:, 0]
        full = self.expected(st, torch.full_like(length, self.width), torch.full_like(length, max(NGRAMS)), hit)
        none = self.expected(st, torch.zeros_like(length), torch.zeros_like(length), hit)
        return none + found[:, None] * (full - none)

    @staticmethod
    def best(tokens: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
        """The shape [...] of the most tokens [..., S] per ms (cost [S]), AR's rate counted MARGIN times."""
        rate = tokens / cost
        return torch.cat([rate[..., :1] * MARGIN, rate[..., 1:]], -1).argmax(-1)
