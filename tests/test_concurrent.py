"""Several callers on one Engine: generators consumed in turn and threads each get exactly what they get alone,
and a generator closed early leaves nothing held (packed_ss/runtime/loop.py: a cache and batch per running
decode, iterations taking turns under the runtime's lock)."""
import threading

import pytest
import torch
from tiny_models import checkpoint

import packed_ss

PROMPTS = [[3, 17, 42, 8, 9], list(range(1, 20)), [60, 3], [11, 11, 40, 7, 7, 90, 1, 4]]
SETTINGS = [dict(), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_k=10, seed=4), dict(top_p=0.9,
                                                                                               temperature=1.2, seed=5)]


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


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


def test_threads_equal_alone(model):
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    reqs = requests(8)
    alone = [engine.generate(**r).tokens for r in reqs]
    got = [None] * len(reqs)

    def worker(k: int) -> None:
        for i in range(k, len(reqs), 4):
            got[i] = engine.generate(**reqs[i]).tokens
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == alone


def test_closed_stream_releases_what_it_held(model):
    """A stream closed after its first tokens: the shared cache is free again, the next request uses it and
    gets its tokens alone; a stream left open makes the next request run on a cache of its own."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    first, second = requests(2)
    want = engine.generate(**second).tokens
    stream = engine.stream(**first)
    next(stream)
    assert engine.runtime._cache_held
    private = engine.generate(**second)
    assert private.tokens == want and engine.runtime._cache_held
    stream.close()
    assert not engine.runtime._cache_held
    assert engine.generate(**second).tokens == want


def test_interleaved_streams_in_graph_mode(model, eager_graphs):
    """The graph loop's persistent batch is held by one decode; another gets a batch (and graphs) of its own
    (CPU stand-ins replace capture: the conftest fixture)."""
    eager = packed_ss.Engine(model, schedule="packed", width=3)
    graphed = packed_ss.Engine(model, schedule="packed", width=3)
    graphed.runtime.mode = "graph"
    reqs = requests(3)
    alone = [eager.generate(**r).tokens for r in reqs]
    streams, got = [graphed.stream(**r) for r in reqs], [[] for _ in reqs]
    for _ in range(100):
        for i, s in enumerate(streams):
            got[i] += next(s, [])
    assert got == alone and eager_graphs
