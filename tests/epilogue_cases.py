"""Random single-step cases for the compiled epilogue: a DecodeState, a schedule step and its logits.

Each case is drawn from a seeded generator and steered towards the corners that matter: ties in the
logits, one-hot targets, zeros in p or in the stored Q, full acceptance (greedy: the verifier agrees
with the draft; sampled: p equals the stored Q), rejection at the first position (p(d_1) = 0), a stop
token inside the accepted run, the length cap inside the accepted run, finished states, short drafts.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from scipy.stats import chi2

from packed_ss.decode.epilogue import NativeEpilogue, make_epilogue
from packed_ss.decode.epilogue import Rows
from packed_ss.decode.sampling import SamplingParams, inverse_cdf, truncated_probs
from packed_ss.decode.registry import schedules
from packed_ss.decode.state import DecodeState

PARAMS = [SamplingParams(), SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.8),
          SamplingParams(0.9, top_k=5, top_p=0.9)]
# (schedule, step): an index into Schedule.steps, or "prefill"
STEPS = [("ar", 0), ("ar", "prefill"), ("linear", 0), ("linear", 1), ("linear", "prefill"), ("quadratic", 0),
         ("quadratic", "prefill"), ("packed", 0), ("packed", "prefill")]


@dataclass
class Case:
    schedule: str
    step: int | str
    width: int
    vocab: int
    params: SamplingParams
    state: DecodeState
    logits: torch.Tensor
    prompt_len: int

    @property
    def dense(self) -> bool:
        """Sampled: the schedules' rows and the stored Q are dense (every sampled setting)."""
        return not self.params.greedy

    @property
    def truncated(self) -> bool:
        """Sampled with top-k or top-p: dense rows with zeros outside the kept tokens."""
        return self.dense and (self.params.top_k is not None or self.params.top_p is not None)

    def model(self, device="cpu"):
        return SimpleNamespace(device=torch.device(device), cfg=SimpleNamespace(mask_token_id=self.vocab - 1,
                                                                                vocab_size=self.vocab))

    def run(self, native: bool, device="cpu") -> DecodeState:
        """A copy of the state after the step, with the torch reference or the compiled epilogue."""
        sampled = not self.params.greedy
        epilogue = make_epilogue("native" if native else "torch", device, self.width, sampled)
        sched = schedules()[self.schedule](self.model(device), self.width, sampled, epilogue)
        st = clone(self.state, device)
        if self.step == "prefill":
            step = sched.prefill(torch.zeros(self.prompt_len, dtype=torch.int64))
        else:
            step = sched.steps[self.step]
        logits, rows = self.logits[None].to(device), step.inputs(st).logit_rows    # a batch of one
        if rows is not None:            # the call returns those rows' logits alone (a prefill's)
            logits = logits.gather(1, rows[..., None].expand(-1, -1, logits.shape[-1]))
        step.update(st, logits)
        return st


def clone(st: DecodeState, device="cpu") -> DecodeState:
    return DecodeState(**{k: v.clone().to(device) for k, v in st.tensors().items()})


def differences(ref: DecodeState, got: DecodeState, dense: bool) -> list[str]:
    """Fields that differ (DecodeState.q_idx is not maintained by the native path for dense Q)."""
    return [k for k, v in ref.tensors().items()
            if not (dense and k == "q_idx") and not torch.equal(v.cpu(), got.tensors()[k].cpu())]


