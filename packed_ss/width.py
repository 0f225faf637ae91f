"""width="auto": the draft width that maximises expected tokens per second on this model and device.

Two measurements meet here:
- the drafter's acceptance profile (draft_profile.json beside the drafting adapter, or in the model
  directory for the model's own drafter; `python -m packed_ss train-drafter` writes it): expected tokens
  per iteration at each width W = 1..Wp, replayed on the model's own greedy continuations, once for drafts
  from the current prefix ("fresh": Linear-SS, Quadratic-SS), once for the previous call's proposals
  ("lagged": Packed-SS) and, for any-order models, once for the branch drafted before the correction token
  ("branch": their Quadratic-SS; profile_kind);
- the per-call latency tau + delta * rows, fitted once per (model, device, dtype, attention backend) and
  process from a few timed calls at the row counts the candidate widths use; in eager mode tau also holds
  what each call of the decode step spends beyond the model (inputs, epilogue, poll: step_overhead), which
  on a CPU is as large as the model call's own fixed cost and favours wider calls.
An iteration of schedule s at width W costs sum over its calls (tau + delta * rows); W = argmax of
tokens(W) / cost(W) over 1..min(Wp, block_size - 1), the smallest on a tie. Without a profile (or for the
AR and threshold schedules) the width is the fixed default. The choice is made once per engine, so a step has
one shape (one compiled graph) per engine.

Timings vary with the moment (a busy machine measured once picked W = 14 where a quiet one picked 3), and a
width changes which sample a seed gives. So a choice is measured once per machine and install and remembered
(`remembered`): in `auto_widths.json` under PACKED_SS_CACHE_DIR (default ~/.cache/packed-ss), keyed by the
model's contents, the device, dtype, thread count, torch and packed-ss versions and every engine setting the
choice depends on; the file is locked while a choice is measured, so concurrent processes measure once and
all read the same width.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from .model.attention import Layout

PROFILE_FILE = "draft_profile.json"
CACHE_ENV = "PACKED_SS_CACHE_DIR"
CHOICES_FILE = "auto_widths.json"
PROFILE_KINDS = ("fresh", "lagged", "branch")   # the replays a profile holds; "branch" for any-order models only
LOOKUP_KINDS = ("lookup", "fresh+lookup", "lagged+lookup")   # with lookup drafts (left to right; optional in a file)
CACHED_TOKENS = 256
REPS = 5
PROBE_TOKENS = (8, 40)     # new tokens of the short and the long decode step_overhead compares


@dataclass(frozen=True)
class CallCost:
    tau_ms: float
    delta_ms: float

    def iteration_ms(self, rows: list[int]) -> float:
        return sum(self.tau_ms + self.delta_ms * r for r in rows)


_costs: dict[tuple, CallCost] = {}     # per process: (model, device, dtype, backend, row counts) -> fit
_overheads: dict[tuple, float] = {}    # per process: (model, schedule, epilogue, ...) -> ms per call


def read_profile(path: str | Path) -> dict | None:
    """The acceptance profile in directory `path` (its PROFILE_FILE) or in the file `path` (None when there is
    none)."""
    file = Path(path) if Path(path).is_file() else Path(path) / PROFILE_FILE
    if not file.is_file():
        return None
    profile = json.loads(file.read_text())
    width = profile.get("width")
    for kind in profile_kinds(any_order="branch" in profile) + tuple(k for k in LOOKUP_KINDS if k in profile):
        values = profile.get(kind)
        if not (isinstance(values, list) and len(values) == width and all(v >= 1 for v in values)):
            raise ValueError(f"{file}: {kind!r} must list expected tokens per iteration (each >= 1) for widths "
                             f"1..{width}")
    return profile


def profile_kinds(any_order: bool) -> tuple[str, ...]:
    """The replays a profile holds: "fresh" and "lagged", and for an any-order model "branch" too."""
    return PROFILE_KINDS if any_order else tuple(k for k in PROFILE_KINDS if k != "branch")


def profile_kind(replay: str | None, drafts: str | None = None) -> str | None:
    """The profile's replay that predicts a schedule's tokens per iteration (its class's `replay`), e.g.
    Linear-SS drafts from the current prefix ("fresh"), Packed-SS verifies the previous call's proposal
    ("lagged"), Quadratic-SS the branch that verification selects, which has seen the accepted drafts and, left
    to right, the correction token too ("fresh"); an any-order branch has not ("branch"). With lookup drafts
    (`drafts`, Engine): "lookup" alone, or "<kind>+lookup", the lookup draft from the current prefix where it
    finds one and the kind's draft elsewhere. None for schedules without a replay."""
    if replay is None:
        return None
    if drafts == "lookup":
        return "lookup"
    return f"{replay}+lookup" if drafts == "both" else replay


def choose_width(tokens: list[float], rows_of: Callable[[int], list[int]], cost: CallCost) -> int:
    """The width W in 1..len(tokens) maximising tokens[W-1] / cost.iteration_ms(rows_of(W)); ties: smallest."""
    if not tokens:
        raise ValueError("tokens must list expected tokens per iteration for widths 1.., got an empty list")
    rates = [t / cost.iteration_ms(rows_of(w)) for w, t in enumerate(tokens, 1)]
    return max(range(len(rates)), key=lambda i: (rates[i], -i)) + 1


def call_cost(model, attend, backend: str, rows: list[int]) -> CallCost:
    """tau + delta * rows fitted to the median time of REPS calls at each row count in `rows` (call_times);
    measured once per process for each key."""
    key = (id(model), str(model.device), model.dtype, backend, tuple(sorted(set(rows))))
    if key in _costs:
        return _costs[key]
    points = call_times(model, attend, list(key[-1]))
    if len(points) == 1:
        cost = CallCost(points[0][1], 0.0)
    else:
        fit = statistics.linear_regression([float(n) for n, _ in points], [ms for _, ms in points])
        cost = CallCost(max(fit.intercept, 1e-6), max(fit.slope, 0.0))
    _costs[key] = cost
    return cost


@torch.inference_mode()
def call_times(model, attend, rows: list[int], reps: int = REPS,
               cached: int = CACHED_TOKENS) -> list[tuple[int, float]]:
    """(n, median ms) of `reps` timed calls at each row count n in `rows`, after two untimed ones: cached-only
    drafting-shaped calls over `cached` cached tokens, the shape every schedule's wide call has."""
    device = model.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cache = model.new_cache(cached + max(rows))
    cache_len = torch.tensor(cached, device=device)
    points = []
    for n in rows:
        lay = Layout(0, torch.ones(n, dtype=torch.int64, device=device), torch.full((n,), -1, device=device), 0)
        tokens = torch.full((n,), model.cfg.mask_token_id or 0, device=device)   # any token: a timing
        positions = cache_len + torch.arange(n, device=device)
        times = []
        for _ in range(reps + 2):
            sync()
            t0 = time.perf_counter()
            model(tokens, positions, lay, cache, cache_len, attend=attend)
            sync()
            times.append(time.perf_counter() - t0)
        points.append((n, 1e3 * statistics.median(times[2:])))
    return points


def step_overhead(key: tuple, decode: Callable[[int], object], model_ms_per_call: float) -> float:
    """Milliseconds each call of a decode step spends beyond its model call (`model_ms_per_call`, from the fit):
    building inputs, the epilogue, the poll. `decode(n)` runs one greedy request of n new tokens and returns
    its GenerateResult; the wall time per call between a short and a long one (the prefill cancels), the
    faster of two runs each, less the model's share. Measured once per process for each `key`."""
    if key not in _overheads:
        short, long = (min((decode(n) for _ in range(2)), key=lambda r: r.wall_s) for n in PROBE_TOKENS)
        per_call_ms = 1e3 * (long.wall_s - short.wall_s) / max(long.nfe - short.nfe, 1)
        _overheads[key] = max(per_call_ms - model_ms_per_call, 0.0)
    return _overheads[key]


# -- remembering a choice ------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "packed-ss")


@torch.inference_mode()
def model_fingerprint(model) -> str:
    """A digest of the model's config and weights (names, shapes, and the sum and sum of squares of a strided
    sample of each tensor, read in one transfer): two loads of the same files agree, another model does not."""
    tensors = model.state_dict()
    stats = torch.stack([torch.stack([s.sum(), (s * s).sum()]) for s in
                         (t.detach().reshape(-1)[::max(1, t.numel() // 4096)].double() for t in tensors.values())])
    digest = hashlib.sha256(repr(model.cfg).encode())
    digest.update(repr([(name, tuple(t.shape), str(t.dtype)) for name, t in tensors.items()]).encode())
    digest.update(stats.cpu().numpy().tobytes())
    return digest.hexdigest()


def machine(device: torch.device) -> dict:
    """What a timing depends on beyond the model and the engine: the processor, threads and installs."""
    try:
        installed = version("packed-ss")
    except PackageNotFoundError:
        installed = "source"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
        name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                    platform.processor() or platform.machine())
    return {"processor": name, "host": platform.node(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "packed_ss": installed}


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (a no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remembered(key: dict, measure: Callable[[], dict]) -> tuple[dict, bool]:
    """The entry stored for `key` in the choices file, or measure()'s, then stored: (entry, measured now)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / CHOICES_FILE
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    with _locked(directory / (CHOICES_FILE + ".lock")):
        choices = json.loads(file.read_text()) if file.is_file() else {}
        if name in choices:
            return choices[name], False
        entry = {**measure(), "key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        choices[name] = entry
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(choices, indent=1, sort_keys=True) + "\n")
        tmp.replace(file)
        return entry, True
