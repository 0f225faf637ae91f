"""Several callers on one Engine: generators consumed in turn and threads each get exactly what they get alone;
requests of any settings join one running batch (packed_ss/runtime/scheduler.py; greedy ones have a batch of
their own while nothing sampled runs), and a generator closed early frees its slot, which the next request takes, and leaves nothing held."""
import threading

import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.runtime.executor import Graphs
from packed_ss.runtime.batch import Batch

PROMPTS = [[3, 17, 42, 8, 9], list(range(1, 20)), [60, 3], [11, 11, 40, 7, 7, 90, 1, 4]]
SETTINGS = [dict(), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_k=10, seed=4), dict(top_p=0.9,
                                                                                               temperature=1.2, seed=5)]


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


@pytest.fixture(scope="module")
def model64():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float64)


def requests(n: int) -> list[dict]:
    """n requests of other prompts, lengths and sampling settings."""
    return [dict(prompt_ids=PROMPTS[i % 4], max_new_tokens=12 + 5 * i, eos_token_id=[], **SETTINGS[i % 4])
            for i in range(n)]


@pytest.mark.parametrize("schedule", ["packed", "linear"])
@pytest.mark.parametrize("n", [2, 8])
def test_interleaved_streams_equal_alone(model, schedule, n):
    engine = packed_ss.Engine(model, schedule=schedule, width=3)
    reqs = requests(n)
    alone = [engine.generate(**r).tokens for r in reqs]
    streams = [engine.stream(**r) for r in reqs]
    got = [[] for _ in reqs]
    live = set(range(n))
    while live:
        for i in sorted(live):
            try:
                got[i] += next(streams[i])
            except StopIteration as stop:
                assert stop.value.tokens == got[i]
                live.discard(i)
    assert got == alone


@pytest.fixture
def batch_sizes(monkeypatch):
    """The batch size of every iteration run."""
    sizes, iterate = [], Batch.iterate

    def recorded(self, first, shape=0):
        sizes.append(self.size)
        iterate(self, first, shape)
    monkeypatch.setattr(Batch, "iterate", recorded)
    return sizes


def streamed_in_turn(engine, reqs: list[dict], batch_sizes: list[int]) -> tuple[list, list]:
    """(tokens of each request streamed while every stream is consumed in turn, as an async server would, with the
    batch sizes recorded anew; its tokens decoded alone)."""
    alone = [engine.generate(**r).tokens for r in reqs]
    batch_sizes.clear()
    streams = [engine.stream(**r) for r in reqs]
    got = [[] for _ in reqs]
    for _ in range(200):
        for i, s in enumerate(streams):
            got[i] += next(s, [])
    return got, alone


