"""The compiled step epilogue (csrc/, packed_ss/decode/epilogue/native.py) against the torch reference.

1. Single steps: for many random states and logits (tests/epilogue_cases.py: ties, one-hot targets, zeros
   in p or Q, full acceptance, rejection at the first position, stop tokens and the length cap inside the
   accepted run, finished states) every schedule step leaves exactly the same DecodeState, bit for bit,
   whether its update runs in torch or in the CPU build; the cases are checked to reach those corners.
2. The emitted tokens' distribution: with drafts drawn from the stored Q, the token emitted at every
   position (accepted draft, correction, bonus) follows its target p (G-test), and the same test rejects Q
   and the residual as targets of the first token and of the bonus (power).
3. End to end: Engine(epilogue="native") gives the tokens of epilogue="torch" for every schedule,
   greedy and sampled, on a tiny random model.
4. Selection and errors: the default, the fallback when the module is missing, bad arguments.
(The CUDA-graph loop's host logic is tested in tests/test_runtime.py; tests/test_gpu.py replays real graphs.)
"""
import random
from types import SimpleNamespace

import pytest
import torch
from epilogue_cases import check_emitted_tokens_follow_p, clone, differences, make_case, sparse_rows
from tiny_models import checkpoint, config_eos, mid_output_token

import packed_ss
import packed_ss.decode.epilogue as epilogue_mod
import packed_ss.decode.epilogue.extension as extension
from packed_ss.decode.acceptance import verify_greedy, verify_sampled
from packed_ss.decode.epilogue import NativeEpilogue, Rows, TorchEpilogue, native_available, native_module
from packed_ss.decode.sampling import SamplingParams, philox_uniform, truncated_probs
from packed_ss.decode.registry import schedules
from packed_ss.decode.state import DecodeState
from packed_ss.runtime import Request

needs_native = pytest.mark.skipif(not native_available("cpu"),
                                   reason=epilogue_mod.native_unavailable_reason("cpu") or "")
PROMPT = [3, 17, 42, 8, 9]
N_CASES = 1500


# -- 1. single steps, bit for bit ---------------------------------------------------------------------------
def _acceptance(case) -> int | None:
    """A (= h + 1) of the reference verification for draft-verifying steps of active states, else None."""
    st = case.state
    if case.step == "prefill" or case.schedule == "ar" or (case.schedule, case.step) == ("linear", 0) or st.done:
        return None
    b = case.width + 1
    if case.params.greedy:
        return int(verify_greedy(st.draft, st.draft_len, case.logits[None, :b].argmax(-1))[1])
    u = philox_uniform(st.seed, st.offset, 2 * b + 1)
    p = truncated_probs(case.logits[None, :b], st.sampling)
    return int(verify_sampled(st.draft, st.draft_len, st.q_idx, st.q_prob, p, u)[1])


@needs_native
def test_random_steps_match_reference_bit_for_bit():
    seen = dict(full=0, reject_first=0, partial=0, stop_inside=0, cap_inside=0, done=0, untruncated=0,
                truncated=0, greedy=0, prefill=0)
    for seed in range(N_CASES):
        case = make_case(seed)
        ref, got = case.run(native=False), case.run(native=True)
        diff = differences(ref, got, case.dense)
        assert not diff, (f"seed {seed}: {case.schedule} step {case.step} W={case.width} V={case.vocab} "
                          f"{case.params} {case.logits.dtype}: fields {diff} differ")
        # which corners this case reached
        st, a_total = case.state, None
        seen["done"] += bool(st.done)
        seen["prefill"] += case.step == "prefill"
        seen["greedy" if case.params.greedy else ("truncated" if case.truncated else "untruncated")] += 1
        a_total = _acceptance(case)
        if a_total is None:
            continue
        draft_len, a = int(st.draft_len), int(ref.n_out - st.n_out)
        seen["full"] += draft_len >= 1 and a_total == draft_len + 1
        seen["reject_first"] += draft_len >= 1 and a_total == 1
        seen["partial"] += 1 < a_total <= draft_len
        if bool(ref.done) and a < a_total:
            stopped = int(ref.last) in st.stop_ids[0].tolist()
            seen["stop_inside" if stopped else "cap_inside"] += 1
    assert min(seen.values()) >= 20, seen


