"""The shared-noise samplers (sampler="gumbel" and "inverse-cdf", packed_ss/decode/shared_noise.py): with a seed,
every schedule, width, batch, epilogue and runner returns exactly the tokens of schedule="ar" (token identity, not
only the same law), any-order LTR decoding its own AR's, and under "inverse-cdf" those of the rejection sampler's
AR; the AR sampler itself follows the model's distribution (G-tests of the first token and of the first two and
three tokens, tests/sampling_law.py), and noise reused across positions is flagged. The native draws pick the
torch references' tokens, and a call that returns some of its rows draws those alone, as among all."""
import functools

import pytest
import torch
from sampling_law import ALPHA, N, POWER, PROMPT, T1, TOP_K, TOP_P, ar_checkpoint, ar_law, g_test_pvalue
from tiny_models import checkpoint

import packed_ss
from packed_ss.model.attention import Layout
from packed_ss.runtime import ModelInput, Request
from packed_ss.runtime.executor import Graphs
import packed_ss.decode.shared_noise as shared_noise
from packed_ss.decode.epilogue import native_available, native_module
from packed_ss.decode import sampling
from packed_ss.decode.sampling import Sampling, SamplingParams, exponential_noise, truncated_probs

PROMPTS = [[3, 17, 42, 8, 9], list(range(1, 20)), [60, 3], [11, 11, 40, 7, 7, 90, 1, 4], [5], [9, 9, 9],
           [70, 2, 33, 1], list(range(40, 52))]
SETTINGS = {"T=1": dict(temperature=1.0), "T=0.5": dict(temperature=0.5),
            "T=0.8,k=10": dict(temperature=0.8, top_k=10), "T=1.2,p=0.9": dict(temperature=1.2, top_p=0.9)}
MAX_NEW = 30
SHARED = tuple(shared_noise.DRAWS)      # the shared-noise couplings: "gumbel", "inverse-cdf"


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def ar_sample(model, sampler: str, setting: str, prompt: tuple, seed: int, max_new: int = MAX_NEW) -> list[int]:
    engine = packed_ss.Engine(model, schedule="ar", sampler=sampler)
    return engine.generate(list(prompt), max_new_tokens=max_new, eos_token_id=[], seed=seed,
                           **SETTINGS[setting]).tokens


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("width", [1, 2, 3, 8])
@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
@pytest.mark.parametrize("sampler", SHARED)
def test_every_schedule_returns_the_ar_sample(model, sampler, schedule, width, setting, epilogue):
    if epilogue == "native" and not native_available(model.device):
        pytest.skip("the native epilogue is not built")
    engine = packed_ss.Engine(model, schedule=schedule, width=width, sampler=sampler, epilogue=epilogue)
    accepted = 0
    for seed, prompt in enumerate(PROMPTS[:2]):
        got = engine.generate(prompt, max_new_tokens=MAX_NEW, eos_token_id=[], seed=seed, **SETTINGS[setting])
        assert got.tokens == ar_sample(model, sampler, setting, tuple(prompt), seed)
        accepted += got.n_accepted
    assert accepted > 0 or width == 1   # drafts were accepted: the identity is not AR's own path


