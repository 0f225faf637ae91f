"""Sampling primitives against known answers and their definitions."""
import pytest
import torch

from packed_ss import host
from packed_ss.decode import sampling
from packed_ss.decode.acceptance import verify_greedy
from packed_ss.decode.sampling import Sampling, SamplingParams, inverse_cdf, philox4x32, philox_uniform, truncated_probs


def words(*values):
    return [torch.tensor([v], dtype=torch.int64) for v in values]


@pytest.mark.parametrize("counter,key,expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_matches_random123_known_answers(counter, key, expected):
    k0, k1 = (torch.tensor(k) for k in key)
    assert philox4x32(*words(*counter), k0, k1)[0].tolist() == list(expected)


def test_uniforms_are_deterministic_distinct_and_in_range():
    seed = torch.tensor(2**40 + 17)
    a = philox_uniform(seed, torch.tensor(3), 1000)
    assert torch.equal(a, philox_uniform(seed, torch.tensor(3), 1000))
    assert not torch.equal(a, philox_uniform(seed, torch.tensor(4), 1000))
    assert not torch.equal(a, philox_uniform(seed + 1, torch.tensor(3), 1000))
    assert 0.0 <= a.min() and a.max() < 1.0
    assert abs(a.mean().item() - 0.5) < 0.03          # 1000 uniforms: sd of the mean ~0.009


def truncated(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """truncated_probs of one request's rows logits [..., V] (a batch of one)."""
    return truncated_probs(logits[None], params.rows(1))[0]


def test_top_k_and_top_p_truncation():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    prob = truncated(logits, SamplingParams(1.0, top_k=2))      # dense: token order, zeros outside the kept set
    assert prob.shape == (5,) and (prob > 0).tolist() == [True, True, False, False, False]
    torch.testing.assert_close(prob[:2], torch.softmax(torch.tensor([2.0, 1.0]), 0))
    full = torch.softmax(logits, 0)                    # [0.61, 0.22, 0.14, 0.08, 0.03]
    p = truncated(logits, SamplingParams(1.0, top_p=0.7))
    assert (p > 0).tolist() == [True, True, False, False, False]   # 0.61 < 0.7 <= 0.61 + 0.22
    torch.testing.assert_close(p[:2], full[:2] / full[:2].sum())
    shuffled = logits[[3, 0, 4, 2, 1]]                 # token order, not sorted: the same set, where its tokens are
    assert torch.equal(truncated(shuffled, SamplingParams(1.0, top_k=2)), prob[[3, 0, 4, 2, 1]])
    cold = truncated(logits, SamplingParams(0.5))
    torch.testing.assert_close(cold, torch.softmax(logits / 0.5, 0))
    greedy = truncated(shuffled, SamplingParams(0.0, top_k=3, top_p=0.5))    # temperature 0: one-hot argmax
    assert greedy.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("top_p", [None, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("top_k", [1, 7, 64, 65, 300])
def test_both_truncation_paths_apply_the_sorted_rule(top_k, top_p):
    """A top-k of at most PARTIAL tokens takes the sorted head (topk of the logits), a larger one the whole
    vocabulary masked by `kept`: both keep the top-k tokens, then those of them whose renormalised mass ranked
    before them is below top_p, and renormalise (float64 rows without ties, peaked and flat, 3000 tokens)."""
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(4, 3000, generator=g, dtype=torch.float64) * torch.tensor([0.2, 1.0, 3.0, 8.0])[:, None]
    got = truncated_probs(logits[None], SamplingParams(0.8, top_k=top_k, top_p=top_p).rows(1))[0]
    for row, prob in zip(logits, got):
        vals, idx = (row / 0.8).sort(descending=True)
        want = torch.softmax(vals[:top_k], 0)
        if top_p is not None:
            want = torch.where(want.cumsum(0) - want < top_p, want, 0.0)
            want = want / want.sum()
        dense = torch.zeros(3000, dtype=torch.float64).index_put_((idx[:top_k],), want)
        torch.testing.assert_close(prob, dense, rtol=1e-12, atol=1e-15)


def sorted_cut(prob: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The torch reference of the top-p threshold of rows prob [N, V]: the rows sorted, the last token whose
    mass ranked before it is below top_p (every token where top_p is 1: 0)."""
    values = prob.sort(-1, descending=True).values
    keep = values.cumsum(-1) - values < top_p[:, None]
    return torch.where(top_p >= 1, 0.0, values.masked_fill(~keep, torch.inf).amin(-1))


needs_native = pytest.mark.skipif(sampling.nucleus_cut(torch.ones(1, 2) / 2, torch.ones(1)) is None,
                                  reason="the native module is not built")


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("vocab", [2, 5, 64, 300, 4096, 49152])
def test_the_native_nucleus_cut_is_the_sorted_rules_bit_for_bit(dtype, vocab):
    """csrc/nucleus.h finds, without sorting the row, the threshold the sorted rule finds: on peaked, middling,
    flat and near-uniform rows, with ties (half a row at one value), zeros, and top_p from 0.1 to just below 1
    (where the scan keeps every token of the bins whose sums reach it and gathers on, and passes tiny values no
    sum holds exactly) and 1; one setting for every row too. Asked to, it writes each row zeroed below its cut
    (the bits of prob * kept)."""
    g = torch.Generator().manual_seed(vocab)
    scale = torch.tensor([8.0, 2.0, 0.5, 1e-3]).repeat_interleave(8)[:, None]
    logits = torch.randn(32, vocab, generator=g, dtype=dtype) * scale
    logits[:4, : vocab // 2] = logits[:4, :1]
    prob = torch.softmax(logits, -1)
    prob[4:8, ::3] = 0.0
    top_p = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.999, 1 - 1e-7, 1 - 1e-12, 1.0] * 4, dtype=dtype)
    truncated = torch.empty_like(prob)
    got = sampling.nucleus_cut(prob, top_p, truncated)
    assert got.dtype == dtype
    assert torch.equal(got, sorted_cut(prob, top_p))
    assert torch.equal(truncated, prob * (prob >= got[:, None]))
    assert torch.equal(sampling.nucleus_cut(prob, top_p[3:4]), sorted_cut(prob, top_p[3].expand(32)))
    assert sampling.nucleus_cut(prob[:0], top_p[:0]).shape == (0,)          # a call with no rows of this kind


@needs_native
def test_kept_is_the_same_with_and_without_the_native_nucleus(monkeypatch):
    """`kept` over a batch that mixes top-k and top-p requests keeps the same tokens whether the rows without
    top-k take the native cut or the partial sorts."""
    g = torch.Generator().manual_seed(7)
    prob = torch.softmax(torch.randn(6, 3, 5000, generator=g) * torch.tensor([4.0, 1.0, 0.2])[:, None], -1)
    top_k = torch.tensor([0, 0, 70, 3, 0, 200])
    top_p = torch.tensor([0.9, 0.999, 0.9, 1.0, 1.0, 0.5])
    native = sampling.kept(prob, top_k, top_p)
    monkeypatch.setattr(sampling, "nucleus_cut", lambda prob, top_p: None)
    assert torch.equal(native, sampling.kept(prob, top_k, top_p))
    assert native.sum(-1).min() >= 1 and (native.sum(-1) < 5000).any()


# Requests with their own settings in one batch: temperature, top-k (k = 1, above PARTIAL = 64, above the
# vocabulary), top-p (some needing the full sort on 3000 tokens), and temperature 0 (one-hot argmax).
MIXES = {
    "temperature": [SamplingParams(0.5), SamplingParams(1.0), SamplingParams(1.7)],
    "top-k": [SamplingParams(1.0, top_k=1), SamplingParams(0.8, top_k=3), SamplingParams(1.0, top_k=100),
              SamplingParams(1.0), SamplingParams(1.2, top_k=5000)],
    "top-p": [SamplingParams(1.0, top_p=0.3), SamplingParams(0.9, top_p=0.9), SamplingParams(1.5, top_p=0.999),
              SamplingParams(1.0, top_p=1.0)],
    "greedy": [SamplingParams(), SamplingParams(1.0), SamplingParams(0.0, top_k=2, top_p=0.5),
               SamplingParams(1.0, top_k=4)],
    "top-p beside the head": [SamplingParams(1.0, top_k=3), SamplingParams(0.7, top_p=0.95),
                              SamplingParams(0.0, top_k=5), SamplingParams(1.0, top_p=0.5)],
    "all": [SamplingParams(), SamplingParams(1.0, top_k=2, top_p=0.5), SamplingParams(0.7, top_p=0.95),
            SamplingParams(1.3, top_k=70, top_p=0.99), SamplingParams(0.6), SamplingParams(1.0, top_k=64, top_p=0.8),
            SamplingParams(0.0, top_k=5)],
}


def batch_of(params: list[SamplingParams]) -> Sampling:
    return Sampling(*(torch.cat(t) for t in zip(*(p.rows(1) for p in params))))


@pytest.mark.parametrize("vocab", [5, 3000])
@pytest.mark.parametrize("mix", MIXES)
def test_per_request_settings_in_one_batch_equal_each_request_alone(mix, vocab):
    """truncated_probs of a batch whose requests each have their own settings (3 rows each, peaked and flat
    logits, ties) is, request for request, what it gives that request alone; a temperature-0 request gets the
    one-hot of its argmax, every other a distribution on the tokens its settings keep."""
    params = MIXES[mix]
    g = torch.Generator().manual_seed(vocab)
    scale = torch.tensor([4.0, 0.3, 1.0])[:, None]
    logits = torch.randn(len(params), 3, vocab, generator=g, dtype=torch.float64) * scale
    logits[:, 2] = (logits[:, 2] * 2).round() / 2                    # ties
    for dtype in (torch.float32, torch.float64):
        batched = truncated_probs(logits.to(dtype), batch_of(params))
        assert batched.shape == logits.shape and batched.dtype == dtype
        for b, p in enumerate(params):
            alone = truncated_probs(logits[b:b + 1].to(dtype), p.rows(1))[0]
            assert torch.equal(batched[b], alone), (mix, vocab, dtype, b, p)
            if p.greedy:
                assert torch.equal(alone, torch.nn.functional.one_hot(logits[b].to(dtype).argmax(-1), vocab).to(dtype))
            else:
                torch.testing.assert_close(alone.sum(-1), torch.ones(3, dtype=dtype))
                assert (alone >= 0).all()


@pytest.mark.parametrize("vocab", [5, 3000])
@pytest.mark.parametrize("mix", MIXES)
def test_the_device_path_keeps_what_the_cpu_path_keeps(monkeypatch, mix, vocab):
    """On the CPU, eagerly, truncated_probs skips by host reads the rules no request asks for and ranks whole only
    the rows a partial sort cannot settle; the device path (CUDA, compiled) reads nothing and takes every rule on
    every row. Both give the same distributions."""
    params = MIXES[mix]
    g = torch.Generator().manual_seed(vocab + 1)
    logits = torch.randn(len(params), 3, vocab, generator=g, dtype=torch.float64) * torch.tensor([4.0, 0.3, 1.0])[:, None]
    eager = truncated_probs(logits, batch_of(params))
    monkeypatch.setattr(host, "reads_are_free", lambda t: False)
    assert torch.equal(truncated_probs(logits, batch_of(params)), eager), mix


def test_inverse_cdf_never_draws_a_zero_weight():
    weights = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0])
    u = torch.tensor([0.0, 0.2999, 0.3, 0.9999999, 1.0 - 2**-24, 1.0])
    draws = inverse_cdf(weights.expand(6, 5), u)
    assert draws.tolist() == [1, 1, 3, 3, 3, 3]


def test_greedy_verification_counts_the_leading_matches():
    logits = torch.eye(6)[[4, 2, 5, 1, 0]]            # verifier argmax per row: 4 2 5 1 0
    cases = [([4, 2, 5, 1], 4, 5), ([4, 2, 0, 1], 4, 3), ([3, 2, 5, 1], 4, 1), ([4, 2, 5, 1], 2, 3)]
    for draft, draft_len, accepted in cases:
        emitted, n = verify_greedy(torch.tensor([draft]), torch.tensor([draft_len]), logits.argmax(-1)[None])
        assert n.tolist() == [accepted] and emitted[0, :accepted].tolist() == [4, 2, 5, 1, 0][:accepted]


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=70, top_p=0.9), SamplingParams()],
                         ids=["T1", "top-k-top-p", "greedy"])
def test_one_setting_broadcasts_over_the_batch(params):
    """Settings of shape [1] or 0-d apply to every request of the batch, as the same settings per request do."""
    logits = torch.randn(4, 3, 300, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2
    want = truncated_probs(logits, params.rows(4))
    assert torch.equal(truncated_probs(logits, params.rows(1)), want)
    assert torch.equal(truncated_probs(logits, Sampling(*(t[0] for t in params.rows(1)))), want)