def make_case(seed: int, vocabs=(4, 9, 33, 100), max_width: int = 6) -> Case:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    schedule, step = rng.choice(STEPS)
    params = rng.choice(PARAMS)
    vocab, width = rng.choice(vocabs), rng.randint(1, max_width)
    dtype = rng.choice([torch.float32, torch.float32, torch.float64, torch.bfloat16])
    sampled = not params.greedy
    support = vocab if sampled else 1         # a sampled Q is dense
    block = width + 1

    # the stored draft and its Q: drawn from a drafter's truncated distribution, as retain stores them
    scale = rng.choice([0.5, 2.0, 5.0])
    drafter = torch.randn(width, vocab, generator=gen) * scale
    if rng.random() < 0.2:
        drafter = (drafter * 2).round() / 2                               # ties
    draft_len = rng.choice([width, width, rng.randint(0, width)])
    if sampled:
        q_prob = truncated_probs(drafter[None].to(dtype), params.rows(1))[0].contiguous().clone()
        q_idx = torch.arange(vocab).expand(width, vocab).contiguous()       # the dense layout: idx = token
        u = torch.rand(width, generator=gen, dtype=torch.float64)
        draft = inverse_cdf(q_prob, u)
        if rng.random() < 0.15:                                           # a zero in Q at a drafted token
            i = rng.randrange(width)
            q_prob[i][q_idx[i] == draft[i]] = 0.0
        if rng.random() < 0.1:                                            # a draft token outside Q's support
            draft[rng.randrange(width)] = rng.randrange(vocab)
    else:
        q_idx = torch.zeros(width, 1, dtype=torch.int64)
        q_prob = torch.zeros(width, 1, dtype=dtype)
        draft = drafter.argmax(-1)
        if rng.random() < 0.5:
            draft = torch.randint(0, vocab, (width,), generator=gen)

    # verifier rows: agree with the draft on a leading run of random length, then anything
    rows = _rows(schedule, step, width, rng)
    prompt_len = (rows - (block if schedule != "ar" else 0)) if step == "prefill" else 0
    logits = torch.randn(rows, vocab, generator=gen) * scale
    if rng.random() < 0.2:
        logits = (logits * 2).round() / 2
    verifies = step != "prefill" and (schedule, step) != ("linear", 0) and schedule != "ar"
    if verifies:
        agree = rng.choice([0, width, rng.randint(0, width)])
        for i in range(agree):
            if sampled:
                logits[i] = drafter[i]                                    # p_i == Q_i: accepted
            else:
                logits[i, draft[i]] = logits[i].max() + 1.0               # argmax == d_i
        if rng.random() < 0.2:
            logits[0, draft[0]] = float("-inf")                           # p_1(d_1) = 0: rejected at once
    for i in range(rows):
        if rng.random() < 0.1:                                            # one-hot target
            hot = rng.randrange(vocab)
            logits[i] = -1e4
            logits[i, hot] = 0.0

    # stop ids (maybe a draft token, so that a stop lands inside the accepted run) and the length cap
    stop = rng.sample(range(vocab), rng.randint(0, min(3, vocab)))
    if rng.random() < 0.3 and width > 1:
        stop.append(int(draft[rng.randrange(width)]))
    max_new = rng.randint(1, 40)
    n_out = rng.choice([0, rng.randint(0, max_new - 1), max(0, max_new - rng.randint(1, 3))])
    st = DecodeState.new(width, support, max_new, sorted(set(stop)), rng.getrandbits(63), "cpu",
                         q_dtype=torch.promote_types(dtype, torch.float32), params=params)
    st.draft.copy_(draft)
    st.draft_len.fill_(draft_len)
    st.q_idx.copy_(q_idx)
    st.q_prob.copy_(q_prob)
    st.out.copy_(torch.randint(0, vocab, st.out.shape, generator=gen))
    st.n_out.fill_(n_out)
    st.cache_len.fill_(rng.randint(0, 60))
    st.last.fill_(rng.randrange(vocab))
    st.offset.fill_(rng.getrandbits(rng.choice([8, 40, 62])))
    st.nfe.fill_(rng.randint(0, 9))
    st.n_verify.fill_(rng.randint(0, 9))
    st.n_accepted.fill_(rng.randint(0, 9))
    st.done.fill_(rng.random() < 0.1)
    st.n_bonus.fill_(rng.randint(0, 9))
    return Case(schedule, step, width, vocab, params, st, logits.to(dtype), prompt_len)


def _rows(schedule, step, width, rng) -> int:
    b = width + 1
    if step == "prefill":
        return rng.randint(1, 6) + (b if schedule != "ar" else 0)
    return {"ar": 1, "linear": b, "packed": 2 * b, "quadratic": b * (b + 1)}[schedule]


