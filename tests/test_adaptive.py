"""The adaptive schedule (decode/schedules/adaptive.py) and its policy (decode/policy.py): whatever call shapes
the policy picks, greedy output equals AR's, a seeded sampled request returns its AR sample under shared noise,
and under the rejection sampler batched equals alone and sequences follow the AR law (G-tests, with a broken
rule flagged). A policy forced to switch shapes every other iteration shows the switches are safe; the policy's
statistics and choice are checked on states built by hand."""

import collections
import random
import threading

import pytest
import torch
from tiny_models import checkpoint

from sampling_law import (ALPHA, POWER, T1, TOP_K, TOP_P, ar_checkpoint, ar_law, bonus_from_residual, case_id, draw,
                          draw_batched, follows, g_test_pvalue, length_for)

import packed_ss
import packed_ss.decode.epilogue.reference as torch_epilogue
from packed_ss.decode.epilogue import NativeEpilogue, native_available
from packed_ss.decode.policy import DOZE, QUIET, QUIET_RUNS, RATE, Policy, Shape, shapes_for
from packed_ss.decode.sampling import SamplingParams
from packed_ss.runtime import Request
from packed_ss.runtime.batch import Batch


class Cycling(Policy):
    """Switches shape every other iteration, whatever it earns (a request's shape after its n-th call is
    ((n - 1) // 2 - 1) mod S: twice in a row, so that a packed shape verifies the proposals its first call retained,
    the widest first after the prefill, so that a short output can hold a bonus).
    Choosing per request, requests that joined at different times switch at different iterations."""

    def choose(self, st, length, order, passive=None):
        st.assign(~st.done, choice=((st.nfe - 1) // 2 - 1) % len(self.shapes))
        if not self.per_request:
            st.choice.copy_(st.choice.max().expand_as(st.choice))


class Dozing(Cycling):
    """Cycling, and a request dozes (goes quiet for 3 iterations) after its calls 3, 10, 17, ..: requests that
    joined at different times doze at different iterations, so calls hold quiet requests beside the others, and
    the lean QUIET call runs where all are quiet."""

    def choose(self, st, length, order, passive=None):
        passive = torch.zeros_like(st.done) if passive is None else passive
        kept = st.choice.clone()
        super().choose(st, length, order)
        st.choice.copy_(torch.where(passive, kept, st.choice))          # a quiet request keeps its choice
        st.assign(~st.done & ~passive & (st.nfe % 7 == 3), quiet_until=st.nfe + 3)


def cycling(engine, policy=Cycling):
    engine.policy_type = policy
    return engine


def shapes_of(engine, **sampling):
    return engine.program(SamplingParams(**sampling)).policy.shapes


@pytest.fixture
def shapes_run(monkeypatch):
    """The call shapes the batches iterate in, in order."""
    seen, iterate = [], Batch.iterate

    def recording(self, first, shape=0):
        seen.append(shape)
        return iterate(self, first, shape)
    monkeypatch.setattr(Batch, "iterate", recording)
    return seen


@pytest.fixture(scope="module")
def random_model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float64)


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("drafts", ["both", "lookup", "diffusion"])
def test_switching_every_iteration_keeps_greedy_output(shipped, shapes_run, drafts, epilogue):
    if epilogue == "native" and not native_available("cpu"):
        pytest.skip("the native epilogue is not built")
    model, prompts = shipped
    ar = packed_ss.Engine(model, schedule="ar").generate_batch(prompts, max_new_tokens=48)
    engine = cycling(packed_ss.Engine(model, width=5, drafts=drafts, epilogue=epilogue))
    alone = [engine.generate(p, max_new_tokens=48) for p in prompts]
    batched = engine.generate_batch(prompts, max_new_tokens=48)
    assert [r.tokens for r in alone] == [r.tokens for r in ar] == [r.tokens for r in batched]
    assert set(shapes_run) == set(range(len(shapes_of(engine))))         # every shape ran, switching each time
    assert sum(a != b for a, b in zip(shapes_run, shapes_run[1:])) > len(shapes_run) // 4
    assert max(r.n_accepted for r in alone) > 0                           # drafts were accepted on the way


@pytest.mark.parametrize("setting", [dict(temperature=1.0), dict(temperature=0.8, top_k=10),
                                     dict(temperature=1.2, top_p=0.9)], ids=["T1", "T0.8,k10", "T1.2,p0.9"])
@pytest.mark.parametrize("policy", ["cycling", "default"])
@pytest.mark.parametrize("sampler", ["gumbel", "inverse-cdf"])
def test_sampled_request_returns_its_ar_sample(random_model, sampler, setting, policy):
    """Shared noise: the same tokens as schedule="ar" for a seed, alone and batched, however the shapes switch."""
    prompts = [[3, 17, 42, 8, 9], list(range(1, 20)), [9, 9, 9, 9, 9, 9], [60, 3]]
    ar = packed_ss.Engine(random_model, schedule="ar", sampler=sampler)
    want = [ar.generate(p, 30, eos_token_id=[], seed=7 + i, **setting).tokens for i, p in enumerate(prompts)]
    engine = packed_ss.Engine(random_model, width=4, sampler=sampler)
    if policy == "cycling":
        cycling(engine)
    alone = [engine.generate(p, 30, eos_token_id=[], seed=7 + i, **setting).tokens for i, p in enumerate(prompts)]
    batched = engine.generate_batch(prompts, 30, eos_token_id=[], seed=7, batch_size=3, **setting)
    assert alone == want == [r.tokens for r in batched]


def test_the_policy_sees_requests_waiting_for_a_slot(random_model, monkeypatch):
    """Five requests in batches of at most two: every iteration's state says requests wait (`queued`) until the
    last is admitted, and none from then on (Policy.batch_tokens values gained tokens by it)."""
    seen, iterate = [], Batch.iterate

    def recording(self, first, shape=0):
        seen.append(set(self.state.queued.tolist()))            # one value, in every row
        return iterate(self, first, shape)
    monkeypatch.setattr(Batch, "iterate", recording)
    prompts = [[5, 6, 7, 5, 6, 7, 5], [1, 2, 3], list(range(30, 60)), [9, 9, 9], [60, 3]]
    packed_ss.Engine(random_model).generate_batch(prompts, 12, eos_token_id=[], batch_size=2)
    waited = seen.count({True})
    assert 0 < waited < len(seen) and seen == [{True}] * waited + [{False}] * (len(seen) - waited)


def test_requests_beyond_max_batch_wait_in_the_engines_queue(random_model, monkeypatch):
    """Requests added one by one (a server's) to an engine of max_batch 2: at most two run at once, the policy sees
    the others wait (`queued`) until the last is admitted, and each gets what it gets alone."""
    seen, iterate = [], Batch.iterate
    monkeypatch.setattr(Batch, "iterate", lambda self, *a, **k: (seen.append(set(self.state.queued.tolist())),
                                                                  iterate(self, *a, **k))[1])
    prompts = [[5, 6, 7, 5, 6], [1, 2, 3], list(range(30, 50)), [9, 9, 9], [60, 3]]
    engine = packed_ss.Engine(random_model, max_batch=2)
    groups = [engine.add(engine.request(p, 12 + 3 * i, eos_token_id=[])) for i, p in enumerate(prompts)]
    loads = []
    while engine.step():
        loads.append(engine.load())
    assert max(running for running, _ in loads) == 2 and loads[0] == (2, 3) and engine.load() == (0, 0)
    waited = seen.count({True})
    assert 0 < waited < len(seen) and seen == [{True}] * waited + [{False}] * (len(seen) - waited)
    alone = packed_ss.Engine(random_model)
    assert [g.results[0].tokens for g in groups] == [alone.generate(p, 12 + 3 * i, eos_token_id=[]).tokens
                                                     for i, p in enumerate(prompts)]


def test_max_batch_counts_greedy_and_sampled_requests_together_in_the_order_they_came(random_model):
    """The adaptive schedule runs greedy and sampled requests in a batch each; `max_batch` bounds them together,
    and a request waiting in one batch's queue is not overtaken by a later one of the other. The greedy batch
    steps first, and the short sampled request ends first: the slot it frees goes to the sampled request that
    came before the second greedy one."""
    arrivals = [([1, 2, 3], 48, {}), ([5, 6, 7, 5, 6], 6, dict(temperature=1.0, seed=3)),
                (list(range(30, 50)), 12, dict(temperature=0.7, top_p=0.95, seed=4)), ([9, 9, 9], 8, {})]
    engine = packed_ss.Engine(random_model, max_batch=2)
    groups = [engine.add(engine.request(p, n, eos_token_id=[], **s)) for p, n, s in arrivals]
    loads, began = [], [None] * len(groups)
    while engine.step():
        loads.append(engine.load())
        began = [len(loads) - 1 if b is None and g.events else b for b, g in zip(began, groups)]
    assert loads[0] == (2, 2) and max(running for running, _ in loads) == 2 and engine.load() == (0, 0)
    assert began[:2] == [0, 0] and began[2] < began[3]
    alone = packed_ss.Engine(random_model)
    assert [g.results[0].tokens for g in groups] == [alone.generate(p, n, eos_token_id=[], **s).tokens
                                                     for p, n, s in arrivals]


def test_a_request_waiting_for_a_slot_another_callers_stream_holds_gets_it(random_model):
    """A sampled stream paused after its first tokens holds the one slot; a greedy `generate` of another caller
    runs the stream's batch to its end, then its own request, and neither changes what the other gets."""
    engine = packed_ss.Engine(random_model, max_batch=1)
    sampled = dict(prompt_ids=[5, 6, 7, 5, 6], max_new_tokens=20, eos_token_id=[], temperature=1.0, seed=9)
    stream = engine.stream(**sampled)
    first, got = next(stream), {}
    caller = threading.Thread(target=lambda: got.update(greedy=engine.generate([1, 2, 3], 16, eos_token_id=[]).tokens),
                              daemon=True)
    caller.start()
    caller.join(120)
    assert not caller.is_alive(), "generate still waits for the slot the paused stream holds"
    greedy, rest = got["greedy"], [t for tokens in stream for t in tokens]
    alone = packed_ss.Engine(random_model)
    assert first + rest == alone.generate(**sampled).tokens
    assert greedy == alone.generate([1, 2, 3], 16, eos_token_id=[]).tokens


def test_greedy_default_equals_ar_on_float64(random_model):
    prompts = [[5, 6, 7, 5, 6, 7, 5], [1, 2, 3], list(range(30, 60))]
    ar = packed_ss.Engine(random_model, schedule="ar").generate_batch(prompts, 40, eos_token_id=[])
    got = packed_ss.Engine(random_model).generate_batch(prompts, 40, eos_token_id=[])
    assert [r.tokens for r in got] == [r.tokens for r in ar]


# -- the policy on states built by hand -------------------------------------------------------------------------
def state(policy: Policy, batch: int = 1, out=(), prompt=(0,), temperature: float = 0.0):
    program_width = policy.width
    from packed_ss.decode.state import DecodeState
    one = DecodeState.new(program_width, 1, 64, [], 0, "cpu", prompt_len=len(prompt))
    one = policy.new_state(one)
    st = type(one).cat([one] * batch)
    st.out[:, :len(out)] = torch.tensor(out, dtype=torch.int64)
    st.n_out.fill_(len(out))
    st.sampling.temperature.fill_(temperature)
    return st


def test_a_probe_is_scored_against_the_emitted_tokens():
    """A probe made after a 3-token match settles at its first miss: its order's row of look_hit learns, and
    row 0 (any order); the other orders' rows stay, and the next probe keeps the order of its own match."""
    policy = Policy.from_profile(shapes_for(4, "lookup"), None)
    st = state(policy, out=[5, 6])
    st.probe[0] = torch.tensor([5, 6, 9, 9])
    st.probe_len.fill_(3)
    st.probe_order.fill_(3)
    prior = st.look_hit.clone()
    new = torch.tensor([[1, 2, 3, 4]])
    policy.score_lookup(st, new, torch.tensor([2]), torch.tensor([1]))
    assert torch.equal(st.look_hit, prior) and st.probe_at.item() == 0     # two of three compared, both right
    st.out[0, 2] = 7
    st.n_out.fill_(3)
    policy.score_lookup(st, new, torch.tensor([2]), torch.tensor([1]))
    hit = torch.tensor([1.0, 1.0, 0.0, 0.0])
    want = prior.clone()
    for row in (0, 3):                                                       # past the probe: not observed
        want[0, row, :3] = prior[0, row, :3] + RATE * (hit[:3] - prior[0, row, :3])
    assert torch.allclose(st.look_hit, want)
    assert st.probe[0].tolist() == [1, 2, 3, 4] and st.probe_len.item() == 2 and st.probe_at.item() == 3
    assert st.probe_order.item() == 1


def test_no_draft_found_probes_nothing():
    policy = Policy.from_profile(shapes_for(4, "lookup"), None)
    st = state(policy, out=[5])
    prior, orders = st.look_hit.clone(), st.look_order.clone()
    policy.score_lookup(st, torch.tensor([[1, 2, 3, 4]]), torch.tensor([4]), torch.tensor([0]))
    assert torch.equal(st.look_hit, prior) and st.probe_len.item() == 0 and st.probe_at.item() == 1
    assert st.look_order[0, 0] == RATE and torch.allclose(st.look_order[0, 1:], (1 - RATE) * orders[0, 1:])


@pytest.mark.parametrize("hit,batch,want", [
    (0.95, 1, Shape(16)),     # lookup drafts right deep down: the widest lookup call pays
    (0.05, 1, Shape(0)),          # rarely right: AR
    (0.9, 1, Shape(16)),
    (0.9, 8, Shape(3)),       # the same bet at batch 8, where wide calls cost more: a narrow one
])
def test_the_choice_weighs_expected_tokens_against_cost(hit, batch, want):
    shapes = shapes_for(16, "both")
    # ms per iteration at batch 1 and 8: rows cost little alone, much in a batch of eight
    costs = [(1.0 + 0.05 * s.rows, 8.0 + 2.0 * s.rows) for s in shapes]
    policy = Policy.from_profile(shapes, None).measured(costs)
    st = state(policy, batch)
    st.look_hit.copy_(hit ** torch.arange(1, 17.0))      # draft token k right with probability hit^(k+1)
    st.diffusion.fill_(1.0)
    policy.choose(st, torch.full((batch,), 16), torch.full((batch,), 4))           # drafts after 4-token matches
    call = policy.next_call(list(zip(st.choice.tolist(), st.quiet.tolist())), lag=0)
    chosen = "quiet" if call == QUIET else shapes[call]
    assert chosen == ("quiet" if want == Shape(0) else want) and (st.choice == st.choice[0]).all()   # AR: it dozes


@pytest.mark.parametrize("batch,drafted,queued,want", [
    (1, 1, False, Shape(3)),    # alone, a gained token is a token
    (8, 8, False, Shape(3)),    # a batch that gains alike: the same bet
    (8, 7, False, Shape(0)),    # one request with no draft: the calls end with it, the others' gains save rows only
    (8, 7, True, Shape(3)),     # ... unless requests wait: a request that ends sooner lets one in sooner
])
def test_a_batch_values_gained_tokens_by_the_calls_they_save(batch, drafted, queued, want):
    """Free choice at a batch size: a shape pays when the batch's calls get fewer or cheaper. Costs shaped like
    SmolLM2's on the CPU (a call 50 ms alone, 100 at batch 8, 10 ms a row more there): lookup drafts right 40% of
    the time per position pay alone and in a batch that has them all, not when one request has none, unless
    requests wait for a slot."""
    shapes = shapes_for(3, "lookup")
    policy = Policy.from_profile(shapes, None).measured([(50 + 1.5 * (s.rows - 1), 100 + 10 * (s.rows - 1))
                                                        for s in shapes])
    st = state(policy, batch)
    st.queued.fill_(queued)
    st.look_hit.copy_(0.4 ** torch.arange(1, 4.0))
    found = torch.arange(batch) < drafted
    policy.choose(st, torch.where(found, 3, 0), torch.where(found, 4, 0))
    assert st.choice.tolist() == [shapes.index(want)] * batch


def test_the_choice_reads_how_often_drafts_of_the_matchs_order_are_right():
    """Two sampled requests with the same statistics, one holding a draft after a 4-token match (whose drafts were
    right 90% of the time), the other after a 1-token match (5%): the first verifies its draft at the full width,
    the second decodes by AR."""
    shapes = shapes_for(8, "lookup")
    policy = Policy.from_profile(shapes, None).measured([(1.0 + 0.1 * s.rows, 8.0 + 0.1 * s.rows) for s in shapes],
                                                        True)
    st = state(policy, 2, temperature=1.0)
    st.look_hit[:, 4] = 0.9
    st.look_hit[:, 1] = 0.05
    policy.choose(st, torch.full((2,), 8), torch.tensor([4, 1]))
    assert [shapes[i] for i in st.choice.tolist()] == [Shape(8), Shape(0)]


def test_the_greedy_rows_of_a_sampled_batch_choose_freely_and_the_sampled_ones_alone():
    """A per-request policy (the rejection sampler's program) over a greedy and a sampled request with the same
    lookup draft and statistics: the sampled one prices its bet as the one request of a full batch that speculates
    and stays on AR, the greedy one, whose tokens do not depend on the shapes, makes the free choice at the batch's
    cost and verifies its draft. Its choice leaves the sampled request's as it is alone."""
    shapes = shapes_for(4, "lookup")
    policy = Policy.from_profile(shapes, None).measured([(1.0 + 0.1 * s.rows, 8.0 + 2.0 * s.rows) for s in shapes],
                                                        True)
    st = state(policy, 2, temperature=0.7)
    st.look_hit[:, 4] = 0.9
    st.sampling.temperature[0] = 0.0
    length, order = torch.full((2,), 4), torch.full((2,), 4)
    policy.choose(st, length, order)
    assert [shapes[i] for i in st.choice.tolist()] == [Shape(4), Shape(0)]
    alone = state(policy, 1, temperature=0.7)
    alone.look_hit[:, 4] = 0.9
    policy.choose(alone, length[:1], order[:1])
    assert alone.choice.item() == st.choice[1].item()


def test_a_request_no_draft_pays_for_goes_quiet_for_doubling_runs():
    """Sampled requests, each choosing alone. Lookup drafts never right and diffusion drafts earning one token: the
    request goes quiet (passive, the call the awake one's), stays so for its quiet run of calls unchanged, and its
    next quiet run is twice as long; one whose drafts pay stays awake, and one without a draft this call, whose
    drafts would pay, dozes for DOZE calls."""
    shapes = shapes_for(4, "both")
    policy = Policy.from_profile(shapes, None).measured([(1.0 + 0.1 * s.rows, 8.0 + 0.1 * s.rows) for s in shapes],
                                                         True)
    st = state(policy, 3, temperature=1.0)
    st.look_hit[0].zero_()
    st.diffusion[0].fill_(1.0)
    st.look_hit[1:].fill_(0.95)
    st.diffusion[2].fill_(1.0)
    length, order = torch.full((3,), 4), torch.tensor([4, 4, 0])
    policy.choose(st, length, order)
    assert st.quiet.tolist() == [QUIET_RUNS[0], 0, DOZE]
    assert st.quiet_run.tolist() == [2 * QUIET_RUNS[0], QUIET_RUNS[0], QUIET_RUNS[0]]
    assert shapes[policy.next_call(list(zip(st.choice.tolist(), st.quiet.tolist())), lag=0)] == Shape(4)
    hit = st.look_hit.clone()
    st.done[1:] = True                                                      # alone now
    for left in range(QUIET_RUNS[0] - 1, -1, -1):
        assert policy.next_call([(st.choice[0].item(), st.quiet[0].item())], lag=0) == QUIET
        passive = st.passive
        st.nfe += 1                                                         # a call
        policy.choose(st, length, order, passive)
        assert st.quiet[0].item() == left and torch.equal(st.look_hit, hit)
    assert policy.next_call([(st.choice[0].item(), st.quiet[0].item())], lag=0) == 0
    policy.choose(st, length, order, st.passive)                            # awake, still hopeless: twice as long
    assert st.quiet[0].item() == 2 * QUIET_RUNS[0] and shapes[st.choice[0].item()] == Shape(0)


def test_the_next_call_counts_the_calls_already_issued_and_covers_the_choices():
    """On the host: QUIET only while every live request stays quiet past the `lag` calls already issued, and one
    admitted after the table (None) keeps the call awake; else the fewest-rows shape covering every choice."""
    shapes = shapes_for(8, "both")
    policy = Policy.from_profile(shapes, None)
    index = shapes.index
    assert policy.next_call([(0, 2), (0, 1)], lag=0) == QUIET
    assert policy.next_call([(0, 2), (0, 1)], lag=1) == 0
    assert policy.next_call([(0, 2), None], lag=0) == 0
    assert policy.next_call([(index(Shape(8)), 0), (index(Shape(3, 3)), 0), (0, 5)], lag=0) == index(Shape(8, 3))
    assert policy.next_call([], lag=0) == 0


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("policy", [Dozing, Policy], ids=["dozing", "default"])
def test_quiet_requests_keep_greedy_and_rejection_output(random_model, shapes_run, epilogue, policy):
    """Requests dozing at their own phases (forced, or by the default policy's own statistics): greedy output
    equals AR's, and under the rejection sampler batched equals alone, with quiet requests sitting in other
    shapes' calls and lean QUIET calls run."""
    if epilogue == "native" and not native_available("cpu"):
        pytest.skip("the native epilogue is not built")
    prompts = [[3, 17, 42, 8, 9], list(range(1, 20)), [9, 9, 9, 9, 9, 9], [60, 3], [5, 6, 5, 6, 5]]
    lengths = [30, 24, 18, 30, 12]
    ar = packed_ss.Engine(random_model, schedule="ar").generate_batch(prompts, lengths, eos_token_id=[])
    engine = cycling(packed_ss.Engine(random_model, width=4, epilogue=epilogue), policy)
    greedy = engine.generate_batch(prompts, lengths, eos_token_id=[], batch_size=3)
    assert [r.tokens for r in greedy] == [r.tokens for r in ar]
    setting = dict(temperature=1.2, top_p=0.9)
    alone = [engine.generate(p, n, eos_token_id=[], seed=7 + i, **setting).tokens
             for i, (p, n) in enumerate(zip(prompts, lengths))]
    shapes_run.clear()
    batched = engine.generate_batch(prompts, lengths, eos_token_id=[], seed=7, batch_size=3, **setting)
    assert [r.tokens for r in batched] == alone
    assert QUIET in shapes_run and len(set(shapes_run)) >= (3 if policy is Dozing else 2)


def test_diffusion_estimates_drift_back_to_their_prior():
    """A request that left the packed shapes keeps an estimate that returns to the prior (the profile's tokens per
    call with three mask rows): it tries them again."""
    policy = Policy.from_profile(shapes_for(4, "both"), {"lagged": [1.0, 1.5, 1.8, 2.0], "width": 4})
    st = state(policy)
    packed = policy.packed[-1]
    for _ in range(3):
        st.ran.fill_(packed)
        policy.observe(st, torch.tensor([packed]), torch.tensor([1]), torch.tensor([False]))     # one token per packed call
    low = st.diffusion[0, -1].item()
    assert low < 1.8
    for _ in range(200):
        policy.observe(st, torch.tensor([0]), torch.tensor([1]), torch.tensor([False]))           # AR runs
    assert low < st.diffusion[0, -1].item() == pytest.approx(1.8, abs=1e-3)


def test_the_state_carries_the_choice_through_the_status_table(shipped):
    model, prompts = shipped
    engine = packed_ss.Engine(model, width=4)
    program = engine.program(SamplingParams())
    st = program.new_state(Request(prompts[0], 8, 0, [], []))
    assert st.choice.shape == (1,) and st.look_hit.shape == (1, 5, 4)   # orders 0 .. 4, 4 positions


@pytest.mark.parametrize("kwargs,message", [
    (dict(schedule="adaptive", drafts="ngram"), "drafts must be one of"),
    (dict(schedule="adaptive", width=0), "width must be an integer"),
])
def test_bad_options(shipped, kwargs, message):
    with pytest.raises(ValueError, match=message):
        packed_ss.Engine(shipped[0], **kwargs)


def test_the_drafters_profile_names_the_default_sampler(shipped, monkeypatch):
    """A sampler the drafter's profile names (measured on its model) is the engine's default; an explicit one wins;
    a name that is no sampler is refused."""
    model = shipped[0]
    assert packed_ss.Engine(model).sampler == "rejection"
    monkeypatch.setattr(model, "draft_profile", dict(model.draft_profile or {}, sampler="gumbel"))
    assert packed_ss.Engine(model).sampler == "gumbel"
    assert packed_ss.Engine(model, sampler="rejection").sampler == "rejection"
    monkeypatch.setattr(model, "draft_profile", dict(model.draft_profile, sampler="race"))
    with pytest.raises(ValueError, match="sampler must be one of"):
        packed_ss.Engine(model)


# -- the rejection sampler: each request chooses alone, the call covers the choices -----------------------------
@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("setting", [dict(temperature=1.0), dict(temperature=0.8, top_k=10),
                                     dict(temperature=1.2, top_p=0.9)], ids=["T1", "T0.8,k10", "T1.2,p0.9"])
def test_rejection_sampled_batched_equals_alone(random_model, shapes_run, setting, epilogue):
    """Requests admitted at different times switch shapes at different iterations (the shape after a request's
    n-th call is n mod S): each sits in calls covering the others' shapes, and returns its tokens alone."""
    if epilogue == "native" and not native_available("cpu"):
        pytest.skip("the native epilogue is not built")
    prompts = [[3, 17, 42, 8, 9], list(range(1, 20)), [9, 9, 9, 9, 9, 9], [60, 3], [5, 6, 5, 6, 5]]
    lengths = [30, 24, 18, 30, 12]
    engine = cycling(packed_ss.Engine(random_model, width=4, epilogue=epilogue))
    assert engine.sampler == "rejection" and engine.program(SamplingParams(**setting)).policy.per_request
    alone = [engine.generate(p, n, eos_token_id=[], seed=7 + i, **setting).tokens
             for i, (p, n) in enumerate(zip(prompts, lengths))]
    shapes_run.clear()
    batched = engine.generate_batch(prompts, lengths, eos_token_id=[], seed=7, batch_size=3, **setting)
    assert [r.tokens for r in batched] == alone
    assert len(set(shapes_run)) > 1



class Abstaining(Policy):
    """Never speculates: every request chooses AR, and after its calls 3, 6, 9, .. stays quiet through two more, so
    calls alternate between the AR shape (an empty draft verified) and the lean QUIET step."""

    def choose(self, st, length, order, passive=None):
        choosing = ~st.done if passive is None else ~st.done & ~passive
        st.assign(choosing, choice=torch.zeros_like(st.choice))
        st.assign(choosing & (st.nfe % 3 == 0), quiet_until=st.nfe + 2)


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("setting", [dict(temperature=1.0), dict(temperature=0.8, top_k=10),
                                     dict(temperature=1.2, top_p=0.9)], ids=["T1", "T0.8,k10", "T1.2,p0.9"])
def test_a_request_that_does_not_speculate_returns_its_ar_sample(random_model, shapes_run, setting, epilogue):
    """Under the rejection sampler, an empty draft's verification is an AR step (its token drawn with u_0 from the
    row's truncated distribution, as schedule="ar" draws it), so a request the policy keeps on AR returns AR's
    sample for its seed, alone and batched, in the AR shape and in the lean QUIET step."""
    if epilogue == "native" and not native_available("cpu"):
        pytest.skip("the native epilogue is not built")
    prompts = [[3, 17, 42, 8, 9], list(range(1, 20)), [9, 9, 9, 9, 9, 9], [60, 3], [5, 6, 5, 6, 5]]
    lengths = [30, 24, 18, 30, 12]
    ar = packed_ss.Engine(random_model, schedule="ar", epilogue=epilogue)
    want = [ar.generate(p, n, eos_token_id=[], seed=7 + i, **setting).tokens
            for i, (p, n) in enumerate(zip(prompts, lengths))]
    engine = cycling(packed_ss.Engine(random_model, width=4, epilogue=epilogue), Abstaining)
    assert engine.sampler == "rejection"
    alone = [engine.generate(p, n, eos_token_id=[], seed=7 + i, **setting).tokens
             for i, (p, n) in enumerate(zip(prompts, lengths))]
    shapes_run.clear()
    batched = engine.generate_batch(prompts, lengths, eos_token_id=[], seed=7, batch_size=3, **setting)
    assert alone == want == [r.tokens for r in batched]
    assert set(shapes_run) == {0, QUIET}

# -- the law: sampled sequences follow the AR distribution with the shapes switching (tests/sampling_law.py) -------
@pytest.fixture
def switching(monkeypatch):
    """Every engine built in the test runs the adaptive schedule with the Cycling policy."""
    monkeypatch.setattr(packed_ss.engine, "Policy", Cycling)


LAW_CASES = [(T1, False), (TOP_K, False), (TOP_P, False), (T1, True), (TOP_K, True)]


@pytest.mark.parametrize("params,batched", LAW_CASES, ids=[f"{case_id('adaptive', 2, p)}-{'batched' if b else 'alone'}"
                                                           for p, b in LAW_CASES])
def test_sequences_follow_ar_distribution(switching, params, batched):
    path = ar_checkpoint()
    draws = (draw_batched if batched else draw)(path, "adaptive", 2, params)
    assert follows(draws, ar_law(path, params, length_for(2))) > ALPHA


def test_a_broken_bonus_is_flagged(switching, monkeypatch):
    monkeypatch.setattr(torch_epilogue, "verify_sampled", bonus_from_residual)
    path = ar_checkpoint()
    p_value = g_test_pvalue(draw(path, "adaptive", 2, T1, epilogue="torch").samples, ar_law(path, T1, length_for(2)))
    assert p_value < POWER, p_value


def test_a_request_that_joins_a_quiet_batch_decodes_as_alone(monkeypatch):
    """A sampled request joins a batch whose one other request is quiet (the host chose the lean AR step) and the
    batch grows for it, so no status table is read before the next call: the newcomer must not ride the lean step
    (which takes every request for quiet) but verify as alone. Found by CI on a busy machine, whose measured costs
    made a lookup shape cheap; here the costs are fixed, so the choices do not depend on this machine's timings."""
    from packed_ss.runtime.loop import Runtime
    from test_kv_pool import random_tree_prompts

    table = [(2.07, 3.61), (1.55, 3.88), (1.35, 10.08)]       # ms at batch 1 and 8: ar, lookup W=3, packed W=3/3
    monkeypatch.setattr(Runtime, "shape_costs", lambda self, program, *args, **kwargs:
                        (table + table[-1:] * len(program.policy.shapes))[:len(program.policy.shapes)])
    model = packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float64)
    prompts = random_tree_prompts(random.Random(7), 152)
    partner, newcomer = prompts[7], prompts[151]
    engine = packed_ss.Engine(model, width="auto", page_size=16)

    def request(prompt, seed):
        return engine.request(prompt, 10, temperature=1.0, seed=seed, eos_token_id=[])
    alone = engine.generate(newcomer, 10, temperature=1.0, seed=151, eos_token_id=[]).tokens
    first = engine.add(request(partner, 7), stream=False)
    engine.step()
    second = engine.add(request(newcomer, 151), stream=False)
    while not (first.done and second.done):
        engine.step()
    assert second.results[0].tokens == alone


