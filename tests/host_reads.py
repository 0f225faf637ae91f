"""Counting host reads of tensor data: every point where Python (or a data-dependent op) needs a tensor's values.

    with count_host_reads() as reads:
        res = engine.generate(...)
    assert reads.reads <= res.nfe + 4, reads.summary()

A *host read* is one logical act of pulling tensor values to the host: on a GPU each one is a device
synchronisation; on the CPU it is the same point in the program, so counting it there tells what a GPU
run would pay. Two layers see them:

- Python-level: the `torch.Tensor` methods that turn values into Python objects (`item`, `tolist`,
  `__bool__`, `__int__`, `__float__`, `__index__`, `__complex__`, `cpu`, `numpy`, `__repr__`,
  `__format__`) are wrapped for the duration of the block and restored on exit, even on error.
- Dispatch-level: a TorchDispatchMode sees the aten ops whose output shape or value depends on tensor
  data (`nonzero`, `masked_select`, boolean-mask indexing, `_local_scalar_dense` (what C++ `.item()`
  dispatches), `unique*`, `equal`, `repeat_interleave` without `output_size`, `bincount`, ...) and
  copies from a non-CPU device to the CPU. Tensors created under `torch.inference_mode()` dispatch
  through the mode too, but there CompositeImplicitAutograd ops (`item`, `is_nonzero`, `where(cond)`)
  arrive whole, so the mode decomposes them under itself to see the reads they are made of
  (tests/test_host_reads.py checks both modes).

One logical read is counted once: while a wrapped method runs, the dispatch events it triggers (e.g.
`.item()` -> `_local_scalar_dense`, `bool(t)` -> `is_nonzero` -> `_local_scalar_dense`) and nested
wrapped calls (`__format__` -> `item`) are ignored. Reads of CPU tensors count like any other: a host
staging buffer read with `.tolist()` is the one read an iteration is allowed. Only the thread that
entered the block is counted, and only inside the block, so pytest's own reprs do not count.

The logits processing skips, on the CPU, work no request of a batch asks for, and the torch attention reads only
the pages its rows see, found by host reads that cost nothing there (`packed_ss.host.reads_are_free`); inside the
block both take the device path, which reads nothing, so that the count is what a GPU run would pay.

Not seen: C++ extensions that read tensor memory through `data_ptr()` (the native epilogue on the
CPU) and syncs inside a kernel launch; `copy_(..., non_blocking=True)` into a pinned buffer is not a
read (reading that buffer afterwards is).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from packed_ss import host

# Tensor methods that hand tensor values to Python.
METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__",
           "cpu", "numpy", "__repr__", "__format__")

_aten = torch.ops.aten


def _packets(*names):
    return {getattr(_aten, n) for n in names if hasattr(_aten, n)}


# aten overload packets whose every call is a read (data-dependent output shape or a Python scalar).
DATA_DEPENDENT = _packets(
    "_local_scalar_dense", "nonzero", "nonzero_numpy", "argwhere", "masked_select", "unique", "_unique",
    "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive", "equal", "is_nonzero",
    "bincount", "allclose",
)
# Ops that read only when an index is a boolean (or uint8) mask.
MASK_INDEXED = _packets("index", "_index_put_impl_", "index_put", "index_put_")
_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


@dataclass
class Read:
    kind: str                 # "item", "__bool__", "aten.nonzero", "aten.index[bool]", ...
    site: str                 # innermost caller frame outside torch and this file: "file.py:123 in f"
    stack: list[str] = field(default_factory=list)   # a few frames outward from `site`


@dataclass(repr=False)
class HostReads:
    """What `count_host_reads()` yields: `reads` (total), `by_kind`, `by_site` ((kind, site) -> count),
    and the first `keep` reads with a short stack (`events`)."""
    reads: int = 0
    by_kind: Counter = field(default_factory=Counter)
    by_site: Counter = field(default_factory=Counter)
    events: list[Read] = field(default_factory=list)
    keep: int = 20
    frames: int = 4

    def _record(self, kind: str, skip: int) -> None:
        self.reads += 1
        self.by_kind[kind] += 1
        stack = _caller_stack(sys._getframe(skip), self.frames)
        site = stack[0] if stack else "?"
        self.by_site[(kind, site)] += 1
        if len(self.events) < self.keep:
            self.events.append(Read(kind, site, stack))

    def summary(self, sites: int = 12) -> str:
        """Total, per kind, and the most frequent (kind, site) pairs: for assertion messages."""
        lines = [f"{self.reads} host reads: " + ", ".join(f"{k}={n}" for k, n in self.by_kind.most_common())]
        for (kind, site), n in self.by_site.most_common(sites):
            lines.append(f"  {n:5d} x {kind:<22s} {site}")
        if len(self.by_site) > sites:
            lines.append(f"  ... {len(self.by_site) - sites} more sites")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"HostReads({self.reads}: {dict(self.by_kind.most_common())})"


def _caller_stack(frame, n: int) -> list[str]:
    """Up to n frames, innermost first, starting at the first one outside torch and this file."""
    out = []
    while frame is not None and len(out) < n:
        path = os.path.abspath(frame.f_code.co_filename)
        if out or not (path == _HERE or path.startswith(_TORCH_DIR) or path.startswith("<")):
            rel = os.path.relpath(path) if not path.startswith("<") else path
            if len(rel) > len(path):
                rel = path
            out.append(f"{rel}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return out


class _Active:
    """The one counter in force (blocks nest: an inner block counts, the outer is paused meanwhile)."""
    counter: HostReads | None = None
    thread: int | None = None
    local = threading.local()   # depth: > 0 while a wrapped method runs (its inner events are ignored)


def _depth() -> int:
    return getattr(_Active.local, "depth", 0)


def _counting() -> bool:
    return _Active.counter is not None and threading.get_ident() == _Active.thread and _depth() == 0


def _wrap(name, original):
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if _counting():
            _Active.counter._record(name, 1)
        _Active.local.depth = _depth() + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _Active.local.depth -= 1
    wrapper.__host_read_wrapper__ = True
    return wrapper


def _is_mask(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _device_to_host(func, args, kwargs, out) -> bool:
    """A blocking copy from a non-CPU device to the CPU (`.to("cpu")`, `copy_` into a CPU tensor)."""
    packet = func.overloadpacket
    if packet is _aten._to_copy:
        src = args[0]
        return (isinstance(out, torch.Tensor) and out.device.type == "cpu"
                and isinstance(src, torch.Tensor) and src.device.type != "cpu")
    if packet is _aten.copy_:
        dst, src = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        return (dst.device.type == "cpu" and isinstance(src, torch.Tensor) and src.device.type != "cpu"
                and not non_blocking)
    return False


def kind_of(func, args, kwargs, out=None, lifted=None) -> str | None:
    """The read kind of one aten call, or None if the call does not read tensor data on the host.

    `lifted`: the tensor the last `lift_fresh` made from a Python scalar (a `t[mask] = 0.` value)."""
    packet = func.overloadpacket
    if packet in DATA_DEPENDENT:
        return f"aten.{packet.__name__}"
    if packet in MASK_INDEXED:
        indices = [t for t in (args[1] if len(args) > 1 else kwargs.get("indices", ())) if t is not None]
        if not any(_is_mask(t) for t in indices):
            return None
        value = args[2] if len(args) > 2 else kwargs.get("values")
        if packet is not _aten.index and len(indices) == 1 and value is not None and value is lifted:
            return None   # `t[mask] = 0.`: aten makes it a masked_fill_ with the Python scalar, no read
        return f"aten.{packet.__name__}[bool]"
    if packet is _aten.repeat_interleave:
        # repeats given as a tensor: the output length is their sum, unless output_size gives it
        if "Tensor" in func._overloadname and kwargs.get("output_size") is None:
            return "aten.repeat_interleave"
        return None
    if _device_to_host(func, args, kwargs, out):
        return "device_to_host"
    return None


@functools.lru_cache(maxsize=None)
def _composite(func) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


class _DataDependentMode(TorchDispatchMode):
    lifted = None
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _counting() and _composite(func):
            # Under inference_mode (autograd keys excluded) a CompositeImplicitAutograd op such as
            # `item`, `is_nonzero`, `where(cond)` reaches this mode whole, and running it here would hide
            # the `_local_scalar_dense` / `nonzero` it is made of: decompose it with the mode still on.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if _counting():
            if func.overloadpacket is _aten.lift_fresh:
                self.lifted = out
                return out
            kind = kind_of(func, args, kwargs, out, self.lifted)
            self.lifted = None
            if kind is not None:
                _Active.counter._record(kind, 1)
        return out


@contextlib.contextmanager
def count_host_reads(keep: int = 20, frames: int = 4):
    """Count host reads made by this thread inside the block; yields a HostReads (see the module doc).

    `keep`: how many reads keep a stack (`events`); `frames`: frames per stack. Blocks nest (the inner one
    counts alone while it runs)."""
    counter = HostReads(keep=keep, frames=frames)
    saved = {name: torch.Tensor.__dict__.get(name, _MISSING) for name in METHODS}
    free = host.reads_are_free
    host.reads_are_free = lambda t: False      # the logits processing and the attention take the path a GPU takes
    outer = (_Active.counter, _Active.thread)
    if outer[0] is None:   # the outermost block installs the wrappers; nested blocks reuse them
        for name in METHODS:
            setattr(torch.Tensor, name, _wrap(name, getattr(torch.Tensor, name)))
    try:
        with _DataDependentMode():
            _Active.counter, _Active.thread = counter, threading.get_ident()
            try:
                yield counter
            finally:
                _Active.counter, _Active.thread = outer
    finally:
        host.reads_are_free = free
        if outer[0] is None:
            for name, value in saved.items():
                if value is _MISSING:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, value)


@contextlib.contextmanager
def paused():
    """Inside a counting block: a stretch whose reads do not count (e.g. a test's own checks)."""
    _Active.local.depth = _depth() + 1
    try:
        yield
    finally:
        _Active.local.depth -= 1


_MISSING = object()
