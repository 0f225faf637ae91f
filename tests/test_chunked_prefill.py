"""A prompt longer than `prefill_chunk` enters its cache a chunk per scheduler step (runtime/scheduler.py):
the same tokens as a prefill in one call (float64 models: the attention sums' rounding cannot flip a token),
and requests already running keep decoding between its chunks, waiting one chunk's call per step at most.
Where a test decodes a request alone first and counts chunks after, the prefix cache is off (the prompt would
come from it)."""
import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.decode.sampling import SamplingParams
from packed_ss.runtime import Request, Runtime

LONG = [(7 * i + 3) % 90 + 1 for i in range(45)]    # 45 tokens: chunks of 8 -> 5 chunk calls, then the prefill
SHORT = [3, 17, 42, 8, 9]
CHUNK = 8


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float64)


@pytest.fixture(scope="module")
def any_order_model():
    return packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float64)


@pytest.fixture
def calls(monkeypatch):
    """Every model call the runtime makes, in order: ("chunk", rows) or ("call", rows)."""
    made = []
    prefix, forward = Runtime.prefix, Runtime.forward

    def chunk(self, tokens, *args):
        made.append(("chunk", len(tokens)))
        prefix(self, tokens, *args)

    def call(self, inp, cache):
        made.append(("call", inp.tokens.shape[-1]))
        return forward(self, inp, cache)
    monkeypatch.setattr(Runtime, "prefix", chunk)
    monkeypatch.setattr(Runtime, "forward", call)
    return made


SAMPLING = [dict(), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_p=0.9, seed=4)]


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "T=1", "top-p"])
def test_chunked_prefill_gives_the_tokens_of_one_call(model, calls, schedule, sampling):
    request = dict(prompt_ids=LONG, max_new_tokens=24, eos_token_id=[], **sampling)
    whole = packed_ss.Engine(model, schedule=schedule, width=3).generate(**request)
    calls.clear()
    chunked = packed_ss.Engine(model, schedule=schedule, width=3, prefill_chunk=CHUNK).generate(**request)
    assert chunked.tokens == whole.tokens and chunked.nfe == whole.nfe
    assert [c for c in calls if c[0] == "chunk"] == [("chunk", CHUNK)] * 5
    assert calls[5][1] == len(LONG) - 5 * CHUNK + (4 if schedule != "ar" else 0)   # the rest + W + 1 masks


@pytest.mark.parametrize("schedule", ["packed", "threshold"])
@pytest.mark.parametrize("sampling", SAMPLING[:2], ids=["greedy", "T=1"])
def test_chunked_prefill_any_order(any_order_model, calls, schedule, sampling):
    request = dict(prompt_ids=LONG, max_new_tokens=20, eos_token_id=[], **sampling)
    if schedule == "threshold" and sampling:
        pytest.skip("the threshold decoder is greedy")
    whole = packed_ss.Engine(any_order_model, schedule=schedule, width=3).generate(**request)
    calls.clear()
    chunked = packed_ss.Engine(any_order_model, schedule=schedule, width=3, prefill_chunk=CHUNK).generate(**request)
    assert chunked.tokens == whole.tokens
    assert sum(c[0] == "chunk" for c in calls) == 5