@pytest.mark.skipif(not native_available("cpu"), reason="the native epilogue is not built")
@pytest.mark.parametrize("per_request", [False, True], ids=["free", "per-request"])
@pytest.mark.parametrize("drafts", ["lookup", "diffusion", "both"])
def test_the_native_choice_is_the_torch_one(drafts, per_request):
    """csrc/policy.h against Policy.choose on random statistics, drafts, settings and quiet rows, at batch sizes 1
    to 33 (both sides of COST_BATCH), requests waiting and not: the same choices, quiet periods and runs."""
    gen = torch.Generator().manual_seed(len(drafts) + per_request)
    shapes = shapes_for(16, drafts)
    native = NativeEpilogue("cpu", 16, per_request)
    seen = set()
    for trial in range(24):
        costs = sorted((1 + 4 * torch.rand(len(shapes), generator=gen)).tolist())
        policy = Policy.from_profile(shapes, None).measured([(c, c * (2 + 4 * torch.rand((), generator=gen).item()))
                                                              for c in costs], per_request)
        batch = [1, 2, 5, 8, 9, 33][trial % 6]
        st = state(policy, batch)
        st.look_hit.copy_(torch.rand(st.look_hit.shape, generator=gen))
        st.look_order.copy_(torch.rand(st.look_order.shape, generator=gen))
        st.diffusion.copy_(1 + 3 * torch.rand(st.diffusion.shape, generator=gen))
        st.sampling.temperature.copy_((torch.rand(batch, generator=gen) < 0.5).float())
        st.done.copy_(torch.rand(batch, generator=gen) < 0.2)
        st.queued.fill_(trial % 4 == 1)
        st.nfe.copy_(torch.randint(0, 50, (batch,), generator=gen))
        st.quiet_run.copy_(torch.tensor(QUIET_RUNS)[torch.randint(0, 2, (batch,), generator=gen)])
        st.choice.copy_(torch.randint(0, len(shapes), (batch,), generator=gen))
        passive = torch.rand(batch, generator=gen) < 0.2
        length = torch.randint(0, 17, (batch,), generator=gen)
        order = torch.randint(0, 5, (batch,), generator=gen)
        want = type(st).cat([st])
        policy.choose(want, length, order, passive)
        native.choose(policy, st, length, order, passive)
        for name in ("choice", "quiet_until", "quiet_run"):
            assert torch.equal(getattr(st, name), getattr(want, name)), (trial, name)
        seen |= set(want.choice.tolist())
    assert len(seen) > 1                              # the cases choose more than one shape


