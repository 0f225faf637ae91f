"""The paged K/V pool and its prefix cache (runtime/kv_pool.py, DESIGN §14).

1. Block accounting on the host: reference counts, the free list, publishing by chained hash, LRU eviction of
   published pages nobody holds, a failed acquisition holding nothing, pages zeroed on first use.
2. Through the engine (float64, where a call's rows cannot flip a token): with the prefix cache on and off, and
   with a pool small enough to force eviction and preemption, every schedule's greedy and seeded sampled
   tokens are the same, alone and batched; prompts found in the cache prefill only the rest
   (`cached_tokens`); the pool holds nothing once the engine is idle, after an abort, a closed stream or an
   error in a step.
3. SGLang's randomized check: a few hundred requests drawn from a random prompt tree arrive in a random order
   at a small pool (hits, evictions, preemptions), each one's tokens equal to the request decoded alone.
"""
import random

import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.runtime.kv_pool import KVPool, page_hashes

BS = 4   # cache positions per page in the unit tests


class PoolModel:
    """The one thing a pool asks of its model: K and V pools of a shape (NaN-filled, as uninitialised memory may be)."""
    def kv_pools(self, pages, page_size):
        shape = (2, pages, page_size, 1, 3)
        return torch.full(shape, float("nan")), torch.full(shape, float("nan"))


def pool(pages: int = 9) -> KVPool:
    return KVPool(PoolModel(), pages, BS)


# -- 1. accounting -------------------------------------------------------------------------------------------
def test_take_and_release_count_references():
    p = pool()
    assert (p.available, p.held) == (8, 0)
    a, b = p.take(3), p.take(5)
    assert sorted(a + b) == list(range(1, 9)) and p.available == 0 and p.take(1) is None
    p.release(a)
    assert (p.available, p.held) == (3, 5)
    assert p.take(3) == a                                    # unpublished pages go back to the free list


def test_blocks_are_zeroed_on_first_use_only():
    p = pool()
    assert torch.equal(p.k[:, 0], torch.zeros_like(p.k[:, 0]))         # the null page
    (page,) = p.take(1)
    assert torch.equal(p.k[:, page], torch.zeros_like(p.k[:, page])) and torch.isnan(p.k[:, page + 1]).all()
    p.k[:, page] = 7.0
    p.release([page])
    again = p.take(8)
    assert page in again and (p.k[:, page] == 7.0).all()            # finite already: not zeroed again
    assert not torch.isnan(p.k[:, again]).any()


def test_published_blocks_are_shared_by_a_prompt_that_starts_with_them():
    p = pool()
    prompt = list(range(10))                                 # two full pages and two tokens
    pages, cached = p.acquire(prompt, len(prompt) - 1, 12)
    assert cached == 0 and len(pages) == 3
    p.publish(pages, prompt)
    again, cached = p.acquire(prompt + [99], 10, 16)
    assert cached == 8 and again[:2] == pages[:2] and again[2] not in pages
    assert p.held == 3 + 2 and p.usage(0).cached == 2
    assert (p.queried_tokens, p.hit_tokens) == (9 + 10, 8)
    p.release(pages)
    assert p.held == 4                                       # the shared two are still held by the second
    other, cached = p.acquire([5] + prompt[1:], 9, 12)        # another first token: the chain matches nothing
    assert cached == 0 and not set(other) & set(again)


def test_a_partial_block_and_the_last_prompt_token_are_never_matched():
    p = pool()
    prompt = list(range(8))
    pages, _ = p.acquire(prompt, 7, 8)
    p.publish(pages, prompt)                                 # both pages are full: both published
    assert p.usage(0).cached == 2
    _, cached = p.acquire(prompt, 7, 8)                       # the same prompt: its last token is prefilled
    assert cached == 4


def test_idle_published_blocks_are_evicted_least_recently_used_first():
    p = pool(5)                                               # four pages
    first, second = [1, 2, 3, 4], [5, 6, 7, 8]
    for tokens in (first, second):
        pages, _ = p.acquire(tokens, 4, 4)
        p.publish(pages, tokens)
        p.release(pages)
    assert (p.held, p.available, p.usage(0).cached) == (0, 4, 2)
    hit, cached = p.acquire(first, 4, 4)                      # `first` is used again: `second` is now the LRU
    assert cached == 4
    p.release(hit)
    taken = p.take(3)                                         # two free, then one eviction: `second`'s page
    assert p.evictions == 1 and p.usage(0).cached == 1
    hit, cached = p.acquire(first, 4, 4)
    assert cached == 4                                        # `first` stayed
    p.release(hit + taken)


