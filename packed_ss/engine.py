"""The decode loop: a prefill call, then the schedule's fixed-shape steps until the stop flag is set."""
from __future__ import annotations

import functools
import math
import os
import time
import warnings
from dataclasses import dataclass

import torch

from .any_order import ANY_ORDER_SCHEDULES, ORDERS, AnyOrderDecoder
from .attention import attention_backend
from .epilogue import native_unavailable_reason
from .model import DualModeModel, KVCache
from .sampling import SamplingParams
from .schedules import SCHEDULES, Schedule
from .state import DecodeState

MAX_WIDTH = 64
EPILOGUES = ("torch", "native")
_warned_torch_epilogue = False


@dataclass
class GenerateResult:
    tokens: list[int]     # generated tokens only, a stop token included when one was emitted
    nfe: int              # model forward passes, prompt processing included
    wall_s: float         # decoder wall time (prefill and every step)
    model_s: float        # the part of wall_s spent in model calls (nan with cuda_graph=True: not separable)
    n_verify: int = 0     # verification calls (speculative schedules)
    n_accepted: int = 0   # draft tokens accepted over all verifications
    iterations: list | None = None   # any-order models: per iteration order, A_t, rows (any_order.Iteration)

    @property
    def tokens_per_nfe(self) -> float:
        return len(self.tokens) / self.nfe if self.nfe else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per verification call."""
        return self.n_accepted / self.n_verify if self.n_verify else 0.0


def _check_int(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")


class Engine:
    """Generates with one schedule and width on one model; reusable across `generate` calls."""

    def __init__(self, model: DualModeModel, schedule: str = "packed", width: int = 8,
                 backend: str | None = None, compile: bool | str = False, max_seq_len: int | None = None,
                 epilogue: str | None = None, cuda_graph: bool = False, order: str | None = None):
        """`compile`: wrap each decode step in torch.compile(fullgraph=True) (True: inductor, or a
        torch.compile backend name); `max_seq_len` caps prompt + new tokens (default: the model's).

        `epilogue`: "native" ends each step (acceptance, residual / bonus draw, emit, retain) in one call
        of the compiled epilogue (csrc/, packed_ss/epilogue.py), "torch" in the plain-torch reference;
        both give identical tokens. Default: native when it is built for the model's device and
        `compile` is off, else torch (with a one-time warning saying why).
        `cuda_graph`: on CUDA, capture each decode step once per call shape and replay it; the host
        only polls the stop flag, copied asynchronously and read one iteration late.

        Any-order (SetDLM-style) models (`any_order: true` in config.json) decode with paper Alg. 3:
        `order` "ltr" (default) or "confidence" sets the verification order of packed / linear /
        quadratic, and `schedule="native"` is the threshold decoder baseline; sampling needs the LTR
        order (and is exact there); they run the host-driven loop of packed_ss.any_order.
        """
        any_order = model.cfg.any_order
        schedules = ANY_ORDER_SCHEDULES if any_order else SCHEDULES
        if schedule not in schedules:
            kind = "an any-order" if any_order else "this (left-to-right)"
            raise ValueError(f"schedule must be one of {sorted(schedules)} for {kind} model, got {schedule!r}")
        if order is not None and order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS} or None, got {order!r}")
        if order not in (None, "ltr") and (not any_order or schedule in ("ar", "native")):
            raise ValueError(f"order={order!r} needs an any-order model and schedule packed, linear or "
                             f"quadratic; got schedule {schedule!r} on a model with any_order={any_order}")
        if any_order and (compile or cuda_graph or epilogue == "native"):
            raise ValueError("compile, cuda_graph and epilogue='native' apply to the left-to-right schedules; "
                             "an any-order model decodes with the host-driven any-order loop")
        _check_int("width", width, 1, MAX_WIDTH)
        if epilogue is not None and epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES} or None, got {epilogue!r}")
        if cuda_graph and model.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a model on a CUDA device, got {model.device}")
        if cuda_graph and compile:
            raise ValueError("cuda_graph=True and compile cannot be combined")
        if epilogue == "native" and compile:
            raise ValueError("compile traces the torch epilogue: use epilogue='torch' (or leave it unset)")
        self.model, self.schedule_name, self.width = model, schedule, width
        self.max_seq_len = max_seq_len or model.cfg.max_seq_len
        _check_int("max_seq_len", self.max_seq_len, 2)
        self.compile = compile
        self.cuda_graph = bool(cuda_graph)
        self.epilogue = "torch" if any_order else self._pick_epilogue(epilogue, model.device)
        self.backend = backend or ("triton" if model.device.type == "cuda" else "torch")
        self.attend = attention_backend(self.backend)
        self.order = order or "ltr"
        self._any_order = (AnyOrderDecoder(model, schedule, width, self.order, self.attend, self._cache_for)
                           if any_order else None)
        self._cache: KVCache | None = None
        self._schedules: dict[SamplingParams, Schedule] = {}
        self._graphs: dict[SamplingParams, _GraphSlot] = {}

    def _pick_epilogue(self, epilogue: str | None, device) -> str:
        global _warned_torch_epilogue
        if epilogue == "torch" or (epilogue is None and self.compile):
            return "torch"
        reason = native_unavailable_reason(device)
        if reason is None:
            return "native"
        if epilogue == "native":
            raise RuntimeError(reason)
        if not _warned_torch_epilogue:
            _warned_torch_epilogue = True
            warnings.warn(f"packed-ss: using the torch epilogue: {reason}", RuntimeWarning, stacklevel=3)
        return "torch"

    def _schedule(self, params: SamplingParams) -> Schedule:
        if params not in self._schedules:
            sched = SCHEDULES[self.schedule_name](self.model, self.width, params, native=self.epilogue == "native")
            if self.compile:
                for step in sched.steps:
                    backend = "inductor" if self.compile is True else self.compile
                    step.run = torch.compile(self._runner(step), fullgraph=True, backend=backend)
            self._schedules[params] = sched
        return self._schedules[params]

    def _call(self, tokens, positions, layout, cache, cache_len):
        return self.model(tokens, positions, layout, cache, cache_len, attend=self.attend)

    def _cache_for(self, capacity: int) -> KVCache:
        """A view of the engine's cache with room for `capacity` slots (rounded up to 256).

        The buffer only grows; a shorter request gets a shorter view, so the reference backend's
        attention cost follows this call's length, not the longest call so far."""
        capacity = 256 * math.ceil(capacity / 256)
        if self._cache is None or self._cache.capacity < capacity:
            self._cache = self.model.new_cache(capacity)
        return KVCache(self._cache.k[:, :, :capacity], self._cache.v[:, :, :capacity])

    def _runner(self, step):
        def run(st: DecodeState, cache: KVCache) -> None:
            tokens, positions = step.inputs(st)
            step.update(st, self._call(tokens, positions, step.layout, cache, st.cache_len))
        return run

    def _validate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop_ids):
        vocab = self.model.cfg.vocab_size
        if len(prompt) == 0:
            raise ValueError("prompt_ids must contain at least one token")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt_ids must be token ids in [0, {vocab})")
        _check_int("max_new_tokens", max_new_tokens, 1)
        if len(prompt) + max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt length {len(prompt)} + max_new_tokens {max_new_tokens} exceeds the "
                             f"engine's max_seq_len {self.max_seq_len}")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
        if top_k is not None:
            _check_int("top_k", top_k, 1)
        if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if seed is not None:
            _check_int("seed", seed, 0, 2**63 - 1)
        for t in stop_ids:
            _check_int("stop token id", t, 0, vocab - 1)

    def generate(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 eos_token_id: int | list[int] | None = None,
                 stop_token_ids: list[int] | None = None,
                 stop_sequences: list[list[int]] | None = None) -> GenerateResult:
        """Decode up to `max_new_tokens` after `prompt_ids`; stops after the first accepted stop token.

        Stop tokens are `stop_token_ids` plus `eos_token_id` (default: the model config's EOS ids).
        `stop_sequences` (any-order models; one-token sequences also elsewhere): markers of several
        tokens, recognised once all their tokens are accepted; the output ends with the earliest one.
        Temperature 0 is greedy decoding; otherwise tokens follow the AR distribution after
        temperature, top-k and top-p, exactly, whatever the schedule.
        """
        prompt = [int(t) for t in (prompt_ids.tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
        if eos_token_id is None:
            eos = list(self.model.cfg.eos_token_ids)
        else:
            eos = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
        stop_ids = sorted(set(eos) | set(stop_token_ids or []))
        sequences = self._stop_sequences(stop_sequences)
        self._validate(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop_ids)
        params = SamplingParams(float(temperature), top_k, None if top_p == 1 else top_p)
        if seed is None:
            seed = int.from_bytes(os.urandom(7), "little")
        if self._any_order is not None:
            return self._generate_any_order(prompt, max_new_tokens, params, seed, stop_ids, sequences)
        stop_ids = sorted(set(stop_ids) | {s[0] for s in sequences})

        device = self.model.device
        sched = self._schedule(params)
        support = params.support(self.model.cfg.vocab_size) if not params.greedy else 1
        if self.cuda_graph:
            slot = self._graph_slot(params, sched, support, len(stop_ids))
            cache, st = slot.cache, slot.state
            st.copy_(DecodeState.new(self.width, support, max_new_tokens, stop_ids, seed, device,
                                     out_len=st.out.numel(), stop_slots=st.stop_ids.numel()))
        else:
            cache = self._cache_for(len(prompt) + max_new_tokens + 2 * sched.block)
            st = DecodeState.new(self.width, support, max_new_tokens, stop_ids, seed, device)
        model_s = 0.0
        start = time.perf_counter()
        with torch.inference_mode():
            prompt_t = torch.tensor(prompt, dtype=torch.int64, device=device)
            prefill = sched.prefill(prompt_t)
            t0 = time.perf_counter()
            logits = self._call(*prefill.inputs(st), prefill.layout, cache, st.cache_len)
            model_s += time.perf_counter() - t0
            prefill.update(st, logits)
            if self.cuda_graph:
                if not bool(st.done):
                    self._decode_graphs(slot, sched, max_new_tokens)
                model_s = float("nan")
            rounds = 0
            while not self.cuda_graph and not bool(st.done):
                rounds += 1
                if rounds > max_new_tokens:   # every active round emits >= 1 token
                    raise RuntimeError("decoder made no progress; this is a bug")
                for step in sched.steps:
                    if self.compile:
                        step.run(st, cache)
                    else:
                        tokens, positions = step.inputs(st)
                        t0 = time.perf_counter()
                        logits = self._call(tokens, positions, step.layout, cache, st.cache_len)
                        model_s += time.perf_counter() - t0
                        step.update(st, logits)
                    if bool(st.done):
                        break
            n_out = int(st.n_out)
            tokens = st.out[:n_out].tolist()
        return GenerateResult(tokens, int(st.nfe), time.perf_counter() - start, model_s,
                              int(st.n_verify), int(st.n_accepted))

    def _stop_sequences(self, stop_sequences) -> list[tuple[int, ...]]:
        vocab = self.model.cfg.vocab_size
        sequences = []
        for seq in stop_sequences or []:
            if (not isinstance(seq, (list, tuple)) or not seq
                    or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in seq)):
                raise ValueError(f"stop_sequences must be non-empty lists of token ids in [0, {vocab}), got {seq!r}")
            if len(seq) > 1 and self._any_order is None:
                raise ValueError("stop_sequences of several tokens are supported on any-order models only; "
                                 f"got {list(seq)} for schedule {self.schedule_name!r} on a left-to-right model")
            sequences.append(tuple(seq))
        return sequences

    def _generate_any_order(self, prompt, max_new_tokens, params, seed, stop_ids, sequences) -> GenerateResult:
        if not params.greedy and (self.schedule_name == "native" or self.order != "ltr"):
            raise ValueError(
                f"temperature must be 0 for schedule {self.schedule_name!r} with order {self.order!r}: the native "
                "decoder is an argmax decoder, and a confidence order ranks positions by the sampled drafts' own "
                "probabilities, so a checked draft no longer follows its stored Q and rejection sampling would "
                "not be exact; sample with order='ltr' (or schedule='ar')")
        start = time.perf_counter()
        st = self._any_order.generate(prompt, max_new_tokens, params, seed,
                                      [(t,) for t in stop_ids] + sequences)
        wall = time.perf_counter() - start
        verified = [it for it in st.trace if self.schedule_name not in ("ar", "native")]
        return GenerateResult(st.output(), st.nfe, wall, self._any_order.model_s, len(verified),
                              sum(it.drafts_accepted for it in verified), st.trace)

    # -- CUDA graphs -----------------------------------------------------------------------------------
    def _graph_slot(self, params: SamplingParams, sched: Schedule, support: int, n_stop: int) -> "_GraphSlot":
        """Persistent state and cache for one sampling setting: the captured steps read fixed addresses."""
        slot = self._graphs.get(params)
        if slot is None or slot.state.stop_ids.numel() < n_stop:
            device = self.model.device
            cache = self._cache_for(self.max_seq_len + 2 * sched.block)   # the largest view: never regrown
            state = DecodeState.new(self.width, support, self.max_seq_len, [], 0, device,
                                    stop_slots=max(8, n_stop))
            slot = self._graphs[params] = _GraphSlot(state, cache)
        return slot

    def _decode_graphs(self, slot: "_GraphSlot", sched: Schedule, max_new_tokens: int) -> None:
        """Replay the captured steps until the state is done, polling `done` one iteration late."""
        st = slot.state
        if slot.replays is None:
            # One eager iteration first (lazy initialisation, Triton and cuBLAS set-up, as torch's graph docs
            # ask); it is also the first real iteration. Then capture each step once.
            runs = [functools.partial(self._runner(step), st, slot.cache) for step in sched.steps]
            self._warm_up(runs)
            slot.replays = [self._capture(run, slot) for run in runs]
        flags, events = slot.flags, slot.events
        for k in range(max_new_tokens + 2):   # every active iteration emits >= 1 token; +1 for the late poll
            for replay in slot.replays:
                replay()
            flags[k % 2].copy_(st.done, non_blocking=True)
            events[k % 2].record()
            if k > 0:   # iteration k is queued behind k - 1: wait for k - 1 only
                events[(k - 1) % 2].synchronize()
                if flags[(k - 1) % 2]:
                    return
        raise RuntimeError("decoder made no progress; this is a bug")

    def _warm_up(self, runs) -> None:
        side = torch.cuda.Stream(self.model.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for run in runs:
                run()
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self, run, slot: "_GraphSlot"):
        """run() captured in a CUDA graph (the slot's graphs share one memory pool and always replay in
        capture order); returns the graph's replay."""
        if slot.pool is None:
            slot.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=slot.pool):
            run()
        return graph.replay


class _GraphSlot:
    """What the captured steps of one sampling setting read: a persistent DecodeState and the cache; the
    replays once captured; the pinned stop flags the host polls, with their events."""

    def __init__(self, state: DecodeState, cache: KVCache):
        self.state, self.cache = state, cache
        self.replays: list | None = None
        self.pool = None
        pinned = torch.zeros(2, dtype=torch.bool, pin_memory=True)
        self.flags = [pinned[0], pinned[1]]
        self.events = [torch.cuda.Event(), torch.cuda.Event()]