@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, top_k=10)], ids=["greedy", "top-k"])
def test_interleaved_streams_share_one_batch(model, batch_sizes, n, sampling):
    """Streams of one sampling setting (their own seeds, prompts, lengths) consumed in turn decode in one batch:
    the scheduler's iterations run all of them together, and each gets what it gets alone."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    reqs = [dict(prompt_ids=PROMPTS[i % 4], max_new_tokens=12 + 5 * i, eos_token_id=[], seed=i, **sampling)
            for i in range(n)]
    got, alone = streamed_in_turn(engine, reqs, batch_sizes)
    assert got == alone
    assert max(batch_sizes) > n // 2, batch_sizes   # measured: 2 of 2, 7 of 8 (the first ends before the last joins)


MIXED = [dict(temperature=1.0), dict(temperature=0.8, top_k=10), dict(temperature=1.2, top_p=0.9),
         dict(temperature=0.5, top_k=3, top_p=0.8), dict(temperature=0.7, top_p=0.95), dict(temperature=2.0, top_k=70)]


@pytest.mark.parametrize("schedule", ["ar", "packed", "linear", "quadratic", "lookup", "adaptive"])
@pytest.mark.parametrize("sampler", ["rejection", "gumbel", "inverse-cdf"])
def test_requests_of_any_sampling_settings_share_one_batch(model64, batch_sizes, schedule, sampler):
    """Temperature, top-k and top-p are rows of the batch state: sampled requests that differ in all three decode in
    one batch (a greedy request beside them in the greedy one), and each gets what it gets alone. In float64: the
    adaptive calls' row counts follow the batch's choices, and in float32 a near-tie may then draw another token."""
    engine = packed_ss.Engine(model64, schedule=schedule, width=3, sampler=sampler)
    reqs = [dict(prompt_ids=PROMPTS[i % 4], max_new_tokens=40 - 3 * i, eos_token_id=[], seed=10 + i, **setting)
            for i, setting in enumerate(MIXED)] + [dict(prompt_ids=PROMPTS[1], max_new_tokens=20, eos_token_id=[])]
    got, alone = streamed_in_turn(engine, reqs, batch_sizes)
    assert got == alone
    assert max(batch_sizes) == len(MIXED), batch_sizes


@pytest.mark.parametrize("schedule", ["ar", "packed", "linear", "quadratic", "lookup", "adaptive"])
@pytest.mark.parametrize("sampler", ["rejection", "gumbel", "inverse-cdf"])
def test_generate_batch_takes_a_setting_per_prompt(model64, batch_sizes, schedule, sampler):
    """generate_batch with a temperature, top-k and top-p per prompt, greedy ones among them: one batch, and each
    request gets what `generate` gives it alone (a greedy one from the greedy program; float64, as above)."""
    engine = packed_ss.Engine(model64, schedule=schedule, width=3, sampler=sampler)
    settings = [dict(temperature=0.0)] + MIXED[:3] + [dict(temperature=0.0, top_k=5)]
    prompts, caps = [PROMPTS[i % 4] for i in range(len(settings))], [30 - 3 * i for i in range(len(settings))]
    alone = [engine.generate(p, n, seed=10 + i, eos_token_id=[], **s).tokens
             for i, (p, n, s) in enumerate(zip(prompts, caps, settings))]
    batch_sizes.clear()
    got = engine.generate_batch(prompts, caps, seed=10, eos_token_id=[],
                                temperature=[s["temperature"] for s in settings],
                                top_k=[s.get("top_k") for s in settings], top_p=[s.get("top_p") for s in settings])
    assert [r.tokens for r in got] == alone
    assert max(batch_sizes) == len(settings), batch_sizes


def test_closed_stream_frees_its_slot_for_the_next(model, batch_sizes):
    """Two streams in one batch; the first is closed mid-way: the next request takes its slot (the batch does not
    grow), and both the survivor and the newcomer get what they get alone."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    a, b, c = (dict(prompt_ids=PROMPTS[i], max_new_tokens=40, eos_token_id=[]) for i in range(3))
    want_b, want_c = engine.generate(**b).tokens, engine.generate(**c).tokens
    first, second = engine.stream(**a), engine.stream(**b)
    got_b = next(second)
    next(first)
    got_b += next(second)
    scheduler = engine.runtime.scheduler(engine.program(packed_ss.decode.sampling.SamplingParams()))
    slots = scheduler.batch.slots
    assert sum(r is not None for r in scheduler.running) == 2
    first.close()
    assert sum(r is not None for r in scheduler.running) == 1
    third = engine.stream(**c)
    got_c = next(third)
    assert scheduler.batch.slots == slots and sum(r is not None for r in scheduler.running) == 2
    for _ in range(100):
        got_b += next(second, [])
        got_c += next(third, [])
    assert got_b == want_b and got_c == want_c


def run_threads(worker, n: int) -> None:
    """worker(0) .. worker(n - 1) on threads of their own, until all are done."""
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)


def test_threads_equal_alone(model):
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    reqs = requests(8)
    alone = [engine.generate(**r).tokens for r in reqs]
    got = [None] * len(reqs)

    def worker(k: int) -> None:
        for i in range(k, len(reqs), 4):
            got[i] = engine.generate(**reqs[i]).tokens
    run_threads(worker, 4)
    assert got == alone


