"""Device-resident decoder state and the two updates every schedule shares: emit and retain."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..runtime.staging import pinned
from .sampling import Sampling, SamplingParams


class DeviceState:
    """A dataclass of device tensors that steps update in place, each with a leading batch dimension: one row
    per request of a batch (both orders' states are one)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def batch(self) -> int:
        return self.done.shape[0]

    def copy_(self, other, non_blocking: bool = False):
        """Overwrite every field in place (same shapes): a persistent state keeps its addresses. `other` may be
        a state built on the host (`non_blocking`: from pinned memory, runtime/staging.py)."""
        for name, value in other.tensors().items():
            getattr(self, name).copy_(value, non_blocking=non_blocking)
        return self

    def pinned(self, device):
        """This (host) state in pinned memory when bound for a CUDA device (runtime/staging.py)."""
        return type(self)(**{name: pinned(t, device) for name, t in self.tensors().items()})

    def rows(self, begin: int, end: int):
        """Requests begin..end-1 as a state of views: what a step does to it, it does to this state."""
        return type(self)(**{name: t[begin:end] for name, t in self.tensors().items()})

    def slot(self, b: int):
        """Request b as a batch of one (views)."""
        return self.rows(b, b + 1)

    def request(self):
        """A batch of one's request, its fields without the batch dimension (views)."""
        if self.batch != 1:
            raise ValueError(f"request() needs a batch of one, not {self.batch}")
        return type(self)(**{name: t[0] for name, t in self.tensors().items()})

    def move(self, src: int, dst: int) -> None:
        """Request `src`'s row continues in row `dst` (device copies)."""
        for t in self.tensors().values():
            t[dst].copy_(t[src])

    @classmethod
    def cat(cls, states: list):
        """One batch of the states' requests, in order (new tensors)."""
        return cls(**{name: torch.cat([st.tensors()[name] for st in states]) for name in states[0].tensors()})

    def assign(self, active: torch.Tensor, **values: torch.Tensor) -> None:
        """In-place update of the named fields, only in the rows where `active` [B] (a finished request stays
        put; a request's own state takes a 0-d `active`)."""
        for name, value in values.items():
            t = getattr(self, name)
            where = active.view(active.shape + (1,) * (t.dim() - active.dim()))
            t.copy_(torch.where(where, value if value.dtype == t.dtype else value.to(t.dtype), t))


@dataclass
class DecodeState(DeviceState):
    """Everything an iteration reads or writes, as tensors on the model's device, one row per request.

    Per request (the shapes below follow the batch dimension [B]): the cache holds the verified prefix except its last token `last`; `out[:n_out]` is the output.
    `draft[:draft_len]` is the current draft, `q_idx`/`q_prob` the distribution each draft token
    was drawn from (unused under greedy decoding; the engine's is dense: q_idx holds the token ids 0..support-1,
    written here once, and a draft's Q is a write of its probabilities). `stop_ids` [S] are one-token stops
    (padded with -1, which no token matches); `stop_seqs` [S, L] the stop sequences of several tokens, right-aligned and padded
    on the left with -1 (matches anything). `n_bonus` counts the verifications that accepted a whole
    non-empty draft and appended the bonus token drawn after it, `accepted_at[k]` the verifications that
    accepted draft token k (runtime/program.py: Step.fold). `context` [C]: the prompt's last C tokens,
    right-aligned after -1s, that the lookup drafter searches with the output (C = 0 without it;
    decode/lookup.py). `prompt_len`: the prompt's length (positions prompt_len + j hold output token j).
    `temperature`, `top_k`, `top_p`: the request's sampling (sampling.Sampling), so that requests of any settings
    share a batch. The host reads nothing of it but the runtime's poll.
    """
    cache_len: torch.Tensor
    last: torch.Tensor
    draft: torch.Tensor
    draft_len: torch.Tensor
    q_idx: torch.Tensor
    q_prob: torch.Tensor
    out: torch.Tensor
    n_out: torch.Tensor
    done: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor
    stop_ids: torch.Tensor
    stop_seqs: torch.Tensor
    max_new: torch.Tensor
    nfe: torch.Tensor
    n_verify: torch.Tensor
    n_accepted: torch.Tensor
    n_bonus: torch.Tensor
    accepted_at: torch.Tensor
    context: torch.Tensor
    prompt_len: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor

    @property
    def sampling(self) -> Sampling:
        """The requests' sampling settings [B] (sampling.Sampling)."""
        return Sampling(self.temperature, self.top_k, self.top_p)

    @classmethod
    def new(cls, width: int, support: int, max_new: int, stop_ids, seed: int, device,
            out_len: int | None = None, stop_slots: int | None = None, stop_sequences=(),
            sequence_slots: tuple[int, int] | None = None, prompt_len: int = 0,
            q_dtype: torch.dtype = torch.float64, context=(), context_len: int = 0,
            params: SamplingParams = SamplingParams()) -> "DecodeState":
        """A fresh state for one request (a batch of one). `out_len`, `stop_slots` and `sequence_slots`
        (count, length) fix the output buffer length and the stop tables' shapes (padded with -1), so that
        states of different requests share shapes and stack into a batch (`DeviceState.cat`). `q_dtype`: the
        stored Q's, that of the probabilities the drafts are drawn from (float32 for a float32 or bfloat16
        model: stored exactly, in half the memory of float64). `context`: the prompt tokens the lookup drafter
        searches, of which the last `context_len` are kept. `params`: the request's sampling."""
        def scalar(v, dtype=torch.int64):
            return torch.tensor([v], dtype=dtype, device=device)

        def row(t: torch.Tensor) -> torch.Tensor:
            return t[None]
        kept = list(context)[-context_len:] if context_len else []
        stop = sorted(stop_ids)
        if stop_slots is not None:
            if len(stop) > stop_slots:
                raise ValueError(f"{len(stop)} stop ids do not fit {stop_slots} slots")
            stop = stop + [-1] * (stop_slots - len(stop))
        n_seq, seq_len = sequence_slots or (len(stop_sequences), max(map(len, stop_sequences), default=0))
        if len(stop_sequences) > n_seq or any(len(s) > seq_len for s in stop_sequences):
            raise ValueError(f"stop sequences do not fit {n_seq} slots of {seq_len} tokens")
        seqs = [[-1] * (seq_len - len(s)) + list(s) for s in stop_sequences]
        seqs += [[-1] * (seq_len - 1) + [-2]] * (n_seq - len(seqs)) if seq_len else []   # -2: matches no token
        out_len = max(out_len or 0, max_new + 2 * (width + 1))
        return cls(
            cache_len=scalar(0), last=scalar(0),
            draft=torch.zeros(1, width, dtype=torch.int64, device=device), draft_len=scalar(0),
            q_idx=torch.arange(support, device=device).expand(1, width, support).contiguous(),
            q_prob=torch.zeros(1, width, support, dtype=q_dtype, device=device),
            out=torch.zeros(1, out_len, dtype=torch.int64, device=device),
            n_out=scalar(0), done=scalar(False, torch.bool), seed=scalar(seed), offset=scalar(0),
            stop_ids=row(torch.tensor(stop, dtype=torch.int64, device=device)),
            stop_seqs=torch.tensor(seqs, dtype=torch.int64, device=device).view(1, n_seq, seq_len),
            max_new=scalar(max_new), nfe=scalar(0), n_verify=scalar(0), n_accepted=scalar(0), n_bonus=scalar(0),
            accepted_at=torch.zeros(1, width, dtype=torch.int64, device=device),
            context=row(torch.tensor([-1] * (context_len - len(kept)) + kept, dtype=torch.int64, device=device)),
            prompt_len=scalar(prompt_len), **params.rows(1, device)._asdict(),
        )



def q_dtype(model) -> torch.dtype:
    """The dtype of the probabilities `sampling.truncated_probs` gives for a model's logits, which its stored Q
    keeps: float32, or float64 for a float64 model."""
    return torch.promote_types(model.dtype, torch.float32)


def emit(st: DecodeState, emitted: torch.Tensor, n_accept: torch.Tensor) -> torch.Tensor:
    """Append each request's first `n_accept` [B] tokens of `emitted` [B, n], cut at the first stop token or
    the length cap.

    Advances the output, the cache length (verifier K/V were written in place, so committing is a
    length update) and `last`; sets `done`. Returns the number of tokens actually appended [B] (0 if done).
    """
    active = ~st.done
    n = emitted.shape[1]
    idx = torch.arange(n, device=emitted.device)
    is_stop = (emitted[:, :, None] == st.stop_ids[:, None, :]).any(-1) & (idx < n_accept[:, None])
    first_stop = torch.where(is_stop.any(1), is_stop.long().argmax(1) + 1, n + 1)
    a = torch.minimum(torch.minimum(n_accept, st.max_new - st.n_out), first_stop)
    a = torch.where(active, a, torch.zeros_like(a))
    at = st.n_out[:, None] + idx
    st.out.scatter_(1, at, torch.where(active[:, None], emitted, st.out.gather(1, at)))
    n_out = st.n_out + a
    st.assign(active, n_out=n_out, cache_len=st.cache_len + a,
              last=emitted.gather(1, (a - 1).clamp(min=0)[:, None])[:, 0],
              done=(n_out >= st.max_new) | (first_stop <= a))
    return a


def stop_at_sequences(st: DecodeState, start: torch.Tensor) -> None:
    """End each output at the first stop sequence completed by the tokens out[start:n_out] just emitted.

    A sequence may begin in earlier output (never in the prompt); the output keeps it whole and drops
    what follows (the same rule as the any-order decoder's, paper E.2). Fixed shape: the candidate ends
    are the B = W+1 slots from `start`, the most one call emits."""
    seqs = st.stop_seqs                                                                          # [N, S, L]
    length = seqs.shape[2]
    ends = start[:, None] + torch.arange(st.draft.shape[1] + 1, device=seqs.device)              # [N, B]
    at = ends[:, :, None] - (length - 1) + torch.arange(length, device=seqs.device)              # [N, B, L]
    tokens = st.out.gather(1, at.clamp(min=0).flatten(1)).view_as(at)
    match = (seqs[:, None] == -1) | ((tokens[:, :, None] == seqs[:, None]) & (at[:, :, None] >= 0))  # [N, B, S, L]
    hit = match.all(-1).any(-1) & (ends < st.n_out[:, None])
    first_end = torch.where(hit, ends, st.out.shape[1]).amin(1)
    st.n_out.copy_(torch.minimum(st.n_out, first_end + 1))
    st.done.logical_or_(hit.any(1))


def retain(st: DecodeState, z, z_idx, z_prob, a: torch.Tensor, active: torch.Tensor) -> None:
    """Next draft = proposals z[a:] (paper Alg. 1 line 10 / Alg. 2 line 12), with their stored Q.

    z [B, n_z] with, when sampled, the Q rows z_prob [B, n_z, K] and their token ids z_idx (None when dense: the
    state's q_idx holds the token ids); a [B]: the emitted counts."""
    width, n_z = st.draft.shape[1], z.shape[1]
    src = (a[:, None] + torch.arange(width, device=z.device)).clamp(max=n_z - 1)               # [B, W]
    values = {"draft": z.gather(1, src), "draft_len": (n_z - a).clamp(0, width)}
    if z_prob is not None:
        rows = src[:, :, None].expand(-1, -1, z_prob.shape[2])
        values["q_prob"] = z_prob.gather(1, rows)
        if z_idx is not None:
            values["q_idx"] = z_idx.gather(1, rows)
    st.assign(active, **values)