@pytest.mark.skipif(not native_available("cpu"), reason="the native epilogue is not built")
@pytest.mark.parametrize("flags", [True, False], ids=["adaptive-state", "fixed-state"])
@pytest.mark.parametrize("point_mass", [False, True])
def test_the_native_take_lookup_is_the_torch_one(point_mass, flags):
    """csrc/lookup.h against Epilogue.take_lookup on random rows, lookup drafts found or not, preferred or not,
    proposals kept or not, quiet and finished requests, at batch sizes 1 to 33: the same drafts, lengths, lookup
    flags and stored Q, bit for bit; requests take lookup drafts, keep their proposals and drop them. A fixed
    schedule's state has no lookup flags (Schedule.redraft): the rest is the same."""
    from packed_ss.decode.state import DecodeState
    gen = torch.Generator().manual_seed(int(point_mass))
    width, support = 8, 40
    policy = Policy.from_profile(shapes_for(width, "both"), None)
    took = kept = dropped = 0
    for trial in range(12):
        batch = [1, 2, 5, 8, 9, 33][trial % 6]
        one = DecodeState.new(width, support, 16, [], 0, "cpu", q_dtype=torch.float32)
        one = policy.new_state(one) if flags else one
        st = type(one).cat([one] * batch)
        st.draft.copy_(torch.randint(0, support, st.draft.shape, generator=gen))
        st.draft_len.copy_(torch.randint(0, width + 1, (batch,), generator=gen))
        st.q_prob.copy_(torch.rand(st.q_prob.shape, generator=gen))
        if flags:
            st.lookup_draft.copy_(torch.rand(batch, generator=gen) < 0.5)
        st.done.copy_(torch.rand(batch, generator=gen) < 0.2)
        draft = torch.randint(-1, support, (batch, width), generator=gen)
        length = torch.randint(1, width + 1, (batch,), generator=gen)
        order = torch.randint(0, 5, (batch,), generator=gen)
        preferred, keep, passive = (torch.rand(batch, generator=gen) < p for p in (0.5, 0.5, 0.2))
        want = type(st).cat([st])
        torch_epilogue.TorchEpilogue("cpu", width, True).take_lookup(want, draft, length, order, preferred, keep,
                                                                      passive, point_mass)
        NativeEpilogue("cpu", width, True).take_lookup(st, draft, length, order, preferred, keep, passive, point_mass)
        for name in ("draft", "draft_len", "q_prob", "done") + (("lookup_draft",) if flags else ()):
            assert torch.equal(getattr(st, name), getattr(want, name)), (trial, name)
        live, lookup = ~want.done, (order > 0) & (preferred | ~keep) & ~passive
        if flags:
            assert torch.equal(want.lookup_draft[live], lookup[live]), trial
        took += int((live & lookup).sum())
        kept += int((live & ~lookup & keep & ~passive).sum())
        dropped += int((live & ~lookup & (~keep | passive)).sum())
    assert took and kept and dropped


