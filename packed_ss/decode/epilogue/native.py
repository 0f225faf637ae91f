"""The compiled step epilogue (csrc/, module `packed_ss._epilogue`): loading it, and calling it.

csrc/epilogue.h runs a whole step epilogue in one call (one thread block per sequence on CUDA) and
reproduces the torch reference (reference.py) bit for bit on the CPU. The module is optional:
`native_available(device)` says whether it can serve a device, and `native_unavailable_reason(device)`
why not (not built, built without CUDA, no GPU).
"""
from __future__ import annotations

import importlib

import torch

from ..sampling import SamplingParams
from ..state import DecodeState
from .base import Epilogue, Rows

_module = None
_error: str | None = None
_loaded = False

BUILD_HINT = ("it is built by `pip install -e .` (or `pip install .`) when cmake and a C++ compiler are "
              "present, with its CUDA part when nvcc is found; see setup.py")


def native_module():
    """The compiled module, or None when it was not built or fails to load (reason: native_unavailable_reason)."""
    global _module, _error, _loaded
    if not _loaded:
        _loaded = True
        try:
            _module = importlib.import_module("packed_ss._epilogue")
        except ImportError as err:
            _module, _error = None, f"packed_ss._epilogue is not importable ({err})"
    return _module


def native_unavailable_reason(device) -> str | None:
    """None if the native epilogue can run on `device`, else a one-line reason."""
    device = torch.device(device)
    mod = native_module()
    if mod is None:
        return f"the native epilogue is not available: {_error}; {BUILD_HINT}"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not mod.HAS_CUDA:
            return f"the native epilogue was built without CUDA (no nvcc at build time); {BUILD_HINT}"
        count, message = mod.cuda_device_count()
        if count < 1:
            return f"the CUDA epilogue found no usable CUDA device ({message or 'none'})"
        return None
    return f"the native epilogue supports cpu and cuda devices, not {device.type}"


