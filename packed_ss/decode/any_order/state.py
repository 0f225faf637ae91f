"""Any-order decoding state on the device (paper Alg. 3) and the per-iteration trace read at the end.

Output positions are numbered 0..L-1 after the prompt; a token keeps its position wherever in the
order it was accepted. P_t, the prompt followed by the accepted (position, token) pairs in acceptance
order, is `acc_pos[:n_acc]` with the tokens in `out`. The KV cache holds the prompt and the first
`n_cached` of those pairs (each row saw exactly the rows before it: the ordered context); the rest,
`acc_pos[n_cached:n_acc]`, are accepted tokens whose K/V are not computed yet (a verifier's correction,
or rows re-queued after a stop truncated P_t) and enter the next call as its N rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sampling import Sampling, SamplingParams
from ..state import DeviceState

ORDERS = ("ltr", "confidence")
TRACE = ("window", "accepted", "drafts_accepted", "pending_rows", "rows")   # columns of `trace_stats`


@dataclass
class Iteration:
    """What one iteration did: the order, how many ranks it accepted, and its input size."""
    order: list[int]      # pi_t over U_t (output positions); the threshold decoder: the positions it committed
    window: int           # u_t: unresolved positions in the active window
    accepted: int         # A_t, before the stopping rule
    drafts_accepted: int  # h_t: accepted draft tokens (the rest of A_t is the verifier's own token)
    pending_rows: int     # p: rows of N this iteration processed
    rows: int             # live token rows evaluated, summed over the iteration's calls


@dataclass
class AnyOrderState(DeviceState):
    """Every tensor an iteration reads or writes; the host reads `done`, `hold`, `n_out` and `out[:n_out]`.

    `out[j]` is the token accepted at position j (-1: unresolved); `out[:n_out]` is the resolved prefix of
    positions 0..E (E = `end`), the final output so far. Draft slots hold D_t: `draft_pos` (-1: empty),
    `draft_tok` (-1: a score without a token, Linear-SS), `draft_score` (nan: none) and the Q each
    sampled draft was drawn from (`q_prob`: dense, in token order). `rank_pos` is pi_t of the next call (-1
    after u_t), chosen when the previous iteration ended. `stops` [S, Ls]: stop tokens and sequences,
    right-aligned, -1 matching any token on the left, -2 (a row that matches nothing) in unused slots. `hold` asks the host for
    `resume()`: more pending rows than the fixed call has N slots for.
    """
    prompt_len: torch.Tensor
    end: torch.Tensor
    out: torch.Tensor
    n_out: torch.Tensor
    acc_pos: torch.Tensor
    n_acc: torch.Tensor
    n_cached: torch.Tensor
    draft_pos: torch.Tensor
    draft_tok: torch.Tensor
    draft_score: torch.Tensor
    q_prob: torch.Tensor
    rank_pos: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor
    stops: torch.Tensor
    done: torch.Tensor
    hold: torch.Tensor
    nfe: torch.Tensor
    n_verify: torch.Tensor
    n_accepted: torch.Tensor
    n_bonus: torch.Tensor
    accepted_at: torch.Tensor   # [W] verifications that accepted the draft of rank k (runtime/program.py: Step.fold)
    n_iter: torch.Tensor
    trace_order: torch.Tensor   # [T, W] pi_t per iteration (-1 padded)
    trace_stats: torch.Tensor   # [T, 5] the TRACE columns per iteration
    temperature: torch.Tensor   # the request's sampling (sampling.Sampling)
    top_k: torch.Tensor
    top_p: torch.Tensor

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, self.top_p)

    @classmethod
    def new(cls, width: int, support: int, prompt_len: int, max_new: int, seed: int,
            stops: list[tuple[int, ...]], device, out_len: int | None = None,
            stop_shape: tuple[int, int] | None = None, q_dtype: torch.dtype = torch.float64,
            params: SamplingParams = SamplingParams()) -> AnyOrderState:
        """A fresh state, a batch of one (the steps see its `request()`). `out_len` and `stop_shape` (rows,
        length) fix the buffer shapes so that states of different requests share them; the trace has one row
        per possible iteration (each resolves at least one position)."""
        n_stop, stop_len = stop_shape or (0, 1)
        n_stop, stop_len = max(n_stop, len(stops)), max([stop_len, *map(len, stops)])
        table = [[-1] * (stop_len - len(s)) + list(s) for s in stops]
        table += [[-1] * (stop_len - 1) + [-2]] * (n_stop - len(table))
        out_len = max(out_len or 0, max_new)

        def scalar(v, dtype=torch.int64):
            return torch.tensor(v, dtype=dtype, device=device)

        def full(shape, v, dtype=torch.int64):
            return torch.full(shape, v, dtype=dtype, device=device)
        one = cls(
            prompt_len=scalar(prompt_len), end=scalar(max_new - 1), out=full((out_len,), -1), n_out=scalar(0),
            acc_pos=full((out_len,), -1), n_acc=scalar(0), n_cached=scalar(0),
            draft_pos=full((width,), -1), draft_tok=full((width,), -1),
            draft_score=full((width,), math.nan, torch.float64),
            q_prob=full((width, support), 0.0, q_dtype),
            rank_pos=full((width,), -1), seed=scalar(seed), offset=scalar(0),
            stops=torch.tensor(table, dtype=torch.int64, device=device).view(n_stop, stop_len),
            done=scalar(False, torch.bool), hold=scalar(False, torch.bool),
            nfe=scalar(0), n_verify=scalar(0), n_accepted=scalar(0), n_bonus=scalar(0),
            accepted_at=full((width,), 0), n_iter=scalar(0),
            trace_order=full((out_len, width), -1), trace_stats=full((out_len, len(TRACE)), 0),
            **{name: t[0] for name, t in params.rows(1, device)._asdict().items()},
        )
        return cls(**{name: t[None] for name, t in one.tensors().items()})   # a batch of one

    def iterations(self, fetch=torch.Tensor.tolist) -> list[Iteration]:
        """The trace, read from the device at the end (`fetch(tensor)`: its values on the host)."""
        n, width = fetch(self.n_iter), self.trace_order.shape[1]
        rows = fetch(torch.cat([self.trace_order[:n], self.trace_stats[:n]], 1))
        return [Iteration([j for j in row[:width] if j >= 0], *row[width:]) for row in rows]
