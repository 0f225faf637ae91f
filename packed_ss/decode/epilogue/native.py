"""The compiled step epilogue (csrc/, module `packed_ss._epilogue`, loaded by extension.py), called.

csrc/epilogue.h runs a whole step epilogue of a whole batch in one call (request after request on the CPU,
one thread block per request on CUDA) and reproduces the torch reference (reference.py) bit for bit on the
CPU: request b of a batched call does exactly what a call on request b alone does. The module is optional:
`native_available(device)` says whether it can serve a device, and `native_unavailable_reason(device)`
why not (not built, built without CUDA, no GPU).
"""
from __future__ import annotations

from dataclasses import fields

import torch

from .. import policy as rules
from ..lookup import NGRAMS
from ..state import DecodeState
from .base import Epilogue, Rows, Verified
from .extension import native_module, native_unavailable_reason
from .operator import STATE, epilogue_step


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _stored_q(st: DecodeState, draft: torch.Tensor, what: str) -> tuple[int, int]:
    """(pointer, bits) of the stored Q that a lookup draft [B, W] writes its point mass to; ValueError where it is
    not contiguous or not W wide."""
    _check_contiguous(st.q_prob)
    if draft.shape[1] != st.q_prob.shape[1]:
        raise ValueError(f"{what}: the draft is {draft.shape[1]} wide, the stored Q {st.q_prob.shape[1]}")
    return st.q_prob.data_ptr(), 8 * st.q_prob.element_size()


def _row_stride(t: torch.Tensor, what: str) -> int:
    """Request-to-request stride, in rows, of rows t [B, R] (argmax) or [B, R, K] (distributions) whose rows
    are contiguous within a request: a contiguous tensor, or a slice along dim 1 of one. ValueError otherwise."""
    b, r = t.shape[0], t.shape[1]
    row = 1 if t.dim() == 2 else t.shape[2]       # elements per row
    if (t.dim() == 3 and row > 1 and t.stride(2) != 1) or (r > 1 and t.stride(1) != row):
        raise ValueError(f"{what} rows must be contiguous within a request (strides {t.stride()}, shape "
                         f"{tuple(t.shape)})")
    if b <= 1:
        return r
    s0 = t.stride(0)
    if row == 0 or s0 % row or s0 // row < r:
        raise ValueError(f"{what} rows: the batch stride {s0} is not a whole number of rows >= {r} "
                         f"(strides {t.stride()}, shape {tuple(t.shape)})")
    return s0 // row