@needs_native
def test_large_vocabulary_steps_match_reference():
    """Vocabulary-sized scans (the dense residual, untruncated proposals) in float32 and float64."""
    for seed in range(40):
        case = make_case(10_000 + seed, vocabs=(5000, 32768), max_width=4)
        diff = differences(case.run(native=False), case.run(native=True), case.dense)
        assert not diff, (seed, case.schedule, case.step, case.params, diff)


@needs_native
def test_fewer_verifier_rows_match_reference_bit_for_bit():
    """A draft verifies within the rows given, R <= W + 1 of them (the adaptive schedule passes each call's own
    width; a draft longer than R - 1 is cut): both epilogues leave the same state, and a cut draft accepts at
    most R - 1 tokens. The drafts are long enough to be cut in most cases. Half the top-k cases pass the rows
    in the sparse layout, built by hand (the top_k tokens sorted by decreasing probability: what the native
    epilogue still accepts), against the stored dense Q."""
    seen = dict(cut=0, one_row=0, accepted=0, sparse=0)
    for seed in range(400):
        case = make_case(20_000 + seed)
        if case.logits.shape[0] < case.width + 1:
            continue
        rows = random.Random(seed).randint(1, case.width + 1)
        sparse = case.params.top_k is not None and seed % 2 == 1
        after = []
        for kind in ("torch", "native"):
            ep = epilogue_mod.make_epilogue(kind, "cpu", case.width, not case.params.greedy)
            st = clone(case.state)
            given = ep.rows(case.logits[None], st.sampling)
            if sparse:
                given = Rows(None, *sparse_rows(given.prob, case.params.top_k), vocab=given.vocab)
            ep.step(st, verify=given[:rows])
            after.append(st)
        diff = differences(*after, case.dense)
        assert not diff, (f"seed {seed}: R={rows} W={case.width} {case.params}: fields {diff} differ")
        emitted = int(after[0].n_out - case.state.n_out)
        assert emitted <= rows or bool(case.state.done), (seed, rows, emitted)
        seen["cut"] += int(case.state.draft_len) > rows - 1
        seen["one_row"] += rows == 1
        seen["sparse"] += sparse
        seen["accepted"] += emitted > 1
    assert min(seen.values()) >= 20, seen


@needs_native
def test_philox_matches_reference():
    mod = native_module()
    for seed, offset in [(0, 0), (1, 2**32 - 1), (2**63 - 1, 2**40 + 3), (123456789, 2**62 + 17)]:
        ref = philox_uniform(torch.tensor(seed), torch.tensor(offset), 23).tolist()
        assert [mod.philox_uniform(seed, offset, i) for i in range(23)] == ref


# -- 2. every emitted token follows p ------------------------------------------------------------------------
@needs_native
@pytest.mark.parametrize("params,sparse", [(SamplingParams(1.0), False), (SamplingParams(0.8, top_k=4), False),
                                           (SamplingParams(0.8, top_k=4), True)],
                         ids=["dense", "top-k", "top-k-sparse"])
def test_every_emitted_position_follows_p(params, sparse):
    check_emitted_tokens_follow_p("cpu", params, sparse)


# -- 3. end to end ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


SAMPLING = [dict(), dict(temperature=1.0, seed=5), dict(temperature=0.8, top_k=10, seed=3),
            dict(temperature=1.3, top_p=0.8, seed=2)]


@needs_native
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "T1", "top-k", "top-p"])
def test_engine_native_matches_torch(model, monkeypatch, schedule, sampling):
    def both(**kwargs):
        ref = packed_ss.Engine(model, schedule=schedule, width=4, epilogue="torch").generate(PROMPT, 40, **kwargs)
        got = packed_ss.Engine(model, schedule=schedule, width=4, epilogue="native").generate(PROMPT, 40, **kwargs)
        assert got.tokens == ref.tokens
        assert (got.nfe, got.n_verify, got.n_accepted, got.n_bonus) == (ref.nfe, ref.n_verify, ref.n_accepted,
                                                                        ref.n_bonus)
        return ref.tokens
    free = both(eos_token_id=[], **sampling)                 # no stop token
    eos = mid_output_token(free)
    config_eos(monkeypatch, model, eos)
    assert both(**sampling) == free[: free.index(eos) + 1]   # the config's EOS, reached mid-output


