"""The lookup drafter (decode/lookup.py) against a plain Python reference, at its edges; greedy output with lookup
drafts equal to AR for every schedule and draft source, batched equal to alone, native equal to torch; causal
checkpoints without a drafting mode."""
import random

import pytest
import torch
from tiny_models import checkpoint, hf_greedy

import packed_ss
from packed_ss.decode.lookup import CONTEXT, NGRAMS, lookup_draft
from packed_ss.decode.sampling import SamplingParams
from packed_ss.decode import registry
from packed_ss.decode.registry import schedules
from packed_ss.decode.epilogue import NativeEpilogue, TorchEpilogue, native_available
from packed_ss.decode.state import DecodeState


def reference(prompt: list[int], out: list[int], width: int, stops=(), ngrams=NGRAMS, context=CONTEXT):
    """The draft as a person would write it: the latest earlier occurrence of the longest matching suffix, then
    the tokens after it copied one at a time (a copy that reaches the end copies what it has just copied); cut
    after the first stop; with the suffix's length (the match's order). None without a match."""
    seq = prompt[-context:] + out
    end = len(seq)
    for n in ngrams:
        if end < n:
            continue
        for e in range(end - 2, n - 2, -1):
            if seq[e - n + 1: e + 1] == seq[end - n:]:
                copy = list(seq)
                draft = []
                for i in range(width):
                    copy.append(copy[e + 1 + i])
                    draft.append(copy[-1])
                    if draft[-1] in stops:
                        break
                return draft, n
    return None


def state_of(prompt, out, width, stops=(), context=CONTEXT):
    st = DecodeState.new(width, 1, len(out) + 4, stops, 0, "cpu", context=prompt, context_len=context)
    st.out[0, :len(out)] = torch.tensor(out, dtype=torch.int64)
    st.n_out.fill_(len(out))
    return st


def drafted(prompt, out, width, stops=(), context=CONTEXT, find=lookup_draft):
    draft, length, order = find(state_of(prompt, out, width, stops, context), width)
    return (draft[0, :length[0]].tolist(), order[0].item()) if order[0] else None


def native_lookup_draft(st, width):
    return NativeEpilogue("cpu", width, False).lookup_draft(st, width)


needs_native = pytest.mark.skipif(not native_available("cpu"), reason="the native epilogue is not built")
FINDERS = [pytest.param(lookup_draft, id="torch"),   # the lookup draft each epilogue drafts with
           pytest.param(native_lookup_draft, id="native", marks=needs_native)]


EDGES = {   # name: (prompt, output, width, stops)
    "no match": ([1, 2, 3, 4], [5, 6], 4, ()),
    "match in the prompt only": ([7, 8, 9, 10, 11, 7, 8], [9], 3, ()),
    "latest match wins": ([5, 6, 1, 5, 6, 2, 5], [6], 2, ()),
    "longest n first": ([1, 2, 3, 9, 2, 3, 8, 1, 2], [3], 2, ()),
    "match overlapping the end": ([4], [3, 3, 3], 5, ()),
    "period of two": ([1, 2, 1], [2], 5, ()),
    "n longer than the output": ([3, 9, 5, 3], [9], 4, ()),
    "shorter than every n": ([5], [], 3, ()),
    "one token so far": ([], [6], 3, ()),
    "stop inside the continuation": ([1, 2, 3, 7, 0, 5, 1, 2], [3], 4, (0,)),
    "stop first": ([1, 2, 0, 7, 1], [2], 3, (0,)),
    "match in the output only": ([9], [1, 2, 3, 1, 2], 2, ()),
    "the last token alone": ([1, 5, 2], [3, 5], 2, ()),
}


@pytest.mark.parametrize("find", FINDERS)
@pytest.mark.parametrize("name", list(EDGES))
def test_edges_match_the_reference(name, find):
    prompt, out, width, stops = EDGES[name]
    assert drafted(prompt, out, width, stops, find=find) == reference(prompt, out, width, stops)


