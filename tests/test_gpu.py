"""CUDA-only: the CUDA epilogue against the CPU build, and CUDA-graph decoding against eager decoding.

1. Single steps (tests/epilogue_cases.py): the same inputs (the rows the epilogue consumes are computed on
   the CPU and copied over, so torch's CUDA softmax plays no part) leave the same DecodeState on the GPU as
   in the CPU build. The CUDA inverse CDF sums in parallel chunks: it could differ from the CPU build only
   where a double-rounded prefix lands on a float boundary next to the target, which these cases never hit.
2. The first emitted token follows p on the GPU too.
3. Engine(cuda_graph=True) emits the tokens of eager decoding, for every schedule, greedy and sampled,
   with either epilogue, across repeated requests on one engine (captured graphs reused).
4. Any-order decoding through the fused kernel equals the serial reference of Proposition C.1.
5. A drafting adapter stays live under graph replay (and changes the drafts).
Every decode loop runs under torch.cuda.set_sync_debug_mode("error"): a step that synchronises with the
host (.item(), nonzero, a blocking copy) fails the test; the loop's one read per iteration is an event wait
on a pinned copy, which that mode allows.
"""
import contextlib

import pytest
import torch
from epilogue_cases import check_emitted_tokens_follow_p, differences, make_case
from tiny_models import checkpoint

import packed_ss
import packed_ss.runtime.batch as batch_mod
from packed_ss.decode.epilogue import NativeEpilogue, native_available, native_unavailable_reason
from packed_ss.decode import sampling
from packed_ss.decode.sampling import Sampling, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_cuda_native = pytest.mark.skipif(not torch.cuda.is_available() or not native_available("cuda"),
                                       reason="needs the CUDA build of the native epilogue and a GPU")
PROMPT = [3, 17, 42, 8, 9]


@pytest.fixture(autouse=True)
def check_syncs(monkeypatch):
    """Every decode loop in this file runs its iterations under torch.cuda.set_sync_debug_mode("error")
    (runtime.graphs.SyncCheck): an implicit host synchronisation inside a step raises."""
    monkeypatch.setenv("PACKED_SS_CHECK_SYNCS", "1")


@contextlib.contextmanager
def no_sync():
    """Assert that the runtime's sync check is on while iterations run (it could otherwise pass vacuously):
    every iteration, eager steps or a graph replay, of every program, threshold any-order decoder included."""
    seen = []
    iterate = batch_mod.Batch.iterate

    def checked_iterate(self, first):
        seen.append(torch.cuda.get_sync_debug_mode())
        return iterate(self, first)

    batch_mod.Batch.iterate = checked_iterate
    try:
        yield
    finally:
        batch_mod.Batch.iterate = iterate
    assert seen and min(seen) == 2, f"iterations ran with sync debug modes {sorted(set(seen))}, not 2 (error)"


@pytest.fixture
def rows_from_cpu(monkeypatch):
    """Make every NativeEpilogue compute its rows on the CPU and copy them to its device."""
    rows = NativeEpilogue.rows

    def cpu_rows(self, logits, sampling):
        r = rows(self, logits.cpu(), Sampling(*(t.cpu() for t in sampling)))
        for name in ("arg", "idx", "prob"):
            t = getattr(r, name)
            if t is not None:
                setattr(r, name, t.to(self.device))
        return r

    monkeypatch.setattr(NativeEpilogue, "rows", cpu_rows)


@needs_cuda_native
@pytest.mark.parametrize("vocabs,max_width,n", [((4, 9, 33, 100), 6, 600), ((5000, 32768, 131072), 8, 30)],
                         ids=["small", "vocab-sized"])
def test_cuda_steps_match_cpu_build(rows_from_cpu, vocabs, max_width, n):
    for seed in range(n):
        case = make_case(20_000 + seed, vocabs=vocabs, max_width=max_width)
        cpu, gpu = case.run(native=True), case.run(native=True, device="cuda")
        diff = differences(cpu, gpu, case.dense)
        assert not diff, (seed, case.schedule, case.step, case.width, case.vocab, case.params, diff)