@pytest.mark.parametrize("setting", ["T=1", "T=0.8,k=10"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
@pytest.mark.parametrize("sampler", SHARED)
def test_batched_ragged_requests_return_their_ar_samples(model, sampler, schedule, setting):
    """Eight ragged prompts with their own lengths and seeds, decoded 8 and 3 at a time: the noise is keyed by
    the request's seed and output position, never by its slot."""
    engine = packed_ss.Engine(model, schedule=schedule, width=3, sampler=sampler)
    lengths = [MAX_NEW - 2 * i for i in range(len(PROMPTS))]
    want = [ar_sample(model, sampler, setting, tuple(p), 10 + i, n) for i, (p, n) in enumerate(zip(PROMPTS, lengths))]
    for batch_size in (8, 3):
        got = engine.generate_batch(PROMPTS, max_new_tokens=lengths, eos_token_id=[], seed=10,
                                    batch_size=batch_size, **SETTINGS[setting])
        assert [r.tokens for r in got] == want


@pytest.mark.parametrize("mode", ["compile", "graph"])
@pytest.mark.parametrize("sampler", SHARED)
def test_compiled_and_graph_runners_return_the_ar_sample(model, eager_graphs, sampler, mode):
    """Compiled steps (aot_eager for inductor) and the CUDA-graph loop (CPU stand-ins for the capture)."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, sampler=sampler, compile="aot_eager")
    if mode == "graph":
        engine.runtime.executor = Graphs(engine.runtime.executor.compile_backend)
    got = engine.generate_batch(PROMPTS[:3], max_new_tokens=MAX_NEW, eos_token_id=[], seed=[0, 1, 2],
                                **SETTINGS["T=1.2,p=0.9"])
    want = [ar_sample(model, sampler, "T=1.2,p=0.9", tuple(p), i) for i, p in enumerate(PROMPTS[:3])]
    assert [r.tokens for r in got] == want
    assert engine.runtime.executor.compiled and (mode == "compile" or eager_graphs)


@pytest.mark.parametrize("adapter", [None, "drafter"])
@pytest.mark.parametrize("sampler", SHARED)
def test_the_shipped_model_with_and_without_its_drafting_adapter(sampler, adapter):
    path = packed_ss.default_model_path("default")
    model = packed_ss.load_model(path, dtype=torch.float32, draft_adapter=adapter and path / adapter)
    prompt = packed_ss.load_tokenizer(path).encode("def fibonacci(n):").ids
    kwargs = dict(max_new_tokens=40, eos_token_id=[], temperature=0.7, top_p=0.95, seed=3)
    want = packed_ss.Engine(model, schedule="ar", sampler=sampler).generate(prompt, **kwargs).tokens
    for width in (3, 8):
        got = packed_ss.Engine(model, schedule="packed", width=width, sampler=sampler).generate(prompt, **kwargs)
        assert got.tokens == want and got.n_accepted > 0


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
@pytest.mark.parametrize("sampler", SHARED)
def test_any_order_ltr_returns_its_ar_sample(sampler, schedule):
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float32)
    kwargs = dict(max_new_tokens=MAX_NEW, eos_token_id=[], temperature=1.0, top_k=20)
    for seed, prompt in enumerate(PROMPTS[:2]):
        want = packed_ss.Engine(model, schedule="ar", sampler=sampler).generate(prompt, seed=seed, **kwargs).tokens
        for width in (1, 3, 8):
            engine = packed_ss.Engine(model, schedule=schedule, width=width, sampler=sampler)
            assert engine.generate(prompt, seed=seed, **kwargs).tokens == want


def test_no_draft_distribution_is_stored(model):
    """Under the shared-noise rule a sampled program is the greedy one: its state keeps one Q entry per draft
    slot (the rejection rule's keeps the whole truncated support)."""
    params = SamplingParams(temperature=1.0)
    for sampler, support in (("gumbel", 1), ("inverse-cdf", 1), ("rejection", model.cfg.vocab_size)):
        program = packed_ss.Engine(model, schedule="packed", width=8, sampler=sampler).program(params)
        state = program.new_state(Request([1, 2], 8, 0, [], [], params))
        assert state.q_prob.shape == (1, 8, support)


def test_sampler_is_checked(model):
    with pytest.raises(ValueError, match=r"sampler must be one of \('rejection', 'gumbel', 'inverse-cdf'\), got 'gumbl'"):
        packed_ss.Engine(model, width=3, sampler="gumbl")


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("schedule", ["ar", "packed", "adaptive"])
def test_the_inverse_cdf_sampler_writes_the_text_of_the_rejection_samplers_ar(model, schedule, setting, epilogue):
    """Its draw at output position j is the rejection rule's AR draw (the inverse CDF of the truncated p_j in token
    order at u = philox_uniform(seed, j)[0]): a seeded request writes that text under every schedule, and batched."""
    if epilogue == "native" and not native_available(model.device):
        pytest.skip("the native epilogue is not built")
    kwargs = dict(max_new_tokens=MAX_NEW, eos_token_id=[], seed=5, **SETTINGS[setting])
    want = [r.tokens for r in packed_ss.Engine(model, schedule="ar", sampler="rejection", epilogue=epilogue)
            .generate_batch(PROMPTS[:4], batch_size=1, **kwargs)]
    engine = packed_ss.Engine(model, schedule=schedule, width=3, sampler="inverse-cdf", epilogue=epilogue)
    got = engine.generate_batch(PROMPTS[:4], **kwargs)
    assert [r.tokens for r in got] == want
    assert sum(r.n_accepted for r in got) > 0 or schedule != "packed"    # the adaptive one may not speculate here


@pytest.mark.parametrize("sampler", SHARED)
def test_the_rows_a_call_returns_draw_what_they_draw_among_all(sampler):
    """A prefill of prompts of 5 and 3 tokens, then 4 mask rows each, returns the logits of the rows it reads
    (`logit_rows`: each prompt's last row and its mask rows): only they are drawn (2 target rows, 8 drafting
    rows), each at its own output position and by its own rule, so that each draws what it draws in the same
    call returning every row."""
    torch.manual_seed(0)
    n, masks, vocab = 5, 4, 50
    prompt_len = torch.tensor([5, 3])
    positions = torch.cat([torch.arange(n).expand(2, -1), prompt_len[:, None] + torch.arange(masks)], 1)
    layout = Layout(n, torch.tensor([0] * n + [1] * masks), torch.zeros(n + masks, dtype=torch.int64), n)
    inp = ModelInput(torch.zeros_like(positions), positions, layout, torch.zeros(2, dtype=torch.int64))
    logits, seed = torch.randn(2, n + masks, vocab) * 2, torch.tensor([7, 8])
    settings = SamplingParams(0.9, top_p=0.95).rows(2)
    reference = shared_noise.DRAWS[sampler][0]
    drawn = []

    def counted(seed, position, prob, idx):
        drawn.append(prob.shape[0] * prob.shape[1])
        return reference(seed, position, prob, idx)
    every = shared_noise.perturbed_scores(logits, inp, seed, prompt_len, settings, counted)
    rows = torch.tensor([[4, 5, 6, 7, 8], [2, 5, 6, 7, 8]])
    read = logits.gather(1, rows[..., None].expand(-1, -1, vocab))
    some = shared_noise.perturbed_scores(read, inp._replace(logit_rows=rows), seed, prompt_len, settings, counted)
    assert drawn == [10, 8, 2, 8]
    assert torch.equal(some.argmax(-1), every.argmax(-1).gather(1, rows))


# -- the AR sampler follows the model's own law ------------------------------------------------------------------
def ar_draws(params: SamplingParams, length: int, epilogue: str, sampler: str) -> list[tuple]:
    engine = packed_ss.Engine(packed_ss.load_model(ar_checkpoint(), dtype=torch.float64), schedule="ar",
                              sampler=sampler, epilogue=epilogue)
    return [tuple(engine.generate(PROMPT, max_new_tokens=length, temperature=params.temperature, top_k=params.top_k,
                                  top_p=params.top_p, seed=seed, eos_token_id=[]).tokens) for seed in range(N)]


def marginal(law: dict[tuple, float], length: int) -> dict[tuple, float]:
    out: dict[tuple, float] = {}
    for seq, p in law.items():
        out[seq[:length]] = out.get(seq[:length], 0.0) + p
    return out


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("params", [T1, TOP_K, TOP_P], ids=["T1", "top-k", "top-p"])
@pytest.mark.parametrize("sampler", SHARED)
def test_ar_shared_noise_sampler_follows_the_model(sampler, params, epilogue):
    """The first token, the first two and the first three tokens of N seeded AR samples against the exact law
    (5-token vocabulary: 5, 25 and 125 outcomes), with the torch and the native noise."""
    if epilogue == "native" and not native_available(torch.device("cpu")):
        pytest.skip("the native module is not built")
    samples = ar_draws(params, 3, epilogue, sampler)
    law = ar_law(ar_checkpoint(), params, 3)
    for length in (1, 2, 3):
        p = g_test_pvalue([s[:length] for s in samples], marginal(law, length))
        print(f"{length} tokens: p = {p:.3g}")
        assert p > ALPHA


@pytest.mark.parametrize("sampler", SHARED)
def test_noise_reused_across_positions_is_flagged(monkeypatch, sampler):
    """Broken: every output position gets position 0's noise. The first token stays right; the pair of the
    first two is flagged (measured p ~ 1e-130 under "gumbel")."""
    draw, native = shared_noise.DRAWS[sampler]
    broken = lambda seed, position, prob, idx: draw(seed, position * 0, prob, idx)   # noqa: E731
    monkeypatch.setitem(shared_noise.DRAWS, sampler, (broken, native))
    samples = ar_draws(T1, 2, "torch", sampler)
    law = ar_law(ar_checkpoint(), T1, 2)
    assert g_test_pvalue([s[:1] for s in samples], marginal(law, 1)) > ALPHA
    p = g_test_pvalue(samples, law)
    print(f"noise reused: p = {p:.3g}")
    assert p < POWER


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=20), SamplingParams(1.0, top_p=0.9)],
                         ids=["dense", "top-k", "top-p"])
