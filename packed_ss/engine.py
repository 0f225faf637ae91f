"""Engine: validate a request, choose the program (schedule, epilogue), and hand it to the runtime."""
from __future__ import annotations

import dataclasses
import sys
from functools import partial
from typing import Iterator

from tqdm import tqdm

from .checks import check_drafts, check_int, check_request, check_requests
from .decode.any_order import ORDERS
from .decode.epilogue import EPILOGUES, make_epilogue, pick_epilogue
from .decode.lookup import drafts_by_lookup
from .decode.policy import COST_BATCH, NARROW, Policy, shapes_for
from .decode.sampling import SamplingParams
from .decode.registry import schedules
from .decode.shared_noise import DRAWS, SharedNoise
from .model.attention import attention_backend
from .model.dual_mode import PAGE_SIZE, DualModeModel
from .runtime import GenerateResult, Request, Runtime
from .runtime.executor import executor_for
from .runtime.batch import CACHE_QUANTUM
from .runtime.admission import MAX_BATCH
from .runtime.kv_pool import KVUsage
from .runtime.loop import PREFILL_CHUNK
from .runtime.scheduler import Group
from .runtime.program import call_layouts
from .width import call_cost, choose_width, machine, model_fingerprint, profile_kind, remembered, step_overhead

MAX_WIDTH = 64
DEFAULT_WIDTH = 8
LOOKUP_WIDTH = 16   # the adaptive schedule's widest lookup draft, at least (_adaptive_width)
PROBE_PROMPT = 16      # prompt tokens of the requests that time the step for width="auto"


# An adaptive sampled program (one serves every setting) is priced truncated, with its dearer logits processing:
PRICED = SamplingParams(temperature=1.0, top_p=0.95)
SAMPLERS = ("rejection",) + tuple(DRAWS)   # DRAWS: the shared-noise couplings
DEFAULT_SAMPLER = "rejection"
ADAPTIVE = "adaptive"
_shape_costs: dict[tuple, list[tuple]] = {}    # per process: Engine._shape_costs