def native_available(device) -> bool:
    return native_unavailable_reason(device) is None


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class NativeEpilogue(Epilogue):
    """The compiled epilogue: calls are asynchronous on CUDA (the current stream) and capturable in a CUDA
    graph; on the CPU it runs the same __host__ __device__ code."""

    def __init__(self, device, width: int, params: SamplingParams):
        reason = native_unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(reason)
        super().__init__(device, width, params)
        if self.device.type == "cuda" and self.device.index is None:   # tensors report cuda:N
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.mod = native_module()
        self.cuda = self.device.type == "cuda"
        self._native_step = self.mod.step_cuda if self.cuda else self.mod.step_cpu
        self.vocab = 0
        self.res = torch.zeros(self.block + 2, dtype=torch.int64, device=self.device)
        self.emitted = self.res[:self.block]   # the last verification's emitted tokens and A (views)
        self.n_accept = self.res[self.block]
        self._scratch: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._bound: tuple[DecodeState, object] | None = None

    def rows(self, logits: torch.Tensor) -> Rows:
        self.vocab = logits.shape[-1]
        return super().rows(logits)

    def _step(self, st, verify, token, propose, retain) -> None:
        kind = self.mod.VERIFY_DRAFT if verify is not None else (self.mod.VERIFY_ONE if token is not None
                                                                  else self.mod.VERIFY_NONE)
        self._call(st, self.mod.PHASE_BOTH, kind, verify if verify is not None else token, propose, retain)

    def verify(self, st: DecodeState, verify: Rows, residual: torch.Tensor | None = None):
        """The emitted tokens and A go into `res`; returns views of them."""
        self._call(st, self.mod.PHASE_VERIFY, self.mod.VERIFY_DRAFT, verify, None, None, residual)
        return self.emitted, self.n_accept

    def _commit(self, st, propose, retain) -> None:
        self._call(st, self.mod.PHASE_COMMIT, self.mod.VERIFY_DRAFT, None, propose, retain)

    # -- plumbing --------------------------------------------------------------------------------------
    def _state(self, st: DecodeState):
        if self._bound is not None and self._bound[0] is st:
            return self._bound[1]
        w = self.width
        t = st.tensors()
        for name, value in t.items():
            if value.device != self.device:
                raise ValueError(f"DecodeState.{name} is on {value.device}, the epilogue on {self.device}")
            if not value.is_contiguous():
                raise ValueError(f"DecodeState.{name} must be contiguous")
            want = torch.bool if name == "done" else (torch.float64 if name == "q_prob" else torch.int64)
            if value.dtype != want:
                raise ValueError(f"DecodeState.{name} must be {want}, got {value.dtype}")
        if st.draft.shape != (w,) or st.q_idx.dim() != 2 or st.q_idx.shape[0] != w or st.q_prob.shape != st.q_idx.shape:
            raise ValueError(f"DecodeState draft / Q shapes do not match width {w}")
        # DecodeState.new sizes `out` for max_new + 2B: emit writes B slots past n_out.
        handle = self.mod.State(*(t[n].data_ptr() for n in (
            "cache_len", "last", "draft", "draft_len", "q_idx", "q_prob", "out", "n_out", "done", "seed", "offset",
            "stop_ids", "max_new", "nfe", "n_verify", "n_accepted", "n_bonus")),
            w, st.q_idx.shape[1], st.stop_ids.numel())
        self._bound = (st, handle)   # holding st keeps the addresses valid
        return handle

    def _scratch_for(self, dtype: torch.dtype, vocab: int) -> torch.Tensor:
        key = (dtype, vocab)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(vocab, dtype=dtype, device=self.device)
        return self._scratch[key]

    def _check(self, rows: Rows | None, what: str) -> None:
        if rows is None:
            return
        tensors = [rows.arg] if rows.arg is not None else [rows.prob] + ([] if self.dense else [rows.idx])
        for t in tensors:
            if t.device != self.device or not t.is_contiguous():
                raise ValueError(f"{what} rows must be contiguous tensors on {self.device}")
        if rows.arg is not None and rows.arg.dtype != torch.int64:
            raise ValueError(f"{what} argmax rows must be int64")
        if rows.prob is not None and rows.prob.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{what} probabilities must be float32 or float64")
        if rows.idx is not None and (rows.idx.dtype != torch.int64 or rows.idx.shape != rows.prob.shape):
            raise ValueError(f"{what} rows must be int64 idx and prob of one shape")
        if rows.arg is None and (rows.idx is None) != self.dense:
            raise ValueError(f"{what} rows: dense and sparse distributions cannot mix")

    def _call(self, st, phase, kind, v: Rows | None, z: Rows | None, retain, residual=None) -> None:
        handle = self._state(st)
        greedy = self.params.greedy
        self._check(v, "verifier")
        self._check(z, "proposal")
        if retain is None:
            retain_code = self.mod.RETAIN_NONE
        elif retain == "a":
            retain_code = self.mod.RETAIN_SHIFT_A
        else:
            retain_code = int(retain)
        prob = v.prob if v is not None and v.prob is not None else (z.prob if z is not None else None)
        bits = 64 if prob is not None and prob.dtype == torch.float64 else 32
        if v is not None and z is not None and v.prob is not None and v.prob.dtype != z.prob.dtype:
            raise ValueError("verifier and proposal probabilities must share a dtype")
        scratch = 0
        if not greedy and kind == self.mod.VERIFY_DRAFT and v is not None:
            scratch = self._scratch_for(v.prob.dtype, v.vocab).data_ptr()
        if v is not None and kind == self.mod.VERIFY_DRAFT and len(v) < self.block:
            raise ValueError(f"draft verification needs {self.block} verifier rows, got {len(v)}")
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.cuda else 0
        n_z = len(z) if z is not None else 0
        v, z = v if v is not None else Rows(), z if z is not None else Rows()
        self._native_step(handle, bits, phase, kind, retain_code, not greedy, self.dense, self.block, self.vocab,
                   _ptr(v.arg), _ptr(v.idx), _ptr(v.prob), v.k, _ptr(z.arg), _ptr(z.idx), _ptr(z.prob), z.k,
                   n_z, scratch, self.res.data_ptr(), _ptr(residual), stream)