@pytest.mark.parametrize("sampler", SHARED)
def test_native_draws_equal_the_torch_draws(sampler, params, dtype):
    """The native draws (csrc/noise.h: the race with its pruning and its chunked dense loop, which skips chunks of
    zeros; the inverse CDF with its chunked sums) pick the torch reference's token in every row: vocabularies of
    odd and even sizes around their chunks, kept tokens in a few chunks only, keys with high bits, float32 and
    float64 probabilities; the race's uniforms are the reference's bit for bit."""
    if not native_available(torch.device("cpu")):
        pytest.skip("the native module is not built")
    reference, native = shared_noise.DRAWS[sampler]
    gen = torch.Generator().manual_seed(0)
    seed, position = torch.tensor([3, 2**40 + 7]), torch.tensor([[0, 1, 2, 5000, 6], [7, 8, 9, 2**33, 10]])
    truncates = params.top_k is not None or params.top_p is not None
    for vocab in (1, 2, 97, 511, 512, 513, 1023, 1025, 4096, 4095):
        for scale in (0.1, 3.0):
            logits = (torch.randn(2, 5, vocab, generator=gen) * scale).to(dtype)
            prob = truncated_probs(logits, params.rows(2))          # dense, zeros outside the kept tokens
            races = [(prob, None)]
            if truncates:   # also sparse (idx, prob), by hand: the kept tokens sorted by decreasing probability
                top, idx = prob.sort(dim=-1, descending=True, stable=True)
                support = min(params.top_k or vocab, vocab)
                races.append((top[..., :support].contiguous(), idx[..., :support].contiguous()))
            for p, idx in races:
                assert torch.equal(native(seed, position, p, idx), reference(seed, position, p, idx))
    for kept in ([0, 3], [600, 1000], [4090, 4094], [511, 512], [1023, 1024], [4095]):   # other chunks all zeros
        prob = torch.zeros(2, 5, 4096, dtype=dtype)
        prob[..., kept] = torch.rand(2, 5, len(kept), generator=gen, dtype=dtype) + 0.1
        assert torch.equal(native(seed, position, prob, None), reference(seed, position, prob, None))
    tokens = torch.arange(9)
    want = torch.exp(-exponential_noise(torch.tensor(5), torch.tensor(2**33 + 1), tokens))
    assert [native_module().noise_uniform(5, 2**33 + 1, x) for x in range(9)] == pytest.approx(want.tolist(), rel=1e-15)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("sampler", SHARED)