def test_edges_say_what_they_claim():
    """The edge cases are the cases their names say (the reference's drafts, spelled out)."""
    want = {"no match": None, "match in the prompt only": ([10, 11, 7], 3), "latest match wins": ([2, 5], 2),
            "longest n first": ([9, 2], 3), "match overlapping the end": ([3, 3, 3, 3, 3], 2),
            "period of two": ([1, 2, 1, 2, 1], 2), "n longer than the output": ([5, 3, 9, 5], 2),
            "shorter than every n": None, "one token so far": None, "stop inside the continuation": ([7, 0], 3),
            "stop first": ([0], 2), "match in the output only": ([3, 1], 2), "the last token alone": ([2, 3], 1)}
    assert {name: reference(*case) for name, case in EDGES.items()} == want


def test_context_keeps_the_last_prompt_tokens():
    """A prompt longer than the context is searched in its last `context` tokens only."""
    prompt = [1, 2, 3] + [9] * 10 + [4, 5]
    assert drafted(prompt, [1, 2], 2, context=16) == ([3, 9], 2)
    assert drafted(prompt, [1, 2], 2, context=12) is None
    assert reference(prompt, [1, 2], 2, context=12) is None


@pytest.mark.parametrize("find", FINDERS)
@pytest.mark.parametrize("vocab", [6, 16])
def test_random_sequences_match_the_reference(vocab, find):
    """A batch of random sequences of every length, one call: each row equals the reference."""
    rng = random.Random(vocab)
    width, cases = 5, []
    for _ in range(64):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
        out = [rng.randrange(vocab) for _ in range(rng.randint(0 if prompt else 1, 12))]
        cases.append((prompt, out))
    states = [state_of(p, o, width, (0,), context=16) for p, o in cases]
    out_len = max(st.out.shape[1] for st in states)
    for st in states:
        st.out = torch.nn.functional.pad(st.out, (0, out_len - st.out.shape[1]), value=7)
    draft, length, order = find(DecodeState.cat(states), width)
    got = [(draft[b, :length[b]].tolist(), order[b].item()) if order[b] else None for b in range(len(cases))]
    want = [reference(p, o, width, (0,), context=16) for p, o in cases]
    assert got == want
    assert sum(w is not None for w in want) > 8 and sum(w is None for w in want) > 4   # both kinds of row


@pytest.mark.parametrize("find", FINDERS)
def test_the_draft_ignores_what_follows_the_output(find):
    st = state_of([], [1, 2, 1, 2, 5, 5, 5], 3)
    st.n_out.fill_(4)
    draft, length, order = find(st, 3)
    assert order.item() == 2 and draft.tolist() == [[1, 2, 1]] and length.item() == 3


def random_states(gen, vocab, batch, context, out_len, width):
    """A batch of states with random prompts (some shorter than the context's room, -1 before them), outputs of
    every length from 0 to out_len (random tokens after each end), and two stop ids each."""
    states = []
    for _ in range(batch):
        prompt = torch.randint(0, vocab, (int(torch.randint(0, context + 1, (), generator=gen)),), generator=gen)
        stops = torch.randint(0, vocab, (2,), generator=gen).tolist()
        st = DecodeState.new(width, 1, out_len, stops, 0, "cpu", out_len=out_len, stop_slots=2,
                             context=prompt.tolist(), context_len=context)
        st.out.copy_(torch.randint(0, vocab, st.out.shape, generator=gen))
        st.n_out.fill_(int(torch.randint(0, out_len + 1, (), generator=gen)))
        states.append(st)
    return DecodeState.cat(states)


