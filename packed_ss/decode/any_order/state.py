"""Any-order decoding state and the rules of paper Alg. 3 that every any-order schedule shares.

Output positions are numbered 0..L-1 after the prompt and keep their token wherever in the order it
was accepted. The KV cache holds the prompt and then accepted tokens in acceptance order (each row
saw exactly the rows before it, which is what the ordered context P_t means); accepted tokens whose
K/V are not computed yet (a correction predicted by a mask row) wait in `pending` and enter the next
call as its N rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

ORDERS = ("ltr", "confidence")


@dataclass
class Iteration:
    """What one iteration did: the order, how many ranks it accepted, and its input size."""
    order: list[int]      # pi_t over U_t (output positions); the native decoder: the positions it committed
    window: int           # u_t: unresolved positions in the active window
    accepted: int         # A_t, before the stopping rule
    drafts_accepted: int  # h_t: accepted draft tokens (the rest of A_t is the verifier's own token)
    pending_rows: int     # p: rows of N this iteration processed
    rows: int             # token rows evaluated, summed over the iteration's calls


@dataclass
class AnyOrderState:
    prompt_len: int
    limit: int                                    # L: output positions 0..L-1
    stop_sequences: list[tuple[int, ...]]
    end: int = -1                                 # E: last position to generate (0-based)
    tokens: list[int | None] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)            # output position of each cache row after the prompt
    pending: list[tuple[int, int]] = field(default_factory=list)   # (position, token), in acceptance order
    draft: dict[int, int] = field(default_factory=dict)
    score: dict[int, float] = field(default_factory=dict)
    q: dict[int, tuple] = field(default_factory=dict)         # sampled drafts: the sparse Q each was drawn from
    nfe: int = 0
    reprocessed: int = 0          # cache rows re-queued because a stop dropped a token they saw
    trace: list[Iteration] = field(default_factory=list)

    def __post_init__(self):
        self.end = self.limit - 1
        self.tokens = [None] * self.limit

    @property
    def cache_len(self) -> int:
        return self.prompt_len + len(self.cached)

    @property
    def done(self) -> bool:
        return all(t is not None for t in self.tokens[:self.end + 1])

    def output(self) -> list[int]:
        return self.tokens[:self.end + 1]

    def window(self, width: int) -> list[int]:
        """U_t: the unresolved positions among the W starting at the leftmost unresolved one (Alg. 3 l. 3-4)."""
        left = next(j for j in range(self.end + 1) if self.tokens[j] is None)
        return [j for j in range(left, min(self.end, left + width - 1) + 1) if self.tokens[j] is None]

    def order(self, window: list[int], policy: str) -> list[int]:
        """pi_t: LTR, or decreasing confidence with ties by position and unscored positions last (E.6)."""
        if policy == "ltr":
            return list(window)
        scored = [j for j in window if math.isfinite(self.score.get(j, math.nan))]
        rest = [j for j in window if j not in scored]
        return sorted(scored, key=lambda j: (-self.score[j], j)) + rest

    def set_draft(self, positions, tokens, scores, q=None) -> None:
        """D_t: proposals at the positions still unresolved and not beyond E (Alg. 3 l. 14-15), with
        their scores and, when sampled, the distributions they were drawn from."""
        self.draft, self.score, self.q = {}, {}, {}
        for i, (j, t, s) in enumerate(zip(positions, tokens, scores)):
            if self.tokens[j] is None and j <= self.end:
                self.draft[j], self.score[j] = t, s
                if q is not None:
                    self.q[j] = (q[0][i], q[1][i])

    def keep_scores(self, positions, scores) -> None:
        """Scores without drafts (Linear-SS orders by the previous verifier's confidence, E.6)."""
        self.draft, self.q = {}, {}
        self.score = {j: s for j, s in zip(positions, scores) if self.tokens[j] is None and j <= self.end}

    def commit_unverified(self, pairs: list[tuple[int, int]], window: int, rows: int) -> None:
        """Accept tokens predicted by mask rows without verification (AR steps, the native decoder)."""
        self.trace.append(Iteration([j for j, _ in pairs], window, len(pairs), 0, len(self.pending), rows))
        self.cached += [j for j, _ in self.pending]
        self.pending = list(pairs)
        for j, t in pairs:
            self.tokens[j] = t
        self.apply_stops()

    def accept(self, order: list[int], verified: list[int], rows: int, h: int | None = None) -> int:
        """Accept matching drafts in rank order, then the verifier token at the first miss (Alg. 3 l. 9-13).

        `verified[r]` is the verifier's token at rank r; under sampling, `h` (the drafts accepted by
        rejection sampling) is given and verified[h] is the residual or fresh draw. The iteration wrote
        the pending rows and then the O rows (rank order) into the cache in place: the accepted drafts'
        rows stay (their K/V saw exactly the tokens before them in acceptance order), the verifier's own
        token waits in `pending`. Returns A_t.
        """
        u = len(order)
        if h is None:
            h = 0
            while h < u and self.draft.get(order[h]) == verified[h]:
                h += 1
        a = min(h + 1, u)
        self.trace.append(Iteration(list(order), u, a, h, len(self.pending), rows))
        self.cached += [j for j, _ in self.pending] + order[:h]
        self.pending = [] if h >= u else [(order[h], verified[h])]
        for r in range(a):
            self.tokens[order[r]] = verified[r]
        self.apply_stops()
        return a

    def apply_stops(self) -> None:
        """E <- end of the earliest fully accepted stop sequence; drop everything after E (Alg. 3 l. 11-12).

        Cache rows after a dropped one saw it, so they leave the cache and are processed again as
        pending rows (in the same order), which keeps the cache equal to the ordered context P_t."""
        end = self.end
        for seq in self.stop_sequences:
            n = len(seq)
            for e in range(n - 1, end + 1):
                if all(self.tokens[e - n + 1 + i] == seq[i] for i in range(n)):
                    end = min(end, e)
                    break
        if end == self.end:
            return
        self.end = end
        for j in range(end + 1, self.limit):
            self.tokens[j] = None
        first = next((i for i, j in enumerate(self.cached) if j > end), len(self.cached))
        redo = [(j, self.tokens[j]) for j in self.cached[first:] if j <= end]
        self.cached = self.cached[:first]
        self.reprocessed += len(redo)
        self.pending = redo + [(j, t) for j, t in self.pending if j <= end]
        self.draft = {j: t for j, t in self.draft.items() if j <= end}
        self.q = {j: q for j, q in self.q.items() if j <= end}
