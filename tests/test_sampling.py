"""Sampling primitives against known answers and their definitions."""
import pytest
import torch

from packed_ss.decode.acceptance import verify_greedy
from packed_ss.decode.sampling import SamplingParams, densify, inverse_cdf, philox4x32, philox_uniform, truncated_probs


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


def test_top_k_and_top_p_truncation():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    idx, prob = truncated_probs(logits, SamplingParams(1.0, top_k=2))
    assert idx.tolist() == [0, 1]
    torch.testing.assert_close(prob, torch.softmax(torch.tensor([2.0, 1.0]), 0))
    full = torch.softmax(logits, 0)                    # [0.61, 0.22, 0.14, 0.08, 0.03]
    p = densify(*truncated_probs(logits, SamplingParams(1.0, top_p=0.7)), 5)
    assert (p > 0).tolist() == [True, True, False, False, False]   # 0.61 < 0.7 <= 0.61 + 0.22
    torch.testing.assert_close(p[:2], full[:2] / full[:2].sum())
    cold = densify(*truncated_probs(logits, SamplingParams(0.5)), 5)
    torch.testing.assert_close(cold, torch.softmax(logits / 0.5, 0))


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