def test_running_requests_decode_between_the_chunks(model, calls):
    """A long prompt joins a running stream: after each of its chunks the runtime runs the running request's
    iteration before the next chunk, so the stream gains tokens while the prompt is read in; both get what
    they get alone, and the long request's slot is the batch's second."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, prefill_chunk=CHUNK, prefix_cache=False)
    short, long = (dict(prompt_ids=p, max_new_tokens=60, eos_token_id=[]) for p in (SHORT, LONG))
    want_short, want_long = engine.generate(**short).tokens, engine.generate(**long).tokens
    first = engine.stream(**short)
    got_short = next(first)
    second = engine.stream(**long)
    calls.clear()
    got_long = []
    for _ in range(200):
        got_long += next(second, [])
        got_short += next(first, [])
    assert got_short == want_short and got_long == want_long
    chunks = [i for i, c in enumerate(calls) if c[0] == "chunk"]
    assert len(chunks) == 5
    # Between two chunks (and after the last) comes one iteration of the running request: one Packed-SS call.
    assert all(calls[i + 1] == ("call", 8) for i in chunks), calls[:16]
    assert max(rows for _, rows in calls) <= CHUNK + 4


def test_prompts_reading_in_move_with_a_growing_batch(model):
    """Two long prompts join one after the other while a short request runs, on the scheduler's request-level
    interface (add / step): the batch grows under the first one's chunks (its cache rows move to the new batch),
    and every request gets what it gets alone."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, prefill_chunk=CHUNK, prefix_cache=False)
    prompts = [SHORT, LONG, LONG[::-1]]
    alone = [engine.generate(p, max_new_tokens=30, eos_token_id=[], temperature=1.0, seed=i).tokens
             for i, p in enumerate(prompts)]
    params = SamplingParams(temperature=1.0)
    scheduler = engine.runtime.scheduler(engine.program(params))
    add = lambda i: scheduler.add([Request(prompts[i], 30, i, [], [], params)], 1, stream=False)   # noqa: E731
    groups = [add(0)]
    scheduler.step()
    groups.append(add(1))
    scheduler.step()                        # the batch grows to two slots; the first chunk of the first
    assert list(scheduler.prefilling) == [1] and scheduler.batch.slots == 2
    groups.append(add(2))
    scheduler.step()                        # four slots: the first long prompt's cache moved, the second's starts
    assert list(scheduler.prefilling) == [1, 2] and scheduler.batch.slots == 4
    while not all(g.done for g in groups):
        scheduler.step()
    assert [g.results[0].tokens for g in groups] == alone


def test_aborting_a_request_while_its_prompt_is_read_in_frees_its_slot(model):
    engine = packed_ss.Engine(model, schedule="packed", width=3, prefill_chunk=CHUNK)
    want = engine.generate(SHORT, max_new_tokens=40, eos_token_id=[]).tokens
    scheduler = engine.runtime.scheduler(engine.program(SamplingParams()))
    short = scheduler.add([Request(SHORT, 40, 0, [], [])], 1, stream=False)
    scheduler.step()
    long = scheduler.add([Request(LONG, 40, 0, [], [])], 1, stream=False)
    scheduler.step()
    assert list(scheduler.prefilling) == [1]
    scheduler.abort(long)
    assert not scheduler.prefilling and scheduler._free() == [1]
    while not short.done:
        scheduler.step()
    assert short.results[0].tokens == want and scheduler.idle


def test_prefill_chunk_is_checked(model):
    with pytest.raises(ValueError, match=r"prefill_chunk must be an integer >= 1, got 0"):
        packed_ss.Engine(model, width=3, prefill_chunk=0)


def test_a_long_prompt_in_a_slot_another_request_left(model):
    """A long prompt reads in while its slot's row (a finished request's) still rides along in the batch's calls:
    those calls write nothing into the pages it is filling, and every request gets what it gets alone."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, prefill_chunk=CHUNK, prefix_cache=False)
    prompts, caps = [SHORT, SHORT[::-1], SHORT[1:], LONG], [40, 3, 40, 30]    # LONG takes slot 1 once it is free
    alone = [engine.generate(p, max_new_tokens=c, eos_token_id=[]).tokens for p, c in zip(prompts, caps)]
    got = engine.generate_batch(prompts, max_new_tokens=caps, eos_token_id=[], batch_size=3)
    assert [r.tokens for r in got] == alone


def test_a_long_prompt_found_in_the_prefix_cache_reads_in_the_rest(model, calls):
    """A long prompt whose first pages are published reads in only what follows them, a chunk per step."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, prefill_chunk=CHUNK)
    first = engine.generate(LONG[:32], max_new_tokens=4, eos_token_id=[])
    calls.clear()
    got = engine.generate(LONG, max_new_tokens=30, eos_token_id=[])
    want = packed_ss.Engine(model, schedule="packed", width=3, prefix_cache=False).generate(LONG, max_new_tokens=30,
                                                                                          eos_token_id=[])
    assert got.tokens == want.tokens and first.cached_tokens == 0
    assert got.cached_tokens == 32 + 4 // 16 * 16        # the first prompt's two pages; its output fills none
    assert [c for c in calls if c[0] == "chunk"] == [("chunk", CHUNK)]    # 45 - 32 = 13 tokens: one chunk, the rest