def _contiguous(*rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Arguments of a native call that are values of this step (copied where they are views)."""
    return tuple(t.contiguous() for t in rows)


def _check_contiguous(*state: torch.Tensor) -> None:
    """The adaptive state's rows a native call reads or writes in place must be contiguous."""
    if not all(t.is_contiguous() for t in state):
        raise ValueError("the adaptive state's rows must be contiguous")


class NativeEpilogue(Epilogue):
    """The compiled epilogue: one call steps the state's whole batch; calls are asynchronous on CUDA (the
    current stream) and capturable in a CUDA graph; on the CPU it runs the same __host__ __device__ code.

    What it expects: a batch-major DecodeState (every field [B, ...], contiguous, on this device: draft
    [B, W], q_idx / q_prob [B, W, K], out [B, L], stop_ids [B, S], the rest [B]) and Rows [B, R] (arg,
    int64) or [B, R, K] (prob float32/float64, idx int64 or None when dense) whose rows are contiguous
    within a request (stride(-1) == 1, stride(1) == K) and evenly spaced across requests (stride(0) a whole
    number of rows >= R): contiguous tensors or slices of them along dim 1. A draft verifies within its
    verifier rows (at most R - 1 tokens of it, base.Epilogue). `res` [B, block + 2] and the
    workspace [B, vocab] are cached per batch size (persistent addresses, as CUDA graphs need)."""

    _BOUND_MAX = 8      # state handles kept (a state object each, holding it keeps its addresses valid)

    def __init__(self, device, width: int, sampled: bool):
        reason = native_unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(reason)
        super().__init__(device, width, sampled)
        if self.device.type == "cuda" and self.device.index is None:   # tensors report cuda:N
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.mod = native_module()
        self.cuda = self.device.type == "cuda"
        self._native_step = self.mod.step_cuda if self.cuda else self.mod.step_cpu
        self._res: dict[int, torch.Tensor] = {}
        self._use_res(1)
        self._scratch: dict[tuple[torch.dtype, int, int], torch.Tensor] = {}
        self._bound: dict[int, tuple[DecodeState, object]] = {}   # id(state) -> (state, handle)

    def _use_res(self, batch: int) -> torch.Tensor:
        """The persistent [B, block + 2] result buffer of batch size B; `res`, `emitted` [B, block] and
        `n_accept` [B] are views of the last one used."""
        res = self._res.get(batch)
        if res is None:
            res = self._res[batch] = torch.zeros(batch, self.block + 2, dtype=torch.int64, device=self.device)
        self.res, self.emitted, self.n_accept = res, res[:, :self.block], res[:, self.block]
        return res

    def lookup_draft(self, st: DecodeState, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """On the CPU, csrc/lookup.h request by request (the context and the output read where they are); on CUDA,
        and in a step being compiled, the torch ops (captured or fused with the rest of the step)."""
        if self.cuda or torch.compiler.is_compiling():
            return super().lookup_draft(st, width)
        _check_contiguous(st.context, st.out, st.n_out, st.stop_ids)
        draft = torch.empty(st.batch, width, dtype=torch.int64)
        length, order = torch.empty(st.batch, dtype=torch.int64), torch.empty(st.batch, dtype=torch.int64)
        self.mod.lookup_draft_cpu(st.context.data_ptr(), st.context.shape[1], st.out.data_ptr(), st.out.shape[1],
                                  st.n_out.data_ptr(), st.stop_ids.data_ptr(), st.stop_ids.shape[1], st.batch, NGRAMS,
                                  width, draft.data_ptr(), length.data_ptr(), order.data_ptr())
        return draft, length, order

    def point_mass(self, st: DecodeState, draft: torch.Tensor, rows: torch.Tensor) -> None:
        """On the CPU, csrc/lookup.h writes only the rows that take a lookup draft; elsewhere the torch ops."""
        if self.cuda or torch.compiler.is_compiling():
            return super().point_mass(st, draft, rows)
        draft, rows = _contiguous(draft, rows)
        self.mod.point_mass_cpu(*_stored_q(st, draft, "point_mass"), draft.data_ptr(), rows.data_ptr(), st.batch,
                                draft.shape[1], st.q_prob.shape[2])

    def take_lookup(self, st: DecodeState, draft: torch.Tensor, length: torch.Tensor, order: torch.Tensor,
                    preferred: torch.Tensor, keep: torch.Tensor, passive: torch.Tensor, point_mass: bool) -> None:
        """On the CPU, csrc/lookup.h request by request; on CUDA, and in a step being compiled, the torch ops."""
        if self.cuda or torch.compiler.is_compiling():
            return super().take_lookup(st, draft, length, order, preferred, keep, passive, point_mass)
        if draft.shape[1] != st.draft.shape[1]:
            raise ValueError(f"take_lookup: the draft is {draft.shape[1]} wide, the state's {st.draft.shape[1]}")
        rows = _contiguous(draft, length, order, preferred, keep, passive)
        flags = getattr(st, "lookup_draft", None)
        _check_contiguous(st.done, st.draft, st.draft_len, *([] if flags is None else [flags]))
        q_prob, bits = _stored_q(st, draft, "take_lookup") if point_mass else (0, 0)
        self.mod.take_lookup_cpu(*(t.data_ptr() for t in (*rows, st.done, st.draft, st.draft_len)), _ptr(flags),
                                 st.batch, draft.shape[1], q_prob, bits, st.q_prob.shape[2])

    def _torch_policy(self, policy, method: str) -> bool:
        """Whether the policy's `method` runs as torch ops: on CUDA, in a step being compiled, and for a policy
        that does it its own way (a subclass's); on the CPU otherwise csrc/policy.h does it, the same float32
        operations request by request."""
        its_own = getattr(type(policy), method) is not getattr(rules.Policy, method)
        return self.cuda or torch.compiler.is_compiling() or its_own

    def observe(self, policy, st, ran: torch.Tensor, emitted: torch.Tensor, verified_lookup: torch.Tensor,
                passive: torch.Tensor | None = None) -> None:
        if self._torch_policy(policy, "observe"):
            return policy.observe(st, ran, emitted, verified_lookup, passive)
        c = policy.constants(self.device)
        passive = torch.zeros_like(st.done) if passive is None else passive
        ran, emitted, verified_lookup, passive = _contiguous(ran, emitted, verified_lookup, passive)
        _check_contiguous(st.diffusion, st.ran, st.done)
        rows = (st.diffusion, st.ran, c.diffusion_prior, c.packed, ran, emitted, verified_lookup, st.done, passive)
        self.mod.observe_cpu(*(t.data_ptr() for t in rows), st.batch, len(policy.packed), rules.RATE, rules.DRIFT)

    def score_lookup(self, policy, st, draft: torch.Tensor, length: torch.Tensor, order: torch.Tensor,
                     passive: torch.Tensor | None = None) -> None:
        if self._torch_policy(policy, "score_lookup"):
            return policy.score_lookup(st, draft, length, order, passive)
        passive = torch.zeros_like(st.done) if passive is None else passive
        if draft.shape[1] != policy.width:
            raise ValueError(f"score_lookup: the draft is {draft.shape[1]} wide, the policy {policy.width}")
        draft, length, order, passive = _contiguous(draft, length, order, passive)
        written = (st.look_hit, st.look_order, st.probe, st.probe_len, st.probe_at, st.probe_order)
        _check_contiguous(*written, st.out, st.n_out, st.done)
        rows = (*written, st.out, st.n_out, draft, length, order, st.done, passive)
        self.mod.score_lookup_cpu(*(t.data_ptr() for t in rows), st.batch, policy.width, st.look_hit.shape[1],
                                  st.out.shape[1], rules.RATE)

    def prefers_lookup(self, policy, st, length: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        if self._torch_policy(policy, "prefers_lookup"):
            return policy.prefers_lookup(st, length, order)
        length, order = _contiguous(length, order)
        _check_contiguous(st.look_hit, st.diffusion)
        preferred = torch.empty_like(st.done)
        self.mod.prefers_lookup_cpu(*(t.data_ptr() for t in (st.look_hit, st.diffusion, length, order)), st.batch,
                                    policy.width, st.look_hit.shape[1], len(policy.packed), preferred.data_ptr())
        return preferred

    def choose(self, policy, st, length: torch.Tensor, order: torch.Tensor, passive: torch.Tensor | None = None):
        if self._torch_policy(policy, "choose"):
            return policy.choose(st, length, order, passive)
        c = policy.constants(self.device)
        passive = torch.zeros_like(st.done) if passive is None else passive
        rows = (st.look_hit, st.look_order, st.diffusion, *_contiguous(length, order), st.done,
                *_contiguous(passive, st.sampling.temperature == 0), st.queued, st.nfe)
        written = (st.choice, st.quiet_until, st.quiet_run)
        _check_contiguous(*rows, *written)
        self.mod.choose_cpu(*(t.data_ptr() for t in (c.costs, c.widths, c.masks, c.estimate)), len(policy.shapes),
                            policy.width, st.look_hit.shape[1], len(policy.packed), policy.row, policy.call,
                            rules.MARGIN, rules.COST_BATCH, rules.DOZE, *rules.QUIET_RUNS, policy.per_request,
                            *(t.data_ptr() for t in rows + written), st.batch)

    def _step(self, st, verify, token, propose, retain) -> None:
        kind = self.mod.VERIFY_DRAFT if verify is not None else (self.mod.VERIFY_ONE if token is not None
                                                                  else self.mod.VERIFY_NONE)
        self._call(st, self.mod.PHASE_BOTH, kind, verify if verify is not None else token, propose, retain)

    def verify(self, st: DecodeState, verify: Rows, residual: torch.Tensor | None = None) -> Verified:
        """The emitted tokens [B, block] and A [B] go into a result buffer, which the commit reads."""
        res = self._call(st, self.mod.PHASE_VERIFY, self.mod.VERIFY_DRAFT, verify, None, None, residual)
        return Verified(res[:, :self.block], res[:, self.block], res)

    def _commit(self, st, verified, propose, retain) -> None:
        self._call(st, self.mod.PHASE_COMMIT, self.mod.VERIFY_DRAFT, None, propose, retain, verified=verified.draws)

    # -- plumbing --------------------------------------------------------------------------------------
    def _state(self, st: DecodeState):
        """The native handle of `st` (raw addresses, batch size, per-request strides), made once per state
        object: keyed by id(st), holding st so that its addresses (and its id) stay valid."""
        bound = self._bound.get(id(st))
        if bound is not None and bound[0] is st:
            return bound[1]
        w = self.width
        t = {f.name: getattr(st, f.name) for f in fields(DecodeState)}   # a subclass's extra fields are not ours
        batch = st.cache_len.shape[0] if st.cache_len.dim() == 1 else -1
        if batch < 0:
            raise ValueError(f"DecodeState.cache_len must be [B], got shape {tuple(st.cache_len.shape)}")
        for name, value in t.items():
            if value.device != self.device:
                raise ValueError(f"DecodeState.{name} is on {value.device}, the epilogue on {self.device}")
            if not value.is_contiguous():
                raise ValueError(f"DecodeState.{name} must be contiguous")
            want = {"done": torch.bool, "temperature": torch.float64, "top_p": torch.float64}.get(name, torch.int64)
            if name == "q_prob":
                if value.dtype not in (torch.float32, torch.float64):
                    raise ValueError(f"DecodeState.q_prob must be float32 or float64, got {value.dtype}")
            elif value.dtype != want:
                raise ValueError(f"DecodeState.{name} must be {want}, got {value.dtype}")
            dims = {"draft": 2, "q_idx": 3, "q_prob": 3, "out": 2, "stop_ids": 2, "stop_seqs": 3, "accepted_at": 2,
                    "context": 2}.get(name, 1)
            if value.dim() != dims or value.shape[0] != batch:
                raise ValueError(f"DecodeState.{name} must have {dims} dimensions, the first the batch size "
                                 f"{batch}; got shape {tuple(value.shape)}")
        if st.draft.shape[1] != w or st.q_idx.shape[1] != w or st.q_prob.shape != st.q_idx.shape:
            raise ValueError(f"DecodeState draft / Q shapes do not match width {w}")
        # DecodeState.new sizes `out` for max_new + 2B: emit writes B slots past n_out.
        handle = self.mod.State(*(t[n].data_ptr() for n in (
            "cache_len", "last", "draft", "draft_len", "q_idx", "q_prob", "out", "n_out", "done", "seed", "offset",
            "stop_ids", "max_new", "nfe", "n_verify", "n_accepted", "n_bonus")),
            w, st.q_idx.shape[2], st.stop_ids.shape[1], batch, st.out.shape[1], st.q_prob.element_size())
        if len(self._bound) >= self._BOUND_MAX:
            self._bound.pop(next(iter(self._bound)))   # the oldest
        self._bound[id(st)] = (st, handle)
        return handle

    def _scratch_for(self, dtype: torch.dtype, vocab: int, batch: int) -> torch.Tensor:
        key = (dtype, vocab, batch)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(batch, vocab, dtype=dtype, device=self.device)
        return self._scratch[key]

    def _check(self, rows: Rows | None, what: str, batch: int, need: int) -> tuple[int, int, int]:
        """(row count R, K, per-request row stride) of rows [B, R(, K)], after checking them."""
        if rows is None:
            return 0, 0, 0
        if rows.arg is not None:
            tensors = [rows.arg]
        elif rows.prob is not None:
            tensors = [rows.prob] + ([] if rows.idx is None else [rows.idx])
        else:
            raise ValueError(f"{what} rows are empty")
        dims = 2 if rows.arg is not None else 3
        for t in tensors:
            if t.device != self.device:
                raise ValueError(f"{what} rows must be on {self.device}, got {t.device}")
            if t.dim() != dims or t.shape[0] != batch:
                raise ValueError(f"{what} rows must be [B={batch}, R{', K' if dims == 3 else ''}], got shape "
                                 f"{tuple(t.shape)}")
        if rows.arg is not None and rows.arg.dtype != torch.int64:
            raise ValueError(f"{what} argmax rows must be int64")
        if rows.prob is not None and rows.prob.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{what} probabilities must be float32 or float64")
        if rows.idx is not None and (rows.idx.dtype != torch.int64 or rows.idx.shape != rows.prob.shape):
            raise ValueError(f"{what} rows must be int64 idx and prob of one shape")
        n_rows = tensors[0].shape[1]
        if n_rows < need:
            raise ValueError(f"{what}: {need} rows needed per request, got {n_rows}")
        strides = {_row_stride(t, what) for t in tensors}
        if len(strides) != 1:
            raise ValueError(f"{what} rows: idx and prob are laid out differently ({rows.idx.stride()} against "
                             f"{rows.prob.stride()})")
        return n_rows, 0 if dims == 2 else tensors[0].shape[2], strides.pop()

    def _call(self, st, phase, kind, v: Rows | None, z: Rows | None, retain, residual=None,
              verified: torch.Tensor | None = None) -> torch.Tensor:
        """One native call for the batch; returns its result buffer [B, block + 2] (a commit's: `verified`, its
        verify's). A step being compiled calls it through the torch operator (operator.py), with buffers of its
        own; an eager one directly."""
        compiling = torch.compiler.is_compiling()
        handle = None if compiling else self._state(st)   # checks the state (a compiled one: the engine's)
        batch = st.done.shape[0]
        greedy = not self.sampled
        v_rows, v_k, v_stride = self._check(v, "verifier", batch, 1 if v is not None else 0)
        n_z, z_k, z_stride = self._check(z, "proposal", batch, 1 if retain is not None else 0)
        if retain is None:
            retain_code = self.mod.RETAIN_NONE
        elif retain == "a":
            retain_code = self.mod.RETAIN_SHIFT_A
        else:
            retain_code = int(retain)
        prob = v.prob if v is not None and v.prob is not None else (z.prob if z is not None else None)
        dense = not greedy and all(r.idx is None for r in (v, z) if r is not None and r.prob is not None)
        if not greedy and not dense and any(r.idx is None for r in (v, z) if r is not None and r.prob is not None):
            raise ValueError("verifier and proposal rows: dense and sparse distributions cannot mix")
        bits = 64 if prob is not None and prob.dtype == torch.float64 else 32
        if v is not None and z is not None and v.prob is not None and v.prob.dtype != z.prob.dtype:
            raise ValueError("verifier and proposal probabilities must share a dtype")
        if prob is not None and st.q_prob.dtype != prob.dtype:
            raise ValueError(f"DecodeState.q_prob is {st.q_prob.dtype}, the rows' probabilities {prob.dtype}: the "
                             "stored Q must be in the probabilities' dtype")
        vocab = (v.vocab if v is not None else 0) or (z.vocab if z is not None else 0)
        scratch = None
        if not greedy and kind == self.mod.VERIFY_DRAFT and v is not None:
            scratch = (torch.empty(batch, vocab, dtype=v.prob.dtype, device=self.device) if compiling
                       else self._scratch_for(v.prob.dtype, vocab, batch))
        if residual is not None:
            if (residual.dtype != torch.int64 or residual.shape != (batch,) or residual.device != self.device
                    or not residual.is_contiguous()):
                raise ValueError(f"residual must be a contiguous int64 [B={batch}] tensor on {self.device}, got "
                                 f"{residual.dtype} {tuple(residual.shape)} on {residual.device}")
        v, z = v if v is not None else Rows(), z if z is not None else Rows()
        if compiling:
            res = verified if verified is not None else torch.zeros(batch, self.block + 2, dtype=torch.int64,
                                                                    device=self.device)
            tensors = st.tensors()
            epilogue_step(*(tensors[name] for name in STATE), v.arg, v.idx, v.prob, z.arg, z.idx, z.prob, scratch,
                          res, residual, [bits, phase, kind, retain_code, int(not greedy), int(dense),
                                          self.block, vocab, v_rows, v_k, v_stride, z_k, z_stride, n_z])
            return res
        res = verified if verified is not None else self._use_res(batch)
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.cuda else 0
        self._native_step(handle, bits, phase, kind, retain_code, not greedy, dense, self.block, vocab,
                          _ptr(v.arg), _ptr(v.idx), _ptr(v.prob), v_rows, v_k, v_stride,
                          _ptr(z.arg), _ptr(z.idx), _ptr(z.prob), z_k, z_stride, n_z,
                          _ptr(scratch), res.data_ptr(), _ptr(residual), stream)
        return res