@needs_native
@pytest.mark.parametrize("schedule,order", [("packed", "ltr"), ("packed", "confidence"), ("linear", "ltr"),
                                            ("linear", "confidence"), ("quadratic", "ltr"), ("quadratic", "confidence")])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "T1", "top-k", "top-p"])
def test_any_order_native_matches_torch(schedule, order, sampling):
    """Any-order verification (ranks in the order pi_t, the residual drawn at u_t) in the compiled epilogue."""
    if sampling and order != "ltr":
        pytest.skip("the confidence order is greedy only")
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float32)
    kwargs = dict(max_new_tokens=40, eos_token_id=[], stop_sequences=[[20, 21]], **sampling)
    ref = packed_ss.Engine(model, schedule, width=4, order=order, epilogue="torch").generate(PROMPT, **kwargs)
    got = packed_ss.Engine(model, schedule, width=4, order=order, epilogue="native").generate(PROMPT, **kwargs)
    assert got.tokens == ref.tokens and got.iterations == ref.iterations
    assert (got.nfe, got.n_verify, got.n_accepted) == (ref.nfe, ref.n_verify, ref.n_accepted)


# -- 4. selection and errors -------------------------------------------------------------------------------
@needs_native
def test_default_is_native_compiled_or_not(model):
    assert packed_ss.Engine(model).epilogue == "native"
    assert packed_ss.Engine(model, compile="aot_eager").epilogue == "native"   # called as a torch operator
    assert packed_ss.Engine(model, epilogue="torch").epilogue == "torch"


def test_missing_module_degrades_to_torch_with_a_message(model, monkeypatch):
    monkeypatch.setattr(extension, "_loaded", True)
    monkeypatch.setattr(extension, "_module", None)
    monkeypatch.setattr(extension, "_error", "simulated: no such module")
    with pytest.warns(RuntimeWarning, match="using the torch epilogue: .*simulated"):
        engine = packed_ss.Engine(model)
    assert engine.epilogue == "torch"
    assert engine.generate(PROMPT, max_new_tokens=5, eos_token_id=[]).tokens
    with pytest.raises(RuntimeError, match="native epilogue is not available.*pip install"):
        packed_ss.Engine(model, epilogue="native")


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(epilogue="cuda"), ValueError, "epilogue must be one of"),
    (dict(cuda_graph=True), ValueError, "cuda_graph=True needs a model on a CUDA device"),
])
def test_bad_epilogue_arguments(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        packed_ss.Engine(model, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available() or native_module() is None or not native_module().HAS_CUDA,
                    reason="needs the CUDA build and no GPU")
def test_cuda_path_without_gpu_raises_a_clear_error():
    mod = native_module()
    assert not native_available("cuda")
    with pytest.raises(RuntimeError, match="no usable CUDA device"):
        NativeEpilogue("cuda", 3, False)
    state = mod.State(*([0] * 17), 3, 1, 0, 1, 16, 8)   # width, support, stops, batch, output length, Q bytes
    with pytest.raises(RuntimeError, match="no usable CUDA device"):
        mod.step_cuda(state, 32, mod.PHASE_BOTH, mod.VERIFY_DRAFT, mod.RETAIN_NONE, False, False, 4, 10,
                      1, 0, 0, 4, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0)


def test_stored_q_takes_the_probabilities_dtype():
    """A float32 model's drafts keep their Q in float32 (exactly the probabilities they were drawn from, half
    the bytes of float64); the native epilogue refuses a state whose Q dtype is not the rows'."""
    model = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32,
                            cfg=SimpleNamespace(mask_token_id=0, vocab_size=11))
    params = SamplingParams(1.0)
    sched = schedules()["packed"](model, 3, True, TorchEpilogue("cpu", 3, True))
    assert sched.new_state(Request([1, 2], 4, 0, [], [], params)).q_prob.dtype == torch.float32
    if native_module() is None:
        pytest.skip("the native epilogue is not built")
    ep = NativeEpilogue("cpu", 3, True)
    st = DecodeState.new(3, 11, 4, [], 0, "cpu", q_dtype=torch.float64, params=params)
    rows = ep.rows(torch.randn(1, 8, 11), st.sampling)
    with pytest.raises(ValueError, match="DecodeState.q_prob is torch.float64, the rows' probabilities torch.float32"):
        ep.step(st, verify=rows[:4], propose=rows[4:], retain="a")