def test_a_failed_acquisition_holds_nothing():
    p = pool(4)                                               # three pages
    tokens = list(range(8))
    pages, _ = p.acquire(tokens, 8, 8)
    p.publish(pages, tokens)
    p.release(pages)
    held = p.take(1)
    assert p.acquire(tokens, 8, 16) is None                   # two found, two fresh wanted, one there
    assert (p.held, p.available) == (1, 2) and p.acquire(tokens, 8, 8)[1] == 8
    p.release(held)


def test_block_hashes_chain_over_the_prefix():
    a, b = page_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4), page_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and len(b) == 2 and a[0] != b[0] and a[1] != b[1]   # same second page, other parent
    assert page_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4) == a


# -- 2. through the engine -----------------------------------------------------------------------------------
PROMPTS = [[(5 * i + 3) % 90 + 1 for i in range(40)], [(5 * i + 3) % 90 + 1 for i in range(33)] + [7, 7],
           [(5 * i + 3) % 90 + 1 for i in range(16)], [11, 12, 13]]
SCHEDULES = ["ar", "linear", "quadratic", "packed", "lookup", "adaptive"]
SETTINGS = {"greedy": {}, "sampled": dict(temperature=1.0, top_k=8)}


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float64)


def engine(model, schedule, **options):
    return packed_ss.Engine(model, schedule=schedule, width=3 if schedule != "adaptive" else "auto", page_size=16,
                            **options)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_prefix_cache_and_a_small_pool_change_no_token(model, schedule, setting):
    """Off, on, and on with a pool of 12 pages (evictions, preemptions): the same tokens for every request,
    alone and batched, and the requests after the first find their prompts' pages."""
    kwargs = dict(SETTINGS[setting], max_new_tokens=24, eos_token_id=[])
    seeds = list(range(len(PROMPTS)))
    off = engine(model, schedule, prefix_cache=False)
    want = [off.generate(p, seed=s, **kwargs).tokens for p, s in zip(PROMPTS, seeds)]
    page_bytes = off.kv_usage().page_bytes
    for options in (dict(), dict(kv_cache_bytes=12 * page_bytes)):
        on = engine(model, schedule, **options)
        alone = [on.generate(p, seed=s, **kwargs) for p, s in zip(PROMPTS, seeds)]
        assert [r.tokens for r in alone] == want
        assert alone[1].cached_tokens == 32 and alone[2].cached_tokens == 0     # 16 tokens: the last is prefilled
        batched = on.generate_batch(PROMPTS + PROMPTS, seed=seeds + seeds, **kwargs)
        assert [r.tokens for r in batched] == want + want
        usage = on.kv_usage()
        assert usage.held == 0 and usage.hit_tokens > 0
    assert usage.evictions > 0 and usage.preemptions > 0


def test_outputs_are_published_for_the_next_turn(model):
    """A chat's next turn (prompt + reply + more) finds the first turn's prompt and reply pages."""
    eng = engine(model, "packed")
    first = eng.generate(PROMPTS[0], max_new_tokens=30, eos_token_id=[])
    following = PROMPTS[0] + first.tokens + [3, 4, 5]
    second = eng.generate(following, max_new_tokens=10, eos_token_id=[])
    assert second.cached_tokens == (len(PROMPTS[0]) + len(first.tokens) - 1) // 16 * 16 == 64
    assert second.tokens == engine(model, "packed", prefix_cache=False).generate(following, max_new_tokens=10,
                                                                                 eos_token_id=[]).tokens