def test_threads_share_one_batch(model, batch_sizes):
    """Four threads calling generate with one sampling setting at once: their requests run in one batch, each
    output what it is alone."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    reqs = [dict(prompt_ids=PROMPTS[i], max_new_tokens=30 + 4 * i, eos_token_id=[], temperature=1.0, seed=i)
            for i in range(4)]
    alone = [engine.generate(**r).tokens for r in reqs]
    batch_sizes.clear()
    got, start = [None] * 4, threading.Barrier(4)

    def worker(i: int) -> None:
        start.wait()
        got[i] = engine.generate(**reqs[i]).tokens
    run_threads(worker, 4)
    assert got == alone
    assert max(batch_sizes) >= 2, batch_sizes


def test_closed_stream_releases_what_it_held(model):
    """A stream closed after its first tokens gives its K/V pages back at once: while it is open another request
    decodes (its `generate` runs the stream's batch too, still far from its end) and gets its tokens alone;
    once it is closed the pool holds nothing."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    first, second = requests(2)
    first["max_new_tokens"] = 120
    want = engine.generate(**second).tokens
    assert engine.kv_usage().held == 0
    stream = engine.stream(**first)
    next(stream)
    assert engine.kv_usage().held > 0
    assert engine.generate(**second).tokens == want and engine.kv_usage().held > 0
    stream.close()
    assert engine.kv_usage().held == 0
    assert engine.generate(**second).tokens == want


def test_interleaved_streams_in_graph_mode(model, eager_graphs):
    """The graph loop's persistent batch is held by one decode; another gets a batch (and graphs) of its own
    (CPU stand-ins replace capture: the conftest fixture)."""
    eager = packed_ss.Engine(model, schedule="packed", width=3)
    graphed = packed_ss.Engine(model, schedule="packed", width=3)
    graphed.runtime.executor = Graphs(graphed.runtime.executor.compile_backend)
    reqs = requests(3)
    alone = [eager.generate(**r).tokens for r in reqs]
    streams, got = [graphed.stream(**r) for r in reqs], [[] for _ in reqs]
    for _ in range(100):
        for i, s in enumerate(streams):
            got[i] += next(s, [])
    assert got == alone and eager_graphs


def test_any_order_streams_take_turns(batch_sizes):
    """An any-order request's calls follow its own window: two interleaved streams of one setting never share a
    batch (max_batch 1), the second waits for the first, and both get what they get alone."""
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float32)
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    reqs = [dict(prompt_ids=PROMPTS[i], max_new_tokens=20, eos_token_id=[]) for i in range(2)]
    alone = [engine.generate(**r).tokens for r in reqs]
    batch_sizes.clear()
    streams, got = [engine.stream(**r) for r in reqs], [[], []]
    for _ in range(100):
        for i, s in enumerate(streams):
            got[i] += next(s, [])
    assert got == alone and max(batch_sizes) == 1