class Engine:
    """Generates with one schedule and width on one model; reusable across `generate` / `stream` calls."""

    def __init__(self, model: DualModeModel, schedule: str | None = None, width: int | str | None = "auto",
                 backend: str | None = None, compile: bool | str = False, max_seq_len: int | None = None,
                 epilogue: str | None = None, cuda_graph: bool = False, order: str | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, sampler: str | None = None, kv_cache_bytes: int | None = None,
                 drafts: str | None = None, prefix_cache: bool = True, page_size: int = PAGE_SIZE,
                 max_batch: int = MAX_BATCH):
        """`schedule`: "adaptive" (the default for left-to-right models), "packed" (for any-order ones), "linear",
        "quadratic", "ar", or "lookup" (drafts by n-gram lookup alone, verified in one causal call).
        "adaptive" picks each iteration's call among a few prebuilt shapes - AR, lookup drafts verified alone,
        Packed-SS - by what each draft source has earned for each request and what rows cost at the batch size
        (decode/policy.py); its `width` is the widest shape's. Greedy and under shared noise the batch's shape
        is chosen freely (the output does not depend on it); under the rejection sampler each request chooses
        its own from its own statistics and the call covers them, so a request's tokens never depend on its batch,
        and the widest shape is policy.NARROW wide (that sampler's verification costs W x vocabulary per row).
        `drafts` (packed, linear, quadratic): where drafts come from, "diffusion" (the model's mask rows),
        "lookup" (the continuation of the latest n-gram match in the prompt and output, decode/lookup.py) or
        "both" (the lookup draft where there is a match, the diffusion proposal elsewhere); default: the
        schedule's first `draft_sources` the model can run ("both"; "lookup" on a model without a drafting mode).
        `width`: draft tokens verified per call, an integer, or "auto" / None (the default): the width that
        maximises expected tokens per second given the drafter's acceptance profile (`model.draft_profile`)
        and this device's per-call latency, measured once per process (width.py); at most the model's
        `cfg.block_size - 1`; without a profile that, capped at MAX_WIDTH, else 8 (adaptive: _adaptive_width).
        `engine.width` is the width in use, `engine.width_source` where it came from ("measured now", "remembered
        from <time>", a fixed default): a measured choice is stored per machine, install, model and setting
        (width.py, PACKED_SS_CACHE_DIR), so the same arguments and seed give the same tokens in every process.
        `sampler`: how a sampled request (temperature > 0) verifies drafts; all give the AR distribution exactly
        (default: the one the drafter's acceptance profile names, measured on that model, else DEFAULT_SAMPLER, by
        measurement on the shipped model: bench/RESULTS.md, "Adaptive"). "rejection": the paper's Alg. 2 (accept d
        with probability min(1, p(d)/q(d)), the residual draw at a rejection; each draft's distribution is stored).
        "gumbel" and "inverse-cdf": shared noise (decode/shared_noise.py): target and drafter draw with noise keyed
        by the seed and output position, by Gumbel-max or by the inverse CDF in token order (the rejection rule's
        AR draw: its text), so a seeded request returns the same tokens under every schedule, width and batch
        (those of schedule="ar"), nothing is stored, and verification is the greedy comparison.
        `compile`: wrap each decode step in torch.compile(fullgraph=True) (True: inductor, or a torch.compile
        backend name); with `cuda_graph` too, the compiled steps are what the graph captures. `max_seq_len` caps
        prompt + new tokens (default: the model's). `prefill_chunk`: the most prompt tokens one call prefills; a
        longer prompt enters the cache a chunk per decode iteration, so requests already running wait at most one
        chunk's call per iteration for it (same tokens as one call, up to float rounding of the attention sums).
        `kv_cache_bytes`: the size of the engine's K/V pool, in pages of `page_size` cache positions that requests
        take as their tokens need them (default: the environment's PACKED_SS_KV_CACHE_BYTES, else 80% of the free
        GPU memory when the pool is made; on a CPU 4 GiB or a quarter of the host's memory, of which only the pages
        used are touched; at most what MAX_BATCH requests of max_seq_len could hold); requests wait for pages, and a
        running request is preempted (and later continues unchanged) when the pool runs out; a request that does not
        fit the pool alone is a ValueError. `prefix_cache`: a prompt that starts with the tokens of an earlier
        request's full pages (its prompt, or prompt and output) shares their K/V and prefills only the rest; the
        tokens are the same with it on or off (float64; in lower precision up to the rounding of a call of other
        rows, see README). `max_batch`: the most requests running at once (default and at most MAX_BATCH), its
        greedy and sampled batches together; later ones wait for a slot, in the order they came (a server's
        `--max-batch`).

        `epilogue`: "native" ends each step (acceptance, residual / bonus draw, emit, retain) in one call
        of the compiled epilogue (csrc/, packed_ss/epilogue/), "torch" in the plain-torch reference;
        both give identical tokens. Default: native when it is built for the model's device, else
        torch (with a warning saying why); a compiled step calls it as a torch operator.
        `cuda_graph`: on CUDA, capture each decode iteration once and replay it; the host only polls the
        stop flag, copied asynchronously and read one iteration late.

        Any-order (SetDLM-style) models (`any_order: true` in config.json) decode with paper Alg. 3:
        `order` "ltr" (default) or "confidence" sets the verification order of packed / linear /
        quadratic, and `schedule="threshold"` is the threshold decoder baseline (E.6); sampling needs the LTR
        order (and is exact there). They run on the same runtime: `compile`, `cuda_graph` and either
        epilogue apply to both orders.
        """
        any_order = model.cfg.any_order
        schedule = schedule or ("packed" if any_order else ADAPTIVE)
        if schedule not in schedules(any_order):
            kind = "an any-order" if any_order else "this (left-to-right)"
            raise ValueError(f"schedule must be one of {sorted(schedules(any_order))} for {kind} model, got "
                             f"{schedule!r}")
        drafts = check_drafts(model, schedules(any_order)[schedule], drafts)
        if order is not None and order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS} or None, got {order!r}")
        if order not in (None, "ltr") and (not any_order or schedule in ("ar", "threshold")):
            raise ValueError(f"order={order!r} needs an any-order model and schedule packed, linear or "
                             f"quadratic; got schedule {schedule!r} on a model with any_order={any_order}")
        auto = width is None or width == "auto"
        if not auto:
            check_int("width", width, 1, MAX_WIDTH)
        sampler = sampler or (model.draft_profile or {}).get("sampler") or DEFAULT_SAMPLER
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if epilogue is not None and epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {tuple(EPILOGUES)} or None, got {epilogue!r}")
        if cuda_graph and model.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a model on a CUDA device, got {model.device}")
        self.model, self.schedule_name, self.any_order, self.drafts = model, schedule, any_order, drafts
        self.order = order or "ltr"
        self.sampler = sampler
        self.max_seq_len = max_seq_len or model.cfg.max_seq_len
        check_int("max_seq_len", self.max_seq_len, 2)
        check_int("prefill_chunk", prefill_chunk, 1)
        check_int("max_batch", max_batch, 1, MAX_BATCH)
        if kv_cache_bytes is not None:
            check_int("kv_cache_bytes", kv_cache_bytes, 1)
        check_int("page_size", page_size, 1, CACHE_QUANTUM)
        if CACHE_QUANTUM % page_size:
            raise ValueError(f"page_size must divide {CACHE_QUANTUM}, got {page_size}")
        self.epilogue = pick_epilogue(epilogue, model.device)
        self.backend = backend or ("triton" if model.device.type == "cuda" else "torch")
        executor = executor_for(cuda_graph, ("inductor" if compile is True else compile) or None)
        self.runtime = Runtime(model, attention_backend(self.backend), executor, self.max_seq_len, prefill_chunk,
                               kv_cache_bytes, page_size, bool(prefix_cache), max_batch)
        self._programs: dict[bool, object] = {}
        self.width_source = "given"
        self.policy_type = Policy          # the adaptive schedule's (tests put a policy that switches at will)
        if schedule == ADAPTIVE:
            self.width = self._adaptive_width() if auto else width
        else:
            self.width = self._auto_width() if auto else width

    def _adaptive_width(self) -> int:
        """The adaptive schedule's widest shape: the drafter's (the profile's width, else `cfg.block_size - 1` where
        the config has one, else DEFAULT_WIDTH), with lookup drafts at least LOOKUP_WIDTH (no drafter bounds those,
        and the policy bets on a wide shape only where its measured costs say it pays); `cfg.block_size - 1` at most."""
        cfg, profile = self.model.cfg, self.model.draft_profile
        limit = min(cfg.block_size - 1, MAX_WIDTH) if cfg.block_size else MAX_WIDTH
        self.width_source = "adaptive: the profile's width" if profile else "adaptive: default"
        width = profile["width"] if profile else (limit if cfg.block_size else DEFAULT_WIDTH)
        if drafts_by_lookup(self.drafts) and width < LOOKUP_WIDTH:
            width, self.width_source = LOOKUP_WIDTH, "adaptive: the lookup width"
        return min(limit, width)

    def _auto_width(self) -> int:
        """width="auto" (width.py): the profile's best width on this device, measured once per machine and
        install and remembered; the fixed default without a profile. Sets `width_source`."""
        cfg, profile = self.model.cfg, self.model.draft_profile
        limit = min(cfg.block_size - 1, MAX_WIDTH) if cfg.block_size else MAX_WIDTH
        kind = profile_kind(schedules(self.any_order)[self.schedule_name].replay, self.drafts)
        if profile is None or kind not in profile:
            self.width_source = "default (no acceptance profile)"
            return min(limit, DEFAULT_WIDTH) if not cfg.block_size else limit
        widths = range(1, min(limit, profile["width"]) + 1)
        key = {"model": model_fingerprint(self.model), "device": str(self.model.device),
               "dtype": str(self.model.dtype), **machine(self.model.device), "schedule": self.schedule_name,
               "drafts": self.drafts, "order": self.order, "epilogue": self.epilogue, "backend": self.backend,
               "mode": self.runtime.executor.name, "compile": self.runtime.executor.compile_backend,
               "profile": profile[kind][:len(widths)]}
        entry, measured = remembered(key, lambda: {"width": self._measure_width(profile[kind], widths)})
        self.width_source = "measured now" if measured else f"remembered from {entry['measured_at']}"
        return entry["width"]

    def _measure_width(self, tokens: list[float], widths: range) -> int:
        """The width among `widths` with the most expected tokens (`tokens`, the profile) per measured ms."""
        rows = {w: [lay.rows for lay in call_layouts(self._build(w, False, "torch"))] for w in widths}
        counts = sorted({r for calls in rows.values() for r in calls})
        cost = call_cost(self.model, self.runtime.attend, self.backend,
                         [counts[0], counts[len(counts) // 2], counts[-1]])
        if self.runtime.executor.times_model:   # compiled and captured steps hold their non-model work inside
            probe = widths[0]
            overhead = step_overhead(self._probe_key(), partial(self._probe, probe),
                                     cost.iteration_ms(rows[probe]) / len(rows[probe]))
            cost = dataclasses.replace(cost, tau_ms=cost.tau_ms + overhead)
        return choose_width(tokens[:len(widths)], rows.__getitem__, cost)

    def _probe_key(self) -> tuple:
        return (id(self.model), str(self.model.device), self.schedule_name, self.order, self.epilogue, self.backend)

    def _probe(self, width: int, new_tokens: int) -> GenerateResult:
        """One greedy request of `new_tokens` (no stop token) at `width`, for timing the step."""
        mask = self.model.cfg.mask_token_id
        prompt = [t for t in range(2, 2 + PROBE_PROMPT + 1) if t != mask][:PROBE_PROMPT]
        request, _ = check_request(self, prompt, new_tokens, 0.0, None, None, None, [], None, None)
        return self._drain(self.runtime.decode(self._build(width, False, self.epilogue), [request]))[0]

    def program(self, params: SamplingParams):
        """The schedule bound to this engine's model, width and epilogue that decodes requests like `params`: one
        greedy program, and one sampled program for every sampled request, whatever its temperature, top-k and top-p
        (each request's are rows of its batch state), so that sampled requests share a batch."""
        sampled = not params.greedy
        if sampled not in self._programs:
            free = not sampled or self.sampler in DRAWS       # the adaptive schedule's choice is free
            width = self.width if self.schedule_name != ADAPTIVE or free else min(self.width, NARROW)
            self._programs[sampled] = self._build(width, sampled, self.epilogue)
        return self._programs[sampled]

    def joining(self, params: SamplingParams):
        """The program whose batch requests like `params` join now: their own (`program`), except that a greedy
        request joins the running sampled batch where that costs it nothing (`greedy_joins_sampled`), so that the
        two share one model call per step rather than two batches taking turns. It decodes there exactly as alone."""
        sampled = self._programs.get(True)
        if params.greedy and self.greedy_joins_sampled and sampled is not None \
                and not self.runtime.scheduler(sampled).idle:
            return sampled
        return self.program(params)

    @property
    def greedy_joins_sampled(self) -> bool:
        """Whether greedy requests join a running sampled batch (`joining`): with a fixed schedule (its sampled
        program runs the greedy one's call shapes) one batch measured 1.04-1.43x the throughput of two; with the
        adaptive one under shared noise 1.14-1.46x on SmolLM2. Not under the rejection sampler, whose adaptive
        sampled program is narrow and prices its rows per request: one batch ran 0.90x the throughput of two on the
        4M model (bench/RESULTS.md, "The greedy rows of a sampled adaptive batch choose freely")."""
        return self.schedule_name != ADAPTIVE or self.sampler in DRAWS

    def _build(self, width: int, sampled: bool, epilogue: str):
        """The greedy or the sampled program; under the shared-noise sampler the sampled one is the greedy program
        on perturbed scores."""
        shared = self.sampler in DRAWS and sampled
        verifies_sampled = sampled and not shared
        ending = make_epilogue(epilogue, self.model.device, width, verifies_sampled)
        if self.any_order:
            program = schedules(True)[self.schedule_name](self.model, width, verifies_sampled, ending, self.order)
        elif self.schedule_name == ADAPTIVE:
            policy = self.policy_type.from_profile(shapes_for(width, self.drafts), self.model.draft_profile, width)
            program = schedules()[ADAPTIVE](self.model, width, verifies_sampled, ending, self.drafts, policy=policy)
        else:
            program = schedules()[self.schedule_name](self.model, width, verifies_sampled, ending, self.drafts)
        built = SharedNoise(program, self.sampler) if shared else program
        if self.schedule_name == ADAPTIVE:      # what its iterations cost, noise included
            costs = self._shape_costs(built, width, sampled, epilogue)
            program.policy = program.policy.measured(costs, per_request=verifies_sampled)
        return built

    def _shape_costs(self, program, width: int, sampled: bool, epilogue: str) -> list[tuple]:
        """An adaptive program's iteration costs per shape at batch 1 and COST_BATCH (sampled: with the PRICED
        settings), measured once per process for each model, device, mode and runner (they change the speed of its
        choices, never the output)."""
        key = (id(self.model), str(self.model.device), self.model.dtype, width, self.drafts, sampled, self.sampler,
               epilogue, self.backend, self.runtime.executor.name, self.runtime.executor.compile_backend)
        if key not in _shape_costs:
            _shape_costs[key] = self.runtime.shape_costs(program, (1, COST_BATCH), PRICED if sampled else None)
        return _shape_costs[key]

    # -- requests --------------------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 eos_token_id: int | list[int] | None = None, stop_token_ids: list[int] | None = None,
                 stop_sequences: list[list[int]] | None = None) -> GenerateResult:
        """Decode up to `max_new_tokens` after `prompt_ids`; stops after the first accepted stop token.

        Stop tokens are `stop_token_ids` plus `eos_token_id` (default: the model config's EOS ids).
        `stop_sequences`: markers of one or several tokens; the output ends once a whole one is emitted
        (tokens beyond it are dropped), at the earliest one.
        Temperature 0 is greedy decoding; otherwise tokens follow the AR distribution after
        temperature, top-k and top-p, exactly, whatever the schedule.
        """
        request, params = check_request(self, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed,
                                        eos_token_id, stop_token_ids, stop_sequences)
        return self._drain(self.runtime.decode(self.joining(params), [request]))[0]

    def stream(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               eos_token_id: int | list[int] | None = None,
               stop_token_ids: list[int] | None = None,
               stop_sequences: list[list[int]] | None = None) -> Iterator[list[int]]:
        """Like `generate`, but yields the newly accepted tokens (a list per iteration, in order) as the
        decoder produces them; the generator's return value is the GenerateResult. Arguments are checked
        here, before anything runs."""
        request, params = check_request(self, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed,
                                        eos_token_id, stop_token_ids, stop_sequences)
        return self._tokens_of_one(self.runtime.decode(self.joining(params), [request], stream=True))

    # -- the request-level interface: a caller that runs the loop itself (the server's decode thread) --------
    def request(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, seed: int | None = None, eos_token_id: int | list[int] | None = None,
                stop_token_ids: list[int] | None = None,
                stop_sequences: list[list[int]] | None = None) -> Request:
        """A request checked as `generate` checks it (ValueError naming the argument); nothing runs until it is
        `add`ed."""
        return check_request(self, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                             stop_token_ids, stop_sequences)[0]

    def add(self, request: Request, stream: bool = True) -> Group:
        """The request joins a running batch at the next `step` (`joining`). Its group's `events` receive (0, new
        tokens) as iterations add them (when `stream`) and (0, GenerateResult) at its end; `error` is set if its
        batch fails."""
        return self.runtime.add(self.joining(request.params), [request], 1, stream)

    def kv_usage(self) -> KVUsage:
        """The K/V pool now: pages held, published in the prefix cache, its hits, evictions and preemptions."""
        return self.runtime.kv_usage()

    def step(self) -> bool:
        """One step of every running batch (admission, one iteration, the poll); whether work remains."""
        return self.runtime.step()

    def load(self) -> tuple[int, int]:
        """(running, waiting) requests now."""
        return self.runtime.load()

    @property
    def max_batch(self) -> int:
        return self.runtime.max_batch

    def abort(self, group: Group) -> None:
        """The request leaves its batch at once; its slot is free for the next. If it was running, its result so
        far (output and counts) is in `group.results[0]`."""
        self.runtime.abort(group)

    def generate_batch(self, prompts, max_new_tokens: int | list[int] = 64, temperature: float | list[float] = 0.0,
                       top_k: int | list[int | None] | None = None, top_p: float | list[float | None] | None = None,
                       seed: int | list[int] | None = None,
                       eos_token_id: int | list[int] | None = None, stop_token_ids: list[int] | None = None,
                       stop_sequences: list[list[int]] | None = None, batch_size: int | None = None,
                       progress: bool = False) -> list[GenerateResult]:
        """Decode several requests together; returns one GenerateResult per prompt, in order, each exactly what
        `generate` gives that request alone (sampled ones too: random numbers follow each request's own seed
        and counter, never its place in the batch).

        `max_new_tokens`, `temperature`, `top_k`, `top_p` and `seed`: one value for all, or a list with one per
        prompt; an int seed s gives request i the seed s + i (repeated prompts draw different samples), None
        random seeds. Requests of any sampling settings share the batch (greedy ones beside sampled ones decode
        in the sampled program, exactly as alone). Stops are shared. `batch_size`: requests decoded at once,
        one model call per step for all of them (default: every prompt, at most MAX_BATCH); a finished request's
        slot takes the next waiting one (continuous batching). Any-order models decode one request at a time
        (batch_size 1): their calls' layouts follow each request's own window. `progress`: a progress bar of finished
        requests (stderr). Everything is checked before anything runs; an error names the request's index.
        """
        requests, params = check_requests(self, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                                          stop_token_ids, stop_sequences)
        if self.any_order and batch_size not in (None, 1):
            raise ValueError(f"batch_size must be 1 for an any-order model (each request's calls follow its own "
                             f"window), got {batch_size!r}")
        n = len(requests)
        batch_size = min(n, 1 if self.any_order else MAX_BATCH) if batch_size is None else batch_size
        check_int("batch_size", batch_size, 1, MAX_BATCH)
        with tqdm(total=n, desc="requests", unit="req", disable=not progress, file=sys.stderr) as bar:
            return self._drain(self.runtime.decode(self.joining(params), requests, batch_size,
                                                   on_finish=lambda i, result: bar.update()))

    def stream_batch(self, prompts, max_new_tokens: int | list[int] = 64, temperature: float | list[float] = 0.0,
                     top_k: int | list[int | None] | None = None, top_p: float | list[float | None] | None = None,
                     seed: int | list[int] | None = None,
                     eos_token_id: int | list[int] | None = None, stop_token_ids: list[int] | None = None,
                     stop_sequences: list[list[int]] | None = None) -> Iterator[tuple[int, list[int]]]:
        """Like `generate_batch` with every request in its own slot (at most MAX_BATCH; one for an any-order
        model): yields (request index, newly accepted tokens) as the decoder produces them, the generator's
        return value being the GenerateResults in order. Arguments are checked here, before anything runs."""
        requests, params = check_requests(self, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                                          stop_token_ids, stop_sequences)
        limit = 1 if self.any_order else MAX_BATCH
        if len(requests) > limit:
            raise ValueError(f"stream_batch decodes every prompt in its own slot: at most {limit} prompts, got "
                             f"{len(requests)}")
        return self.runtime.decode(self.joining(params), requests, len(requests), stream=True)

    @staticmethod
    def _tokens_of_one(decoding) -> Iterator[list[int]]:
        while True:
            try:
                _, tokens = next(decoding)
            except StopIteration as end:
                return end.value[0]
            yield tokens

    @staticmethod
    def _drain(decoding) -> list[GenerateResult]:
        while True:
            try:
                next(decoding)
            except StopIteration as end:
                return end.value