@needs_cuda_native
@pytest.mark.parametrize("params,sparse", [(SamplingParams(1.0), False), (SamplingParams(0.8, top_k=4), False),
                                           (SamplingParams(0.8, top_k=4), True)],
                         ids=["dense", "top-k", "top-k-sparse"])
def test_every_emitted_position_follows_p_on_gpu(params, sparse):
    check_emitted_tokens_follow_p("cuda", params, sparse)


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), device="cuda", dtype=torch.float32)


REQUESTS = [dict(prompt=PROMPT, max_new_tokens=40, eos_token_id=[]),
            dict(prompt=list(range(1, 30)), max_new_tokens=25, eos_token_id=None),
            dict(prompt=PROMPT[:2], max_new_tokens=1, eos_token_id=[])]


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
@pytest.mark.parametrize("epilogue", ["native", "torch"])
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, top_k=20)], ids=["greedy", "sampled"])
def test_graph_replay_matches_eager(model, schedule, epilogue, sampling):
    if epilogue == "native" and not native_available("cuda"):
        pytest.skip(native_unavailable_reason("cuda"))
    eager = packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue)
    graphed = packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue, cuda_graph=True)
    for i, req in enumerate(REQUESTS * 2):      # twice: the second round replays graphs captured in the first
        kwargs = dict(req, **sampling, seed=i)
        prompt = kwargs.pop("prompt")
        with no_sync():
            want, got = eager.generate(prompt, **kwargs), graphed.generate(prompt, **kwargs)
            streamed = sum(graphed.stream(prompt, **kwargs), [])
        assert got.tokens == want.tokens == streamed, (i, got.tokens, want.tokens)
        assert (got.nfe, got.n_verify, got.n_accepted) == (want.nfe, want.n_verify, want.n_accepted)


@needs_cuda_native
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_native_matches_torch_on_gpu_greedy(model, schedule):
    kwargs = dict(max_new_tokens=40, eos_token_id=[])
    with no_sync():
        ref = packed_ss.Engine(model, schedule=schedule, width=4, epilogue="torch").generate(PROMPT, **kwargs)
        got = packed_ss.Engine(model, schedule=schedule, width=4, epilogue="native").generate(PROMPT, **kwargs)
    assert got.tokens == ref.tokens and got.nfe == ref.nfe


@pytest.mark.parametrize("schedule", ["packed", "linear", "quadratic", "threshold"])
@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_any_order_on_gpu_matches_serial_reference(schedule, order):
    """Any-order decoding with the fused kernel on the GPU (float32), eager and replayed from CUDA graphs,
    equals the serial reference; sampled LTR decoding is the same in both loops."""
    from packed_ss.decode.any_order import serial_reference
    if schedule == "threshold" and order == "confidence":
        pytest.skip("the threshold decoder has no verification order")
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), device="cuda")
    opts = dict(schedule=schedule, width=4, order=None if schedule == "threshold" else order)
    eager, graphed = packed_ss.Engine(model, **opts), packed_ss.Engine(model, cuda_graph=True, **opts)
    assert eager.backend == "triton"
    requests = [dict(eos_token_id=[]), dict(eos_token_id=[], stop_sequences=[[20, 21], [7, 7, 7]])]
    if order == "ltr" and schedule != "threshold":
        requests.append(dict(eos_token_id=[], temperature=1.0, top_k=20, seed=3))
    for kwargs in requests * 2:               # twice: the second round replays the captured graphs
        with no_sync():
            out, replayed = eager.generate(PROMPT, 24, **kwargs), graphed.generate(PROMPT, 24, **kwargs)
            streamed = sum(graphed.stream(PROMPT, 24, **kwargs), [])
        assert replayed.tokens == out.tokens == streamed and replayed.iterations == out.iterations
        if schedule != "threshold" and "temperature" not in kwargs:
            assert out.tokens == serial_reference(model, PROMPT, out.iterations, 24,
                                                  [tuple(s) for s in kwargs.get("stop_sequences", [])])