def test_nothing_is_held_after_an_abort_a_closed_stream_or_an_error(model, monkeypatch):
    eng = engine(model, "packed")
    group = eng.add(eng.request(PROMPTS[0], max_new_tokens=20, eos_token_id=[]))
    eng.step()
    eng.step()
    assert eng.kv_usage().held > 0
    eng.abort(group)
    assert eng.kv_usage().held == 0
    stream = eng.stream(PROMPTS[1], max_new_tokens=20, eos_token_id=[])
    next(stream)
    assert eng.kv_usage().held > 0
    stream.close()
    assert eng.kv_usage().held == 0

    def broken(inp, cache):
        raise RuntimeError("the device fell over")
    eng.generate(PROMPTS[2], max_new_tokens=4)                    # the batch exists; its next calls fail
    monkeypatch.setattr(eng.runtime, "forward", broken)
    with pytest.raises(RuntimeError, match="fell over"):
        eng.generate_batch(PROMPTS, max_new_tokens=20, eos_token_id=[])
    assert eng.kv_usage().held == 0


def test_a_request_whose_prefill_fails_ends_with_the_error(model, monkeypatch):
    """A call that fails while requests are being started (their prefill) ends them with its error too: a caller
    driving the loop itself (a server's decode thread) sees it on the group instead of waiting for ever."""
    eng = engine(model, "packed")
    eng.generate(PROMPTS[2], max_new_tokens=4)

    def broken(inp, cache):
        raise RuntimeError("the device fell over")
    monkeypatch.setattr(eng.runtime, "forward", broken)
    group = eng.add(eng.request(PROMPTS[0], max_new_tokens=8, eos_token_id=[]))
    assert not eng.step()
    assert group.done and "fell over" in str(group.error) and eng.kv_usage().held == 0


def test_usage_reports_the_pool(model):
    eng = engine(model, "ar", kv_cache_bytes=10 * 16 * 2 * 2 * 2 * 16 * 8)   # 10 pages of 2 layers, 2 heads, dim 16
    usage = eng.kv_usage()
    assert (usage.pages, usage.page_size, usage.page_bytes) == (9, 16, 16 * 2 * 2 * 2 * 16 * 8)
    with pytest.raises(ValueError, match="page_size must divide 256, got 12"):
        packed_ss.Engine(model, schedule="ar", page_size=12)
    with pytest.raises(ValueError, match=r"page_size must be an integer \[1, 256\], got 0"):
        packed_ss.Engine(model, schedule="ar", page_size=0)


# -- 3. a random prompt tree -------------------------------------------------------------------------------------
def random_tree_prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts that share heads: each one extends a random earlier one (or the root) by 1-40 random tokens."""
    prompts = [[rng.randrange(1, 90) for _ in range(rng.randrange(1, 24))]]
    while len(prompts) < n:
        parent = rng.choice(prompts + [[]])
        prompts.append(parent + [rng.randrange(1, 90) for _ in range(rng.randrange(1, 40))])
    return prompts


@pytest.mark.parametrize("schedule", ["packed", "adaptive"])
def test_random_prompt_tree(model, schedule):
    """240 requests from a random prompt tree (prompts of up to ~200 tokens sharing heads), greedy and sampled,
    arriving in a random order in waves at a pool of 40 pages: each one's tokens equal the request alone."""
    rng = random.Random(7)
    prompts = random_tree_prompts(rng, 240)
    caps = [rng.randrange(1, 12) for _ in prompts]
    temps = [rng.choice([0.0, 1.0]) for _ in prompts]
    off = engine(model, schedule, prefix_cache=False)
    want = [off.generate(p, max_new_tokens=c, temperature=t, seed=i, eos_token_id=[]).tokens
            for i, (p, c, t) in enumerate(zip(prompts, caps, temps))]
    small = engine(model, schedule, kv_cache_bytes=40 * off.kv_usage().page_bytes)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    groups = {}
    while order or any(not g.done for g in groups.values()):
        for i in order[:rng.randrange(0, 12)]:            # a wave of arrivals, then a few steps
            groups[i] = small.add(small.request(prompts[i], caps[i], temperature=temps[i], seed=i, eos_token_id=[]),
                                  stream=False)
        order = order[len([i for i in order if i in groups]):]
        for _ in range(rng.randrange(1, 4)):
            small.step()
    assert all(groups[i].results[0].tokens == want[i] for i in range(len(prompts)))
    usage = small.kv_usage()
    assert usage.held == 0 and usage.hit_tokens > 0 and usage.evictions > 0