@needs_native
@pytest.mark.parametrize("vocab", [3, 8, 20])
def test_the_native_lookup_draft_is_the_torch_one(vocab):
    """csrc/lookup.h against lookup.lookup_draft on random batches: every request's draft, length and order alike,
    the requests without a match (whose draft means nothing), drafts cut at a stop, and outputs of no token, of
    one and full ones included."""
    gen, orders, lengths = torch.Generator().manual_seed(vocab), [], []
    for batch, context, out_len, width in [(1, 1, 1, 1), (3, 7, 4, 4), (16, 40, 30, 8), (5, 300, 64, 16)]:
        st = random_states(gen, vocab, batch, context, out_len, width)
        want = lookup_draft(st, width)
        got = native_lookup_draft(st, width)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        orders.append(want[2])
        lengths.append(want[1][want[2] > 0] < width)
    orders = torch.cat(orders)
    assert (orders == 0).any() and (orders == 1).any() and (orders > 1).any()      # every kind of row
    assert torch.cat(lengths).any()                                                # drafts cut at a stop


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_point_mass_is_the_torch_one(dtype):
    """csrc/lookup.h's point mass writes the stored Q of the requests that take a lookup draft (zeroed, 1 on each
    draft token, a negative one on token 0) and leaves the others' as they were, as the torch ops do."""
    gen = torch.Generator().manual_seed(0)
    width, support, batch = 4, 50, 6
    st = DecodeState.new(width, support, 8, (), 0, "cpu", q_dtype=dtype)
    st = DecodeState.cat([st] * batch)
    st.q_prob.copy_(torch.rand(st.q_prob.shape, generator=gen, dtype=dtype))
    draft = torch.randint(-1, support, (batch, width), generator=gen)
    rows = torch.tensor([True, False, True, True, False, True])
    before = st.q_prob.clone()
    TorchEpilogue("cpu", width, True).point_mass(st, draft, rows)
    want, st.q_prob = st.q_prob, before.clone()
    NativeEpilogue("cpu", width, True).point_mass(st, draft, rows)
    assert torch.equal(st.q_prob, want)
    assert torch.equal(want[~rows], before[~rows]) and torch.equal(want[rows].sum(-1), torch.ones(4, width, dtype=dtype))
    assert (draft < 0).any()


# -- decoding with lookup drafts ------------------------------------------------------------------------------------
DRAFTING = [(s, d) for s in ("linear", "quadratic", "packed") for d in ("lookup", "both")] + [("lookup", None)]


@pytest.mark.parametrize("schedule,drafts", DRAFTING)
def test_greedy_with_lookup_drafts_equals_ar(shipped, schedule, drafts):
    """The shipped model on HumanEval prompts (code repeats: lookup drafts are accepted many tokens deep)."""
    model, prompts = shipped
    ar = packed_ss.Engine(model, schedule="ar").generate_batch(prompts, max_new_tokens=64)
    engine = packed_ss.Engine(model, schedule=schedule, drafts=drafts, width=5)
    got = [engine.generate(p, max_new_tokens=64) for p in prompts]
    assert [r.tokens for r in got] == [r.tokens for r in ar]
    assert max(r.accepted_at[3] for r in got) > 0     # drafts accepted four deep: the lookup drafts were used


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=3)], ids=["greedy", "T1"])
def test_batched_equals_alone(shipped, epilogue, sampling):
    """In float64, where the promise is made: in float32 a batched call may round differently from a request's
    call alone (on an Intel Xeon it flips a T = 1 draw of the first prompt at token 26)."""
    if epilogue == "native" and not packed_ss.decode.epilogue.native_available("cpu"):
        pytest.skip("native epilogue not built")
    model, prompts = packed_ss.load_model(dtype=torch.float64), shipped[1]
    engine = packed_ss.Engine(model, "packed", drafts="both", width=5, epilogue=epilogue)
    batched = engine.generate_batch(prompts, max_new_tokens=48, **sampling)
    alone = [packed_ss.Engine(model, "packed", drafts="both", width=5, epilogue="torch").generate(
        p, max_new_tokens=48, **(dict(sampling, seed=sampling["seed"] + i) if sampling else {}))
        for i, p in enumerate(prompts)]
    assert [(r.tokens, r.accepted_at) for r in batched] == [(r.tokens, r.accepted_at) for r in alone]


