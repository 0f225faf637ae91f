"""The compiled step epilogue (csrc/, module `packed_ss._epilogue`): loading it, and calling it from a schedule.

One decode step ends with acceptance, the correction or bonus draw, emit with the stop rules, the cache
length advance and the retain of the proposal suffix with its Q. The torch reference of that is
acceptance.py + state.py + Schedule.propose; csrc/epilogue.h does the same in one call per step (one
thread block per sequence on CUDA) and reproduces the reference bit for bit on the CPU.

What it consumes: the model's logits stay in torch, and so does their processing, through the same
functions the reference uses: under greedy decoding the argmax of each verifier / proposal row, under
sampling `truncated_probs` of those rows (sparse idx/prob, sorted by decreasing probability). What it
produces: the updated DecodeState, in place, and A (n_accept) in a small device buffer.

The module is optional: `native_available(device)` says whether it can serve a device, and
`native_unavailable_reason(device)` why not (not built, built without CUDA, no GPU).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from .sampling import SamplingParams, truncated_probs
from .state import DecodeState

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


@dataclass
class Rows:
    """A run of model rows as the epilogue consumes them: argmax `arg` [R] (greedy), or the truncated
    distribution (`idx`, `prob`) [R, K] (sampled); `idx` is None when the distribution is dense (idx = token)."""
    arg: torch.Tensor | None = None
    idx: torch.Tensor | None = None
    prob: torch.Tensor | None = None
    vocab: int = 0

    def __getitem__(self, rows: slice) -> "Rows":
        if self.arg is not None:
            return Rows(arg=self.arg[rows], vocab=self.vocab)
        return Rows(idx=None if self.idx is None else self.idx[rows], prob=self.prob[rows], vocab=self.vocab)

    def __len__(self) -> int:
        t = self.arg if self.arg is not None else self.prob
        return 0 if t is None else t.shape[0]

    @property
    def k(self) -> int:
        return 0 if self.prob is None else self.prob.shape[1]


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class NativeEpilogue:
    """The compiled epilogue for one schedule instance: its width, sampling parameters and device.

    `rows(logits)` turns logits into what the epilogue consumes; `step` runs one fused epilogue call;
    `verify` + `commit` split it where a schedule picks its proposal rows from the verification outcome
    (Quadratic-SS). Calls are asynchronous on CUDA (the current stream) and capturable in a CUDA graph.
    """

    def __init__(self, device, width: int, params: SamplingParams):
        reason = native_unavailable_reason(device)
        if reason is not None:
            raise RuntimeError(reason)
        self.mod = native_module()
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:   # tensors report cuda:N
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = self.device.type == "cuda"
        self._step = self.mod.step_cuda if self.cuda else self.mod.step_cpu
        self.width, self.block, self.params = width, width + 1, params
        # Untruncated sampling: truncated_probs returns the dense softmax with idx = token id (an expanded
        # arange); the native path then skips the index arrays (and does not maintain DecodeState.q_idx).
        self.dense = not params.greedy and params.top_k is None and params.top_p is None
        self.vocab = 0
        self.res = torch.zeros(self.block + 2, dtype=torch.int64, device=self.device)
        self.n_accept = self.res[self.block]   # A of the last verification (a 0-d view)
        self._scratch: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._bound: tuple[DecodeState, object] | None = None

    # -- inputs ----------------------------------------------------------------------------------------
    def rows(self, logits: torch.Tensor) -> Rows:
        """Argmax (greedy) or truncated distribution (sampled) of every row of logits [R, V]."""
        vocab = self.vocab = logits.shape[-1]
        if self.params.greedy:
            return Rows(arg=logits.argmax(-1), vocab=vocab)
        idx, prob = truncated_probs(logits, self.params)
        if self.dense and idx.shape[-1] != vocab:   # its contract: untruncated means idx = token id
            raise RuntimeError("truncated_probs no longer returns the dense distribution for untruncated sampling")
        return Rows(idx=None if self.dense else idx.contiguous(), prob=prob.contiguous(), vocab=vocab)

    # -- calls -----------------------------------------------------------------------------------------
    def step(self, st: DecodeState, *, verify: Rows | None = None, token: Rows | None = None,
             propose: Rows | None = None, retain: str | int | None = None) -> None:
        """One epilogue call: verify the stored draft against `verify` (B rows), or draw one AR token from
        `token` (row 0); emit; then, if `retain` is given, the next draft is `propose`[shift:] with its Q,
        shift = the emitted count ("a") or a fixed number of rows."""
        kind = self.mod.VERIFY_DRAFT if verify is not None else (self.mod.VERIFY_ONE if token is not None
                                                                  else self.mod.VERIFY_NONE)
        self._call(st, self.mod.PHASE_BOTH, kind, verify if verify is not None else token, propose, retain)

    def verify(self, st: DecodeState, verify: Rows) -> torch.Tensor:
        """First half of a draft verification: the emitted tokens and A, into `res`. Returns A (0-d view)."""
        self._call(st, self.mod.PHASE_VERIFY, self.mod.VERIFY_DRAFT, verify, None, None)
        return self.n_accept

    def commit(self, st: DecodeState, *, propose: Rows | None, retain: str | int | None) -> None:
        """Second half, after `verify`: emit, count, retain."""
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
        if st.out.numel() < int(st.max_new) + self.block:   # once per state: emit writes B slots past n_out
            raise ValueError("DecodeState.out is too short for max_new + block")
        handle = self.mod.State(*(t[n].data_ptr() for n in (
            "cache_len", "last", "draft", "draft_len", "q_idx", "q_prob", "out", "n_out", "done", "seed", "offset",
            "stop_ids", "max_new", "nfe", "n_verify", "n_accepted")), w, st.q_idx.shape[1], st.stop_ids.numel())
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

    def _call(self, st, phase, kind, v: Rows | None, z: Rows | None, retain) -> None:
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
        self._step(handle, bits, phase, kind, retain_code, not greedy, self.dense, self.block, self.vocab,
                   _ptr(v.arg), _ptr(v.idx), _ptr(v.prob), v.k, _ptr(z.arg), _ptr(z.idx), _ptr(z.prob), z.k,
                   n_z, scratch, self.res.data_ptr(), stream)


# -- build check: python -m packed_ss.epilogue [--strict] ------------------------------------------------------
def _find_tool(name: str, near: str | None = None) -> str | None:
    import shutil
    from pathlib import Path

    candidates = [shutil.which(name)]
    if near:
        candidates.append(str(Path(near).resolve().parent / name))
    try:   # Triton's wheel carries cuobjdump
        import triton
        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name))
    except ImportError:
        pass
    return next((c for c in candidates if c and Path(c).is_file()), None)


def check_build(strict: bool = False) -> list[str]:
    """Problems with the native build: the module must import and agree with the torch Philox; where nvcc
    exists (found as setup.py finds it) it must carry CUDA kernels for sm_80 and sm_90. `strict` (CI)
    treats a missing module as a problem; otherwise it is reported as a notice by main()."""
    import os
    import shutil
    import subprocess

    from .sampling import philox_uniform

    problems = []
    mod = native_module()
    if mod is None:
        return [f"the native epilogue is not built: {_error}"] if strict else []
    want = philox_uniform(torch.tensor(7), torch.tensor(2**33 + 5), 9).tolist()
    if [mod.philox_uniform(7, 2**33 + 5, i) for i in range(9)] != want:
        problems.append("the native Philox disagrees with packed_ss.sampling.philox_uniform")
    nvcc = next((c for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc")
                 if c and os.path.isfile(c)), None)
    if nvcc and os.environ.get("PACKED_SS_CUDA", "1").strip().lower() not in ("0", "false", "no"):
        if not mod.HAS_CUDA:
            problems.append(f"nvcc exists ({nvcc}) but the module was built without its CUDA part")
        elif set(mod.CUDA_ARCHS.split(",")) != {"80", "90"}:
            problems.append(f"the CUDA part targets sm {mod.CUDA_ARCHS}, not 80 and 90")
        else:
            cuobjdump = _find_tool("cuobjdump", nvcc)
            if cuobjdump is None:
                print("packed-ss: no cuobjdump found; trusting the compiled-in architecture list")
            else:
                listing = subprocess.run([cuobjdump, "--list-elf", mod.__file__], capture_output=True, text=True)
                for arch in ("sm_80", "sm_90"):
                    if f".{arch}.cubin" not in listing.stdout:
                        problems.append(f"no {arch} machine code in {mod.__file__} ({listing.stdout.strip()})")
    return problems


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packed_ss.epilogue",
                                     description="Report (and with --strict, require) the native epilogue build.")
    parser.add_argument("--strict", action="store_true", help="fail if the module or its CUDA part is missing")
    args = parser.parse_args(argv)
    mod = native_module()
    if mod is None:
        print(f"packed-ss native epilogue: not built ({_error})")
    else:
        print(f"packed-ss native epilogue: {mod.__file__}; CUDA part: "
              f"{'sm ' + mod.CUDA_ARCHS if mod.HAS_CUDA else 'no'}")
        for device in ("cpu", "cuda"):
            print(f"  {device}: {native_unavailable_reason(device) or 'available'}")
    problems = check_build(args.strict)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