@pytest.mark.skipif(not native_available("cpu"), reason="the native epilogue is not built")
@pytest.mark.parametrize("drafts", ["lookup", "both"])
def test_the_native_statistics_are_the_torch_ones(drafts):
    """csrc/policy.h against Policy.prefers_lookup, Policy.observe and Policy.score_lookup on random statistics,
    probes partly emitted, new drafts, shapes run and quiet or finished rows, at batch sizes 1 to 33: the same
    preferences, look_hit, look_order, probes and diffusion estimates, bit for bit."""
    gen = torch.Generator().manual_seed(len(drafts))
    shapes = shapes_for(16, drafts)
    native = NativeEpilogue("cpu", 16, False)
    policy = Policy.from_profile(shapes, None)
    settled = scored = steady = 0
    prefers = collections.Counter()
    for trial in range(24):
        batch = [1, 2, 5, 8, 9, 33][trial % 6]
        st = state(policy, batch)
        w, orders = policy.width, st.look_hit.shape[1]
        st.look_hit.copy_(torch.rand(st.look_hit.shape, generator=gen))
        st.look_order.copy_(torch.rand(st.look_order.shape, generator=gen))
        st.diffusion.copy_(1 + 3 * torch.rand(st.diffusion.shape, generator=gen))
        st.probe.copy_(torch.randint(0, 3, st.probe.shape, generator=gen))
        st.probe_len.copy_(torch.randint(0, w + 1, (batch,), generator=gen))
        st.probe_order.copy_(torch.randint(0, orders, (batch,), generator=gen))
        st.n_out.copy_(torch.randint(0, 40, (batch,), generator=gen))
        st.probe_at.copy_((st.n_out * torch.rand(batch, generator=gen)).long())
        st.out.copy_(torch.randint(0, 3, st.out.shape, generator=gen))
        for b in range(batch):                     # the probe's first tokens emitted, up to a random miss
            right = int(torch.randint(0, w + 1, (), generator=gen))
            at = int(st.probe_at[b])
            st.out[b, at:at + right] = st.probe[b, :min(right, st.out.shape[1] - at)]
        st.ran.copy_(torch.randint(0, len(shapes), (batch,), generator=gen))
        st.done.copy_(torch.rand(batch, generator=gen) < 0.2)
        passive = torch.rand(batch, generator=gen) < 0.2
        draft = torch.randint(0, 3, (batch, w), generator=gen)
        length = torch.randint(0, w + 1, (batch,), generator=gen)
        order = torch.randint(0, orders, (batch,), generator=gen)
        ran = torch.where(torch.rand(batch, generator=gen) < 0.5, st.ran,
                          torch.randint(0, len(shapes), (batch,), generator=gen))
        emitted = torch.randint(1, w + 2, (batch,), generator=gen)
        verified_lookup = torch.rand(batch, generator=gen) < 0.3
        before, want = type(st).cat([st]), type(st).cat([st])
        preferred = policy.prefers_lookup(want, length, order)
        assert torch.equal(native.prefers_lookup(policy, st, length, order), preferred), trial
        prefers[True] += int(preferred.sum())
        prefers[False] += int((~preferred & (order > 0)).sum())
        policy.observe(want, ran, emitted, verified_lookup, passive)
        native.observe(policy, st, ran, emitted, verified_lookup, passive)
        policy.score_lookup(want, draft, length, order, passive)
        native.score_lookup(policy, st, draft, length, order, passive)
        for name in ("look_hit", "look_order", "probe", "probe_len", "probe_at", "probe_order", "diffusion", "ran"):
            assert torch.equal(getattr(st, name), getattr(want, name)), (trial, name)
        settled += int((want.probe_at != before.probe_at).sum())
        scored += int((want.look_hit != before.look_hit).any(-1).any(-1).sum())
        packed = torch.isin(ran, torch.tensor(policy.packed, dtype=torch.int64))
        steady += int((~st.done & ~passive & packed & (ran == before.ran) & ~verified_lookup).sum())
    assert settled and scored and (steady or drafts == "lookup")   # probes settle and score; estimates learn
    assert prefers[True] and (prefers[False] or drafts == "lookup")  # requests prefer lookup drafts, and not