@pytest.mark.parametrize("name", ["llama-gqa", "mistral-untied", "qwen3-qknorm"])
def test_a_causal_checkpoint_decodes_with_lookup(name):
    """No mask_token_id: it loads, decodes by lookup (its default: the adaptive schedule with AR and lookup shapes;
    and schedule="lookup") and AR exactly as transformers does, and the schedules that need mask rows refuse it by
    name."""
    path = checkpoint(name, vocab_size=11, mask_token_id=None)
    model = packed_ss.load_model(path, dtype=torch.float64)
    assert model.cfg.mask_token_id is None
    prompt = [3, 4, 5, 3, 4, 5, 3]
    want = hf_greedy(path, prompt, 24, eos_token_id=[])
    engine = packed_ss.Engine(model, width=4)
    assert (engine.schedule_name, engine.drafts) == ("adaptive", "lookup")
    assert {s.kind for s in engine.program(SamplingParams()).policy.shapes} == {"ar", "lookup"}
    assert engine.generate(prompt, max_new_tokens=24, eos_token_id=[]).tokens == want
    got = packed_ss.Engine(model, schedule="lookup", width=4).generate(prompt, max_new_tokens=24, eos_token_id=[])
    assert got.tokens == want and got.n_accepted > 0
    assert packed_ss.Engine(model, schedule="ar").generate(prompt, max_new_tokens=24, eos_token_id=[]).tokens == want
    for schedule in ("linear", "quadratic", "packed"):
        with pytest.raises(ValueError, match="no drafting mode"):
            packed_ss.Engine(model, schedule=schedule)
    with pytest.raises(ValueError, match="no drafting mode"):
        packed_ss.Engine(model, drafts="both")


@pytest.mark.parametrize("kwargs,message", [
    (dict(drafts="ngram"), "drafts must be one of"),
    (dict(schedule="ar", drafts="lookup"), "schedule 'ar' does not draft"),
    (dict(schedule="lookup", drafts="both"), r"schedule 'lookup' takes drafts from \('lookup',\)"),
])
def test_bad_draft_options(shipped, kwargs, message):
    with pytest.raises(ValueError, match=message):
        packed_ss.Engine(shipped[0], **kwargs)


def test_a_new_schedule_is_a_class_and_a_registry_line(shipped, monkeypatch):
    """A schedule declares where its drafts come from (`draft_sources`) and which replay predicts it (`replay`):
    registered under a new name it is checked, built, sized and run like the shipped ones, nothing else
    changed. Here lookup drafts verified at most 3 deep, on the shipped model (which also has a drafting mode)."""
    class LookupThree(schedules()["lookup"]):
        name = "lookup3"

        def __init__(self, model, width, params, epilogue, draft_source="lookup"):
            super().__init__(model, min(width, 3), params, epilogue, draft_source)

    monkeypatch.setitem(registry.SCHEDULES, "lookup3", (LookupThree, None))
    model, prompt = packed_ss.load_model(dtype=torch.float64), shipped[1][0]
    engine = packed_ss.Engine(model, schedule="lookup3", epilogue="torch")
    assert engine.drafts == "lookup"
    got = engine.generate(prompt, max_new_tokens=32)
    assert got.tokens == packed_ss.Engine(model, schedule="ar").generate(prompt, max_new_tokens=32).tokens
    assert got.n_accepted > 0 and len(got.accepted_at) == 3
    with pytest.raises(ValueError, match="schedule 'lookup3' takes drafts from"):
        packed_ss.Engine(model, schedule="lookup3", drafts="diffusion")


def test_every_schedule_is_covered():
    assert {s for s, _ in DRAFTING} | {"ar", "adaptive"} == set(schedules())     # adaptive: tests/test_adaptive.py
