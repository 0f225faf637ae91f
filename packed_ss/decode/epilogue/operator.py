"""The native module as torch operators: `packed_ss::epilogue_step` (the native epilogue: how a compiled step
calls it), `packed_ss::noise_race` and `packed_ss::noise_inverse_cdf` (shared-noise sampling's draws).

torch.compile cannot trace a call on raw addresses, but it can call an operator: this one takes the state's
tensors, the rows, the workspace and the result buffer, declares what it writes, and makes the native call
(native.py's `NativeEpilogue._call` has checked everything before). Eager steps call the module directly
(no dispatcher on the hot path); a step being compiled calls this operator, so `compile=True` keeps the
native epilogue, and a CUDA graph of the compiled step captures its one launch.
"""
from typing import List, Optional

import torch

from .extension import native_module

STATE = ("cache_len", "last", "draft", "draft_len", "q_idx", "q_prob", "out", "n_out", "done", "seed", "offset",
         "stop_ids", "max_new", "nfe", "n_verify", "n_accepted", "n_bonus")


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


@torch.library.custom_op("packed_ss::epilogue_step",
                         mutates_args=("cache_len", "last", "draft", "draft_len", "q_idx", "q_prob", "out", "n_out",
                                       "done", "offset", "nfe", "n_verify", "n_accepted", "n_bonus", "scratch", "res"))
def epilogue_step(cache_len: torch.Tensor, last: torch.Tensor, draft: torch.Tensor, draft_len: torch.Tensor,
                  q_idx: torch.Tensor, q_prob: torch.Tensor, out: torch.Tensor, n_out: torch.Tensor,
                  done: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor, stop_ids: torch.Tensor,
                  max_new: torch.Tensor, nfe: torch.Tensor, n_verify: torch.Tensor, n_accepted: torch.Tensor,
                  n_bonus: torch.Tensor, v_arg: Optional[torch.Tensor], v_idx: Optional[torch.Tensor],
                  v_prob: Optional[torch.Tensor], z_arg: Optional[torch.Tensor], z_idx: Optional[torch.Tensor],
                  z_prob: Optional[torch.Tensor], scratch: Optional[torch.Tensor], res: torch.Tensor,
                  residual: Optional[torch.Tensor], config: List[int]) -> None:
    """config: prob bits, phase, verify kind, retain code, sampled, dense, block, vocab, v_rows, v_k, v_stride,
    z_k, z_stride, n_z (NativeEpilogue._call)."""
    mod = native_module()
    state = (cache_len, last, draft, draft_len, q_idx, q_prob, out, n_out, done, seed, offset, stop_ids, max_new,
             nfe, n_verify, n_accepted, n_bonus)
    handle = mod.State(*(t.data_ptr() for t in state), draft.shape[1], q_idx.shape[2], stop_ids.shape[1],
                       done.shape[0], out.shape[1], q_prob.element_size())
    bits, phase, kind, retain, sampled, dense, block, vocab, v_rows, v_k, v_stride, z_k, z_stride, n_z = config
    if res.is_cuda:
        step, stream = mod.step_cuda, torch.cuda.current_stream(res.device).cuda_stream
    else:
        step, stream = mod.step_cpu, 0
    step(handle, bits, phase, kind, retain, bool(sampled), bool(dense), block, vocab,
         _ptr(v_arg), _ptr(v_idx), _ptr(v_prob), v_rows, v_k, v_stride, _ptr(z_arg), _ptr(z_idx), _ptr(z_prob), z_k, z_stride,
         n_z, _ptr(scratch), res.data_ptr(), _ptr(residual), stream)


@epilogue_step.register_fake
def _(*args) -> None:
    return None


def _sample(inverse_cdf: bool, seed: torch.Tensor, position: torch.Tensor, prob: torch.Tensor,
            idx: Optional[torch.Tensor]) -> torch.Tensor:
    mod = native_module()
    seed, position, prob = seed.contiguous(), position.contiguous(), prob.contiguous()
    idx = None if idx is None else idx.contiguous()
    tokens = torch.empty(position.shape, dtype=torch.int64, device=position.device)
    args = (seed.data_ptr(), position.data_ptr(), position.numel(), position.shape[-1], prob.data_ptr(),
            32 if prob.dtype == torch.float32 else 64, _ptr(idx), prob.shape[-1], tokens.data_ptr())
    if tokens.is_cuda:
        mod.race_cuda(*args, torch.cuda.current_stream(tokens.device).cuda_stream)
    else:
        mod.sample_cpu(inverse_cdf, *args, torch.get_num_threads())
    return tokens


@torch.library.custom_op("packed_ss::noise_race", mutates_args=())
def noise_race(seed: torch.Tensor, position: torch.Tensor, prob: torch.Tensor, idx: Optional[torch.Tensor]) -> torch.Tensor:
    """shared_noise.torch_race by the native module (csrc/noise.h): the shared-noise sample of every row of prob
    [B, R, K] (float32 / float64; idx [B, R, K] int64, or None: dense), keyed by (seed [B], position [B, R])."""
    return _sample(False, seed, position, prob, idx)


@torch.library.custom_op("packed_ss::noise_inverse_cdf", mutates_args=(), device_types="cpu")
def noise_inverse_cdf(seed: torch.Tensor, position: torch.Tensor, prob: torch.Tensor,
                      idx: Optional[torch.Tensor]) -> torch.Tensor:
    """shared_noise.torch_inverse_cdf by the native module on the CPU (csrc/noise.h), rows as noise_race's."""
    return _sample(True, seed, position, prob, idx)


@noise_race.register_fake
def _(seed, position, prob, idx):
    return position.new_empty(position.shape)


@noise_inverse_cdf.register_fake
def _(seed, position, prob, idx):
    return position.new_empty(position.shape)
