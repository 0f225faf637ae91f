"""Device-resident decoder state and the two updates every schedule shares: emit and retain."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .sampling import take


@dataclass
class DecodeState:
    """Everything an iteration reads or writes, as tensors on the model's device.

    The cache holds the verified prefix except its last token `last`; `out[:n_out]` is the output.
    `draft[:draft_len]` is the current draft, `q_idx`/`q_prob` the sparse distribution each draft token
    was drawn from (unused under greedy decoding). The host reads only `done`.
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
    max_new: torch.Tensor
    nfe: torch.Tensor
    n_verify: torch.Tensor
    n_accepted: torch.Tensor

    @classmethod
    def new(cls, width: int, support: int, max_new: int, stop_ids, seed: int, device,
            out_len: int | None = None, stop_slots: int | None = None) -> "DecodeState":
        """A fresh state. `out_len` / `stop_slots` fix the output buffer length and the number of stop-id
        slots (padded with -1, which no token matches), so that states of different requests share shapes."""
        def scalar(v, dtype=torch.int64):
            return torch.tensor(v, dtype=dtype, device=device)
        stop = sorted(stop_ids)
        if stop_slots is not None:
            if len(stop) > stop_slots:
                raise ValueError(f"{len(stop)} stop ids do not fit {stop_slots} slots")
            stop = stop + [-1] * (stop_slots - len(stop))
        out_len = max(out_len or 0, max_new + 2 * (width + 1))
        return cls(
            cache_len=scalar(0), last=scalar(0),
            draft=torch.zeros(width, dtype=torch.int64, device=device), draft_len=scalar(0),
            q_idx=torch.zeros(width, support, dtype=torch.int64, device=device),
            q_prob=torch.zeros(width, support, dtype=torch.float64, device=device),
            out=torch.zeros(out_len, dtype=torch.int64, device=device),
            n_out=scalar(0), done=scalar(False, torch.bool), seed=scalar(seed), offset=scalar(0),
            stop_ids=torch.tensor(stop, dtype=torch.int64, device=device),
            max_new=scalar(max_new), nfe=scalar(0), n_verify=scalar(0), n_accepted=scalar(0),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def copy_(self, other: "DecodeState") -> "DecodeState":
        """Overwrite every field in place (same shapes): a persistent state keeps its addresses."""
        for name, value in other.tensors().items():
            getattr(self, name).copy_(value)
        return self

    def assign(self, active: torch.Tensor, **values: torch.Tensor) -> None:
        """In-place update of the named fields, only where `active` (a finished state stays put)."""
        for name, value in values.items():
            t = getattr(self, name)
            t.copy_(torch.where(active, value.to(t.dtype), t))


def emit(st: DecodeState, emitted: torch.Tensor, n_accept: torch.Tensor) -> torch.Tensor:
    """Append the first `n_accept` tokens of `emitted`, cut at the first stop token or the length cap.

    Advances the output, the cache length (verifier K/V were written in place, so committing is a
    length update) and `last`; sets `done`. Returns the number of tokens actually appended (0 if done).
    """
    active = ~st.done
    n = emitted.shape[0]
    idx = torch.arange(n, device=emitted.device)
    is_stop = (emitted[:, None] == st.stop_ids[None, :]).any(-1) & (idx < n_accept)
    first_stop = torch.where(is_stop.any(), is_stop.long().argmax() + 1, n + 1)
    a = torch.minimum(torch.minimum(n_accept, st.max_new - st.n_out), first_stop)
    a = torch.where(active, a, torch.zeros_like(a))
    st.out.index_copy_(0, st.n_out + idx, torch.where(active, emitted, st.out[st.n_out + idx]))
    n_out = st.n_out + a
    st.assign(active, n_out=n_out, cache_len=st.cache_len + a,
              last=take(emitted, (a - 1).clamp(min=0)),
              done=(n_out >= st.max_new) | (first_stop <= a))
    return a


def retain(st: DecodeState, z, z_idx, z_prob, a: torch.Tensor, active: torch.Tensor) -> None:
    """Next draft = proposals z[a:] (paper Alg. 1 line 10 / Alg. 2 line 12), with their stored Q."""
    width, n_z = st.draft.shape[0], z.shape[0]
    src = (a + torch.arange(width, device=z.device)).clamp(max=n_z - 1)
    values = {"draft": z[src], "draft_len": (n_z - a).clamp(0, width)}
    if z_idx is not None:
        values.update(q_idx=z_idx[src], q_prob=z_prob[src])
    st.assign(active, **values)