def test_the_native_draws_split_rows_over_threads(sampler, threads):
    """Enough entries (5 x 7 rows of 8,192) for the CPU draws to split their rows over torch's intra-op threads:
    every split picks the torch reference's tokens."""
    if not native_available(torch.device("cpu")):
        pytest.skip("the native module is not built")
    reference, native = shared_noise.DRAWS[sampler]
    gen = torch.Generator().manual_seed(1)
    prob = torch.softmax(torch.randn(5, 7, 8192, generator=gen, dtype=torch.float64), -1)
    seed, position = torch.arange(5) + 11, torch.arange(35).reshape(5, 7)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tokens = native(seed, position, prob, None)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(tokens, reference(seed, position, prob, None))


def sorted_rule(prob: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The reference rule of one distribution prob [V]: sort it (decreasing), keep the top_k first (0: all),
    renormalise, then keep the tokens whose mass before them is below top_p (1: all); a bool mask [V]."""
    vocab = prob.shape[-1]
    values, idx = prob.sort(descending=True, stable=True)
    k = top_k if 0 < top_k < vocab else vocab
    values, idx = values[:k], idx[:k]
    if k < vocab:
        values = values / values.sum()
    before = values.cumsum(-1) - values
    keep = before < top_p if top_p < 1 else torch.ones(k, dtype=torch.bool)
    return torch.zeros(vocab, dtype=torch.bool).index_fill(0, idx[keep], True)


@pytest.mark.parametrize("vocab, wide", [(50, sampling.WIDE), (500, sampling.WIDE), (500, 160)])
def test_kept_is_the_sorted_rule(vocab, wide, monkeypatch):
    """`kept` (top-k then top-p; partial sorts of the PARTIAL, then the WIDE most probable tokens, whole rows sorted
    only where k exceeds both or neither head holds enough mass) keeps, request by request of ONE batch with
    per-request top_k / top_p, what the fully sorted rule keeps, on peaked, middling and flat rows, k around
    PARTIAL and WIDE and above the vocabulary."""
    monkeypatch.setattr(sampling, "WIDE", wide)
    g = torch.Generator().manual_seed(vocab + wide)
    settings = [(k, p) for k in (0, 1, 3, sampling.PARTIAL, sampling.PARTIAL + 1, 150, 200, vocab - 1, vocab,
                                 2 * vocab) for p in (0.5, 0.9, 0.95, 1.0)]
    scale = torch.tensor([4.0, 2.0, 0.1])[:, None]
    logits = torch.randn(len(settings), 3, vocab, generator=g, dtype=torch.float64) * scale   # [B, R, V]
    prob = torch.softmax(logits, -1)
    top_k = torch.tensor([k for k, _ in settings])
    top_p = torch.tensor([p for _, p in settings], dtype=torch.float64)
    got = sampling.kept(prob, top_k, top_p)
    assert got.shape == prob.shape and got.dtype == torch.bool
    for b, (k, p) in enumerate(settings):
        for r in range(3):
            assert torch.equal(got[b, r], sorted_rule(prob[b, r], k, p)), (vocab, k, p, r)
    untruncated_k = ((top_k == 0) | (top_k >= vocab))[:, None] & (top_p < 1)[:, None]
    for ranked in (n for n in (sampling.PARTIAL, wide) if n < vocab):   # each head found thresholds, and fell short
        head_mass = prob.topk(ranked, -1).values.sum(-1)
        assert (untruncated_k & (head_mass < top_p[:, None])).any()
        assert ((top_k > ranked) & (top_k < vocab)).any()
        assert (head_mass >= top_p[:, None]).any()
    if wide < vocab:            # the wide head alone found some
        partial, wide_mass = (prob.topk(n, -1).values.sum(-1) for n in (sampling.PARTIAL, wide))
        assert (untruncated_k & (partial < top_p[:, None]) & (wide_mass >= top_p[:, None])).any()
    truncated = truncated_probs(logits, Sampling(torch.ones(len(settings), dtype=torch.float64), top_k, top_p))
    assert torch.equal(truncated > 0, got)     # what truncated_probs keeps (no probability underflows here)
