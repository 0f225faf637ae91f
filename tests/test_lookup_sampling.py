"""Sampled output with lookup drafts follows the AR distribution exactly, and shared noise gives AR's own tokens.

A lookup draft is a point mass (decode/lookup.py): the rejection rule accepts it with probability p(d) and draws
a rejection's correction from p without d. The G-tests of tests/sampling_law.py, with a prompt whose n-grams
recur, made of a start, the test model's greedy continuation of it and the start again (so that lookup drafts
are made from the first iteration on and are often what the model samples): the lookup schedule alone and the diffusion proposals joined by lookup drafts ("both"), alone and
batched, every kind of emitted token observed (the bonus in 34-53% of the samples, measured; BONUS_SEEN 30% is
required); the broken rules must be flagged at p < 1e-6: a correction
drawn from p (it can repeat the rejected draft), a bonus drawn from the draft's Q, and a lookup draft that keeps
the replaced proposal's stored Q.
"""
import pytest
import torch
from sampling_law import (
    ALPHA,
    POWER,
    T1,
    TOP_K,
    TOP_P,
    ar_checkpoint,
    ar_law,
    bonus_from_q,
    case_id,
    draw,
    draw_batched,
    follows,
    g_test_pvalue,
    length_for,
    residual_from_p,
)

import packed_ss
import packed_ss.decode.epilogue.reference as torch_epilogue
from packed_ss.decode.lookup import lookup_draft
from packed_ss.decode.schedules.base import Schedule

PROMPT = [2, 3, 3, 2, 2, 2, 2, 2, 2, 3, 3, 2]
CASES = [("lookup", 1, T1, None), ("lookup", 2, TOP_K, None), ("packed", 2, T1, "both"),
         ("linear", 1, TOP_P, "both"), ("quadratic", 2, TOP_K, "both")]


@pytest.fixture(scope="module")
def path():
    return ar_checkpoint()


def ids(cases):
    return [f"{case_id(s, w, p)}-{d or 'lookup'}" for s, w, p, d, *_ in cases]


@pytest.mark.parametrize("schedule,width,params,drafts", CASES, ids=ids(CASES))
def test_sequences_follow_ar_distribution(path, schedule, width, params, drafts):
    draws = draw(path, schedule, width, params, prompt=PROMPT, drafts=drafts)
    law = ar_law(path, params, length_for(width), PROMPT)
    assert follows(draws, law) > ALPHA


def test_batched_requests_follow_ar_distribution(path):
    draws = draw_batched(path, "packed", 2, T1, prompt=PROMPT, drafts="both")
    assert follows(draws, ar_law(path, T1, 4, PROMPT)) > ALPHA


def keep_replaced_q(self, st):
    """Broken Schedule.redraft: the lookup draft replaces the proposal, its stored Q does not."""
    if self.looks_up:
        draft, length, order = lookup_draft(st, self.width)
        found = order > 0
        other = st.draft_len if self.draft_source == "both" else torch.zeros_like(st.draft_len)
        st.assign(~st.done, draft=torch.where(found[:, None], draft, st.draft),
                  draft_len=torch.where(found, length, other))


# (broken verify rule or redraft, schedule, width, params, drafts); measured p-values in the comments.
BROKEN = [
    (residual_from_p, "lookup", 1, T1, None),          # 6e-49
    (bonus_from_q, "lookup", 2, TOP_K, None),          # 1e-66
    (keep_replaced_q, "packed", 2, T1, "both"),        # < 1e-300
]


@pytest.mark.parametrize("broken,schedule,width,params,drafts", BROKEN,
                         ids=[f"{b.__name__}-{i}" for b, i in zip([c[0] for c in BROKEN], ids([c[1:] for c in BROKEN]))])
def test_detects_broken_rules(path, monkeypatch, broken, schedule, width, params, drafts):
    if broken is keep_replaced_q:
        monkeypatch.setattr(Schedule, "redraft", broken)
    else:
        monkeypatch.setattr(torch_epilogue, "verify_sampled", broken)
    samples = draw(path, schedule, width, params, epilogue="torch", prompt=PROMPT, drafts=drafts).samples
    p_value = g_test_pvalue(samples, ar_law(path, params, length_for(width), PROMPT))
    print(f"{broken.__name__}: p = {p_value:.1e}")
    assert p_value < POWER, p_value


@pytest.mark.parametrize("schedule,drafts", [("packed", "both"), ("linear", "lookup"), ("lookup", None)])
def test_shared_noise_gives_ar_tokens(schedule, drafts):
    """Under the shared-noise sampler a seeded request returns AR's own tokens whatever the drafts."""
    model = packed_ss.load_model()
    tok = packed_ss.load_tokenizer(packed_ss.model.loading.default_model_path())
    prompt = tok.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n").ids
    ar = packed_ss.Engine(model, schedule="ar", sampler="gumbel")
    engine = packed_ss.Engine(model, schedule=schedule, drafts=drafts, width=5, sampler="gumbel")
    accepted = 0
    for seed in range(6):
        kw = dict(max_new_tokens=48, temperature=0.6, top_p=0.95, seed=seed)
        got = engine.generate(prompt, **kw)
        assert got.tokens == ar.generate(prompt, **kw).tokens
        accepted += got.n_accepted
    assert accepted > 0