# -- the first emitted token's distribution ---------------------------------------------------------------
def g_test(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of observed counts against probabilities (cells expected < 5 times pooled)."""
    if (counts[probs == 0] > 0).any():
        return 0.0                                    # an impossible outcome was observed
    n = counts.sum().item()
    expected = probs.double() * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].sum().double()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    g = 2 * sum(o * math.log(o / e) for o, e in zip(obs.tolist(), exp.tolist()) if o > 0)
    return float(chi2.sf(g, max(1, len(obs) - 1)))


def sparse_rows(prob: torch.Tensor, support: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distributions prob [..., V] in the sparse layout, built by hand: (idx, prob) [..., support], the `support`
    most probable tokens sorted by decreasing probability (all of the mass when top-k keeps `support` tokens)."""
    top, idx = prob.sort(dim=-1, descending=True, stable=True)
    return idx[..., :support].contiguous(), top[..., :support].contiguous()


def emitted_counts(device, params: SamplingParams, trials: int = 12000, width: int = 3, vocab: int = 6,
                   sparse: bool = False):
    """Histograms [W + 1, V] of the token emitted at each position of one verification, where it is emitted (A
    above the position), drafts drawn from the stored Q; also the targets p [W + 1, V] and the Q rows [W, V].
    The verifier rows are the schedules' (Epilogue.rows with the request's settings: dense), or with `sparse`
    built by hand in the sparse layout (K = top_k entries sorted by decreasing probability), the stored Q too.

    The target rows do not depend on the drafts before them, so the token at position i, wherever it is
    emitted, follows p_i: an accepted draft or a correction for i < W, the bonus for i = W. Targets near
    the drafter's rows make full acceptance (the bonus) frequent; the bonus row is unrelated to them."""
    gen = torch.Generator().manual_seed(11)
    drafter = torch.randn(width, vocab, generator=gen) * 1.5
    target = torch.cat([drafter + 0.6 * torch.randn(width, vocab, generator=gen),
                        torch.randn(1, vocab, generator=gen) * 1.5])
    p = truncated_probs(target[None], params.rows(1))[0]
    q = truncated_probs(drafter[None], params.rows(1))[0]
    ep = NativeEpilogue(device, width, sampled=True)
    if sparse:
        support = params.top_k
        q_idx, q_prob = sparse_rows(q, support)
        idx, prob = sparse_rows(p, support)
        rows = Rows(idx=idx[None].to(device), prob=prob[None].to(device), vocab=vocab)
    else:
        support = vocab
        q_idx, q_prob = torch.arange(vocab).expand(width, vocab), q
        rows = ep.rows(target[None].to(device), params.rows(1, device))
        assert rows.idx is None                                       # sampled rows are dense
    st = DecodeState.new(width, support, 10, [], 5, device, q_dtype=q_prob.dtype, params=params)
    st.q_idx.copy_(q_idx)
    st.q_prob.copy_(q_prob)
    st.draft_len.fill_(width)
    drafts = torch.stack([torch.multinomial(q[i], trials, replacement=True, generator=gen) for i in range(width)], 1)
    drafts = drafts.to(device)
    emitted = torch.empty(trials, width + 3, dtype=torch.int64, device=device)   # res: tokens, A, shift
    for t in range(trials):
        st.draft.copy_(drafts[t])
        st.offset.fill_(t)
        emitted[t] = ep.verify(st, rows).draws[0]    # phase 1 only: the state is left as it was
    emitted = emitted.cpu()
    counts = torch.zeros(width + 1, vocab, dtype=torch.int64)
    for i in range(width + 1):
        counts[i] = torch.bincount(emitted[emitted[:, width + 1] > i, i], minlength=vocab)
    return counts, p, q


def check_emitted_tokens_follow_p(device, params: SamplingParams, sparse: bool = False) -> None:
    """Accepted drafts, corrections and the bonus: the token at each position, where emitted, follows its p;
    the bonus position is reached in at least 30% of the trials, and the same test tells p from Q and from the
    residual max(p - Q, 0) at the first position and at the bonus (power against a draw from the wrong one).
    `sparse`: rows and Q in the sparse layout (emitted_counts)."""
    counts, p, q = emitted_counts(device, params, sparse=sparse)
    width = q.shape[0]
    for i in range(width + 1):
        assert g_test(counts[i], p[i]) > 1e-4, i
    reached = counts.sum(-1)
    print(f"bonus emitted in {reached[width] / reached[0]:.0%} of the trials")
    assert reached[width] >= 0.3 * reached[0]
    for i, q_i in ((0, q[0]), (width, q[width - 1])):
        residual = (p[i] - q_i).clamp(min=0)
        assert g_test(counts[i], q_i) < 1e-6 and g_test(counts[i], residual / residual.sum()) < 1e-6, i