@pytest.mark.parametrize("schedule", ["linear", "quadratic", "packed"])
def test_drafting_adapter_live_under_graph_replay(schedule):
    """A scaled-down Nemotron-Labs-Diffusion checkpoint with its drafting LoRA, in its own dtype (bfloat16 on
    CUDA, the adapter in float32): graph replay keeps the adapter (same tokens, NFE and accepted counts as
    eager), and the adapter matters (without it the drafts, hence NFE or accepted counts, differ)."""
    from released_models import nld_checkpoint

    path, _ = nld_checkpoint("3B")
    model = packed_ss.load_model(path, device="cuda")
    base = packed_ss.load_model(path, device="cuda", draft_adapter=None)
    assert model.dtype == torch.bfloat16 and model.model.layers[0].self_attn.o_proj.lora.a.dtype == torch.float32

    def runs(m, **engine):
        e = packed_ss.Engine(m, schedule=schedule, width=8, **engine)
        with no_sync():
            out = [e.generate(p, max_new_tokens=48, eos_token_id=[]) for p in ([1, *PROMPT], [1, 60, 3, 120, 77]) * 2]
        return [(r.tokens, r.nfe, r.n_accepted) for r in out]

    eager = runs(model)
    assert runs(model, cuda_graph=True) == eager
    assert [r[1:] for r in runs(base, cuda_graph=True)] != [r[1:] for r in eager], "the adapter must change drafts"


@pytest.mark.parametrize("schedule", ["ar", "linear", "packed"])
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, top_k=20)], ids=["greedy", "sampled"])
def test_batch_replay_matches_requests_alone(model, schedule, sampling):
    """generate_batch replayed from CUDA graphs (3 slots for 4 requests: one admitted mid-run) gives every
    request the tokens and counts of `generate` alone, eagerly. On the GPU this also needs batch-invariant
    numerics: cuBLAS may pick another GEMM for 3 x R rows than for R, and the attention's split count
    must not follow the batch (kernels/attention.py)."""
    prompts = [PROMPT, list(range(1, 30)), PROMPT[:2], [9, 8, 7]]
    caps, seeds = [40, 25, 1, 17], [3, 4, 5, 6]
    eager = packed_ss.Engine(model, schedule=schedule, width=3)
    graphed = packed_ss.Engine(model, schedule=schedule, width=3, cuda_graph=True)
    with no_sync():
        want = [eager.generate(p, max_new_tokens=c, seed=s, eos_token_id=[], **sampling)
                for p, c, s in zip(prompts, caps, seeds)]
        for _ in range(2):                          # the second round replays the captured graphs
            got = graphed.generate_batch(prompts, max_new_tokens=caps, seed=seeds, eos_token_id=[], batch_size=3,
                                         **sampling)
            assert [g.tokens for g in got] == [w.tokens for w in want]
            assert [(g.nfe, g.n_accepted) for g in got] == [(w.nfe, w.n_accepted) for w in want]


def test_kept_on_gpu_keeps_the_cpu_tokens():
    """`kept` on the device (every row sorted whole, nothing read on the host) keeps what the CPU's partial sort
    keeps, request by request of one batch with per-request top_k / top_p (k around PARTIAL = 64, top-p needing
    the full sort on 3000 tokens), on peaked and flat rows."""
    g = torch.Generator().manual_seed(0)
    settings = [(k, p) for k in (0, 1, 64, 65, 3000) for p in (0.5, 0.95, 1.0)]
    logits = torch.randn(len(settings), 2, 3000, generator=g, dtype=torch.float64) * torch.tensor([4.0, 0.1])[:, None]
    prob = torch.softmax(logits, -1)
    top_k = torch.tensor([k for k, _ in settings])
    top_p = torch.tensor([p for _, p in settings], dtype=torch.float64)
    want = sampling.kept(prob, top_k, top_p)
    assert torch.equal(sampling.kept(prob.cuda(), top_k.cuda(), top_p.cuda()).cpu(), want)