def test_a_small_pool_preempts_and_gives_the_same_tokens(model, batch_sizes):
    """kv_cache_bytes holds about three of these requests' caches at their longest: eight prompts start together
    (each holds only the pages its tokens need), run out of pages as they grow, and the latest admitted are
    preempted and come back; each output equals the request decoded alone, the pool never holds more than its
    pages, and nothing is left held at the end. A request that does not fit the pool alone is refused by name."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    page_bytes = engine.kv_usage().page_bytes
    small = packed_ss.Engine(model, schedule="packed", width=3, kv_cache_bytes=12 * page_bytes)
    prompts = [PROMPTS[i % 4] for i in range(8)]
    kwargs = dict(max_new_tokens=[30 + 3 * i for i in range(8)], eos_token_id=[], temperature=1.0, seed=2)
    want = engine.generate_batch(prompts, **kwargs)
    held = []
    batch_sizes.clear()
    forward = small.runtime.forward
    small.runtime.forward = lambda inp, cache: (held.append(small.kv_usage().held), forward(inp, cache))[1]
    got = small.generate_batch(prompts, **kwargs)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    usage = small.kv_usage()
    assert usage.preemptions > 0 and max(batch_sizes) >= 3
    assert max(held) <= usage.pages and usage.held == 0
    streamed = [[] for _ in prompts]                  # the tokens streamed before and after a preemption
    for i, tokens in small.stream_batch(prompts, **kwargs):
        streamed[i] += tokens
    assert streamed == [r.tokens for r in want] and small.kv_usage().preemptions > usage.preemptions
    tiny = packed_ss.Engine(model, schedule="packed", width=3, kv_cache_bytes=3 * page_bytes)
    with pytest.raises(ValueError, match=rf"request 0: its K/V cache \(3 pages, {3 * page_bytes} bytes\) exceeds "
                                         rf"the K/V pool \(2 pages, kv_cache_bytes {3 * page_bytes}\)"):
        tiny.generate(PROMPTS[0], max_new_tokens=30)
    with pytest.raises(ValueError, match=r"kv_cache_bytes must be an integer >= 1, got 0"):
        packed_ss.Engine(model, width=3, kv_cache_bytes=0)


def test_a_request_too_long_for_the_cache_joins_a_longer_one(model, batch_sizes):
    """A stream runs in a batch whose page table holds its request's prompt, new tokens and reserve (whole pages of
    16); a request of 250 prompt tokens + 40 new joins it: the batch moves to a longer table (the running
    request's pages change tables, its K/V stays where it is) instead of making the newcomer wait for it to
    drain, and both get what they get alone."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    short = dict(prompt_ids=PROMPTS[0], max_new_tokens=60, eos_token_id=[], temperature=1.0, seed=1)
    long = dict(prompt_ids=[i % 90 + 1 for i in range(250)], max_new_tokens=40, eos_token_id=[], temperature=1.0,
                seed=2)
    want = [engine.generate(**r).tokens for r in (short, long)]
    batch_sizes.clear()
    streams = [engine.stream(**short)]
    got = [next(streams[0]), []]
    program = engine.program(packed_ss.decode.sampling.SamplingParams(temperature=1.0))
    scheduler = engine.runtime.scheduler(program)
    pages_of = lambda n: -(-(n + program.reserve) // 16) * 16      # noqa: E731
    assert scheduler.batch.cache.capacity == pages_of(len(PROMPTS[0]) + 60)
    streams.append(engine.stream(**long))
    got[1] += next(streams[1])
    assert scheduler.batch.cache.capacity == pages_of(250 + 40) and sum(r is not None for r in scheduler.running) == 2
    for _ in range(100):
        for i, s in enumerate(streams):
            got[i] += next(s, [])
    assert got == want and max(batch_sizes) == 2


@pytest.mark.parametrize("sampler", ["rejection", "gumbel", "inverse-cdf"])
@pytest.mark.parametrize("schedule", ["packed", "ar", "lookup", "adaptive"])
def test_a_greedy_request_joins_the_running_sampled_batch_where_it_costs_nothing(model64, schedule, sampler):
    """A server's mixed traffic (Engine.request / add / step): with a fixed schedule, under either sampler, and with
    the adaptive one under shared noise, a greedy request added while a sampled one runs joins its batch, so every
    step is one model call for both; with the adaptive schedule under the rejection sampler it keeps a batch of its
    own (two calls per step; Engine.joining).
    Either way each returns what it returns alone, and added while nothing sampled runs a greedy request decodes
    in a batch of its own program."""
    engine = packed_ss.Engine(model64, schedule=schedule, width=3, sampler=sampler)
    greedy = dict(prompt_ids=PROMPTS[1], max_new_tokens=12, eos_token_id=[])
    sampled = dict(prompt_ids=PROMPTS[0], max_new_tokens=40, eos_token_id=[], temperature=1.0, seed=7)
    want = [engine.generate(**sampled).tokens, engine.generate(**greedy).tokens]
    calls = []
    hook = model64.register_forward_hook(lambda *_: calls.append(1))
    try:
        groups = [engine.add(engine.request(**sampled))]
        engine.step()
        groups.append(engine.add(engine.request(**greedy)))
        engine.step()                  # the greedy request's prefill
        per_step = []
        while not groups[1].done:
            calls.clear()
            engine.step()
            per_step.append(len(calls))
        while engine.step():
            pass
    finally:
        hook.remove()
    joins = schedule != "adaptive" or sampler != "rejection"
    assert len(per_step) > 2 and set(per_step[:-1]) == ({1} if joins else {2})   # the last step may only read
    assert [g.results[0].tokens for g in groups] == want
    alone = engine.add(engine.request(**greedy))
    engine.step()
    assert not engine.runtime.scheduler(engine.program(packed_ss.decode.sampling.SamplingParams())).idle
    while engine.step():
        pass
    assert alone.results[0].tokens == want[1]


def test_request_level_interface(model):
    """Engine.request / add / step / abort, the loop a server's decode thread runs: requests added together
    decode in one batch, each equal to generate alone; an aborted one leaves with its result so far, and the
    other is unaffected."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    reqs = [dict(prompt_ids=PROMPTS[i], max_new_tokens=30, eos_token_id=[], temperature=1.0, seed=i) for i in range(3)]
    want = [engine.generate(**r) for r in reqs]
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        engine.request(PROMPTS[0], max_new_tokens=0)
    groups = [engine.add(engine.request(**r)) for r in reqs]
    streamed = [[] for _ in groups]
    for step in range(200):
        if step == 3:
            engine.abort(groups[2])
        busy = engine.step()
        for got, group in zip(streamed, groups):
            while group.events:
                _, event = group.events.popleft()
                if isinstance(event, list):
                    got += event
        if not busy:
            break
    assert [g.results[0].tokens for g in groups[:2]] == [w.tokens for w in want[:2]] == streamed[:2]
    partial = groups[2].results[0]
    assert groups[2].aborted and 0 < len(partial.tokens) < 30 and partial.tokens == want[2].tokens[:len(partial.tokens)]
    assert partial.nfe > 1 and not engine.step()


def test_the_servers_requests_wait_in_the_engines_queue(model, monkeypatch):
    """The server's decode thread hands every request to the engine at once (one admission layer). One greedy and
    two sampled requests on an adaptive engine of max_batch 1: one runs and the engine's queue holds the other
    two, as the worker counts them (greedy and sampled batches share the one slot); beyond max_waiting `submit`
    refuses; every request still gets what it gets alone."""
    import asyncio
    from packed_ss.serve.metrics import Metrics
    from packed_ss.serve.worker import DecodeWorker, QueueFull
    engine = packed_ss.Engine(model, max_batch=1)
    reqs = [engine.request(**r) for r in requests(3)]
    loads, load = [], engine.load
    monkeypatch.setattr(engine, "load", lambda: (loads.append(load()), loads[-1])[1])     # after every step

    async def served():
        worker = DecodeWorker(engine, Metrics(engine.width), max_waiting=2)      # one slot, two waiting
        pending = [worker.submit(r, len(r.prompt)) for r in reqs]      # all in the inbox before the thread runs
        with pytest.raises(QueueFull):
            worker.submit(reqs[0], len(reqs[0].prompt))
        worker.start()
        results = []
        for p in pending:
            while (event := await p.events.get())[0] != "done":
                assert event[0] == "tokens"
            results.append(event[1].tokens)
        worker.stop()
        return results, worker.counts
    got, final = asyncio.run(served())
    assert got == [engine.generate(**r).tokens for r in requests(3)]
    assert [r.params.greedy for r in reqs] == [True, False, False]
    assert loads[0] == (1, 2) and max(running for running, _ in loads) == 1 and loads[-1] == final == (0, 0)
