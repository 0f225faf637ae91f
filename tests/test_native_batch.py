"""The compiled epilogue on a batch: ONE call on a B-request state does, request for request, exactly what B
calls on batch-of-one states do (csrc/epilogue.h `at()`, native.py's per-request row strides).

Random seeded cases cover greedy, sampled dense and sampled sparse (top-k) rows in float32 and float64, every
verify mode through the Epilogue API (draft verification, one AR token, a drafting call, verification without
retain, verify + commit, verify with a per-request residual index), rows given as slices along dim 1 of a bigger
[B, R_total, ...] tensor, finished requests, stop ids inside the accepted run and the length cap. The per-request
side runs on clones of each request's rows or on views into one state (a view is a valid batch of one).
"""
from __future__ import annotations

import random
from dataclasses import fields

import pytest
import torch

from packed_ss.decode.epilogue import NativeEpilogue, Rows, native_available, native_unavailable_reason
from packed_ss.decode.sampling import SamplingParams
from packed_ss.decode.state import DecodeState

pytestmark = pytest.mark.skipif(not native_available("cpu"), reason=native_unavailable_reason("cpu") or "")

FIELDS = [f.name for f in fields(DecodeState)]
OPS = ["draft", "token", "none", "verify_only", "split", "residual"]
MODES = ["greedy", "dense", "sparse"]


def _dist(gen, n_rows, vocab, k, dtype, sparse):
    """n_rows truncated distributions: (idx [n, k] sorted by decreasing prob, or None when dense; prob [n, k])."""
    w = torch.rand(n_rows, vocab, generator=gen, dtype=torch.float64) ** 3
    w[torch.rand(n_rows, vocab, generator=gen) < 0.2] = 0.0                      # zeros in the support
    hot = torch.rand(n_rows, generator=gen) < 0.1                               # one-hot rows
    w[hot] = 0.0
    w[hot, torch.randint(0, vocab, (int(hot.sum()),), generator=gen)] = 1.0
    w[w.sum(-1) == 0, 0] = 1.0
    if not sparse:
        return None, (w / w.sum(-1, keepdim=True)).to(dtype)
    prob, idx = w.sort(dim=-1, descending=True, stable=True)
    idx, prob = idx[:, :k].contiguous(), prob[:, :k]
    prob[prob.sum(-1) == 0, 0] = 1.0
    return idx, (prob / prob.sum(-1, keepdim=True)).to(dtype)


def make_case(seed: int, batch: int):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    mode = MODES[seed % 3]
    dtype = rng.choice([torch.float32, torch.float64])
    width, vocab = rng.randint(1, 5), rng.choice([5, 11, 32])
    block = width + 1
    sparse, greedy = mode == "sparse", mode == "greedy"
    k = 1 if greedy else (vocab if mode == "dense" else rng.randint(1, min(6, vocab)))
    params = SamplingParams() if greedy else (SamplingParams(1.0) if mode == "dense" else SamplingParams(1.0, top_k=k))
    cap, n_stop = 20, rng.randint(0, 3)
    out_len = cap + 2 * block + rng.randint(0, 3)

    f = {}
    if greedy:
        f["q_idx"] = torch.zeros(batch, width, 1, dtype=torch.int64)
        f["q_prob"] = torch.zeros(batch, width, 1, dtype=dtype)
        f["draft"] = torch.randint(0, vocab, (batch, width), generator=gen)
    else:
        q_idx, q_prob = _dist(gen, batch * width, vocab, k, dtype, sparse)
        f["q_prob"] = q_prob.view(batch, width, k).contiguous()
        f["q_idx"] = (q_idx.view(batch, width, k).contiguous() if sparse
                      else torch.randint(0, vocab, (batch, width, k), generator=gen))   # not read when dense
        pick = torch.multinomial(f["q_prob"].view(-1, k), 1, generator=gen).view(batch, width)
        f["draft"] = f["q_idx"].gather(2, pick[..., None])[..., 0] if sparse else pick
        off_support = torch.rand(batch, width, generator=gen) < 0.1
        f["draft"] = torch.where(off_support, torch.randint(0, vocab, (batch, width), generator=gen), f["draft"])
    f["draft_len"] = torch.tensor([rng.choice([width, width, rng.randint(0, width)]) for _ in range(batch)])
    f["max_new"] = torch.tensor([rng.randint(1, cap) for _ in range(batch)])
    f["n_out"] = torch.tensor([rng.choice([0, rng.randint(0, m - 1), max(0, m - rng.randint(1, 3))])
                               for m in f["max_new"].tolist()])
    f["done"] = torch.rand(batch, generator=gen) < 0.2
    f["out"] = torch.randint(0, vocab, (batch, out_len), generator=gen)
    stop = torch.full((batch, n_stop), -1, dtype=torch.int64)
    for b in range(batch):
        for j in range(n_stop):
            r = rng.random()
            stop[b, j] = int(f["draft"][b, rng.randrange(width)]) if r < 0.4 else (rng.randrange(vocab) if r < 0.8 else -1)
    f["stop_ids"] = stop
    f["stop_seqs"] = torch.zeros(batch, 0, 0, dtype=torch.int64)    # multi-token stops are torch code, not native
    for name, hi in (("cache_len", 60), ("last", vocab), ("nfe", 9), ("n_verify", 9), ("n_accepted", 9), ("n_bonus", 9)):
        f[name] = torch.randint(0, hi, (batch,), generator=gen)
    f["seed"] = torch.randint(0, 2**62, (batch,), generator=gen)
    f["offset"] = torch.randint(0, 2 ** rng.choice([8, 40, 62]), (batch,), generator=gen)
    f["prompt_len"] = torch.randint(1, 30, (batch,), generator=gen)     # not read by the epilogue
    f["accepted_at"] = torch.randint(0, 9, (batch, width), generator=gen)   # kept by Step.fold, not the epilogue
    f["context"] = torch.randint(-1, vocab, (batch, 4), generator=gen)      # read by the lookup drafter only
    f.update(params.rows(batch)._asdict())          # the requests' sampling (temperature, top_k, top_p)
    assert set(f) == set(FIELDS)
    return SimpleCase(mode, dtype, width, vocab, k, params, f, rng, gen)


class SimpleCase:
    def __init__(self, mode, dtype, width, vocab, k, params, fields_, rng, gen):
        self.mode, self.dtype, self.width, self.vocab, self.k, self.params = mode, dtype, width, vocab, k, params
        self.fields, self.rng, self.gen = fields_, rng, gen
        self.block = width + 1
        self.batch = fields_["done"].shape[0]

    def rows(self, st_fields, n_z: int):
        """(verify, token, propose) Rows: slices along dim 1 of ONE bigger [B, R_total(, K)] tensor, the
        verifier rows agreeing with the current draft on a leading run of random length."""
        rng, gen, b, block = self.rng, self.gen, self.batch, self.block
        lead = rng.randint(0, 2)                     # rows before the verifier's
        r_total = lead + block + 1 + n_z + rng.randint(0, 2)
        z0 = lead + block + 1
        agree = [rng.choice([0, self.width, rng.randint(0, self.width)]) for _ in range(b)]
        if self.mode == "greedy":
            arg = torch.randint(0, self.vocab, (b, r_total), generator=gen)
            for i in range(b):
                arg[i, lead:lead + agree[i]] = st_fields["draft"][i, :agree[i]]
            cut = lambda lo, hi: Rows(arg=arg[:, lo:hi], vocab=self.vocab)   # noqa: E731
        else:
            sparse = self.mode == "sparse"
            idx, prob = _dist(gen, b * r_total, self.vocab, self.k, self.dtype, sparse)
            prob = prob.view(b, r_total, self.k).contiguous()
            idx = None if idx is None else idx.view(b, r_total, self.k).contiguous()
            for i in range(b):                       # p == Q on the leading rows: accepted
                prob[i, lead:lead + agree[i]] = st_fields["q_prob"][i, :agree[i]].to(self.dtype)
                if sparse:
                    idx[i, lead:lead + agree[i]] = st_fields["q_idx"][i, :agree[i]]
            cut = lambda lo, hi: Rows(idx=None if idx is None else idx[:, lo:hi], prob=prob[:, lo:hi],  # noqa: E731
                                      vocab=self.vocab)
        return cut(lead, lead + block), cut(lead, lead + 1), cut(z0, z0 + n_z)


def one(rows: Rows | None, b: int) -> Rows | None:
    """Request b's rows as a batch of one (views)."""
    if rows is None:
        return None
    pick = lambda t: None if t is None else t[b:b + 1]   # noqa: E731
    return Rows(arg=pick(rows.arg), idx=pick(rows.idx), prob=pick(rows.prob), vocab=rows.vocab)


def apply(ep, st, op, v, t, z, residual, block):
    """One epilogue operation; returns (emitted [B, block], n_accept [B]) of a verify() call or None, and the
    retain shifts res[:, block + 1] every commit leaves."""
    verified = None
    if op == "draft":
        ep.step(st, verify=v, propose=z, retain="a")
    elif op == "token":
        ep.step(st, token=t, propose=z, retain="a")
    elif op == "none":
        ep.step(st, propose=z, retain=0)
    elif op == "verify_only":
        ep.step(st, verify=v)
    elif op == "split":
        outcome = ep.verify(st, v)
        verified = (outcome.emitted.clone(), outcome.n_accept.clone())
        ep.commit(st, outcome, propose=z, retain=1)
    elif op == "residual":
        outcome = ep.verify(st, v, residual=residual)
        verified = (outcome.emitted.clone(), outcome.n_accept.clone())
        ep.commit(st, outcome, propose=z, retain="a")
    else:
        raise AssertionError(op)
    return verified, ep.res[:, block + 1].clone()


def compare(case: SimpleCase, ops, views: bool, ep_batch: NativeEpilogue, ep_one: NativeEpilogue):
    b = case.batch
    batched = DecodeState(**{k: v.clone() for k, v in case.fields.items()})
    if views:      # the requests as views of one state: what the calls do to them, they do to `whole`
        whole = DecodeState(**{k: v.clone() for k, v in case.fields.items()})
        singles = [DecodeState(**{k: v[i:i + 1] for k, v in whole.tensors().items()}) for i in range(b)]
    else:
        singles = [DecodeState(**{k: v[i:i + 1].clone() for k, v in case.fields.items()}) for i in range(b)]
    for step, op in enumerate(ops):
        n_z = case.rng.randint(1, case.block + 1)
        v, t, z = case.rows(batched.tensors(), n_z)
        residual = torch.randint(0, case.width + 1, (b,), generator=case.gen)
        # an empty draft's verification is an AR step, which draws without the workspace (unless a residual is named)
        empty = (batched.draft_len.clamp(max=len(v) - 1) == 0) & (op != "residual")
        got, got_shift = apply(ep_batch, batched, op, v, t, z, residual, case.block)
        # the [B, vocab] workspace: row i is request i's (only visible here; on the CPU a shared one would do)
        drawn = case.mode != "greedy" and op not in ("token", "none")
        scratch = ep_batch._scratch_for(case.dtype, case.vocab, b).clone() if drawn else None
        for i in range(b):
            want, want_shift = apply(ep_one, singles[i], op, one(v, i), one(t, i), one(z, i), residual[i:i + 1],
                                     case.block)
            if drawn and not empty[i]:
                assert torch.equal(scratch[i], ep_one._scratch_for(case.dtype, case.vocab, 1)[0])
            where = f"{case.mode} {case.dtype} W={case.width} V={case.vocab} K={case.k} B={b} op {step} {op} request {i}"
            assert torch.equal(got_shift[i:i + 1], want_shift), f"{where}: retain shift"
            if want is not None:
                assert torch.equal(got[0][i:i + 1], want[0]), f"{where}: emitted"
                assert torch.equal(got[1][i:i + 1], want[1]), f"{where}: n_accept"
            for name in FIELDS:
                if name == "q_idx" and case.mode == "dense":
                    continue                 # not maintained by native code for dense Q
                assert torch.equal(batched.tensors()[name][i:i + 1], singles[i].tensors()[name]), f"{where}: {name}"


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_one_batched_call_equals_per_request_calls(batch):
    eps = {}
    n_cases = {1: 150, 3: 400, 8: 400}[batch]
    seen = set()
    for seed in range(n_cases):
        case = make_case(1000 * batch + seed, batch)
        key = (case.width, case.mode, case.params)
        if key not in eps:     # one epilogue object per configuration: its caches see every batch size
            eps[key] = NativeEpilogue("cpu", case.width, not case.params.greedy)
        ep = eps[key]
        ops = [OPS[seed % len(OPS)]] + case.rng.sample(OPS, case.rng.randint(0, 2))
        compare(case, ops, views=seed % 2 == 1, ep_batch=ep, ep_one=ep)
        seen.update((case.mode, case.dtype, op) for op in ops)
    if batch > 1:   # every mode with every op, and both dtypes of the sampled modes, were exercised
        assert {(m, op) for m in MODES for op in OPS} <= {(m, op) for m, _, op in seen}
        assert {(m, d) for m in MODES[1:] for d in (torch.float32, torch.float64)} <= {(m, d) for m, d, _ in seen}


def test_requests_differ():
    """The batched call must not just repeat request 0: a case where the requests' outcomes differ."""
    case = make_case(7, 8)
    ep = NativeEpilogue("cpu", case.width, not case.params.greedy)
    st = DecodeState(**{k: v.clone() for k, v in case.fields.items()})
    v, _, z = case.rows(st.tensors(), case.block)
    ep.step(st, verify=v, propose=z, retain="a")
    assert len(set(map(tuple, st.out.tolist()))) > 1 and len(set(st.draft_len.tolist() + st.n_out.tolist())) > 1


def test_layouts_and_shapes_are_checked():
    case = make_case(2, 3)      # sampled sparse
    assert case.mode == "sparse"
    ep = NativeEpilogue("cpu", case.width, not case.params.greedy)
    st = DecodeState(**{k: v.clone() for k, v in case.fields.items()})
    v, _, z = case.rows(st.tensors(), 2)
    n = v.prob.shape[1]
    bad = Rows(idx=v.idx.contiguous(), prob=torch.cat([v.prob, v.prob], 1)[:, :n], vocab=v.vocab)
    with pytest.raises(ValueError, match="laid out differently"):     # one stride for idx and prob
        ep.step(st, verify=bad)
    bad = Rows(idx=v.idx.transpose(0, 1).contiguous().transpose(0, 1), prob=v.prob, vocab=v.vocab)
    with pytest.raises(ValueError, match="contiguous within a request"):
        ep.step(st, verify=bad)
    strided = Rows(idx=torch.cat([v.idx, v.idx], 1)[:, ::2], prob=torch.cat([v.prob, v.prob], 1)[:, ::2], vocab=v.vocab)
    with pytest.raises(ValueError, match="contiguous within a request"):
        ep.step(st, verify=strided)
    with pytest.raises(ValueError, match="B=3"):
        ep.step(st, verify=one(v, 0))
    with pytest.raises(ValueError, match="residual"):
        ep.verify(st, v, residual=torch.zeros((), dtype=torch.int64))
    with pytest.raises(ValueError, match="rows needed"):       # fewer than W + 1 rows verify within them; none
        ep.step(st, verify=v[:0])
    flat = DecodeState(**{k: (t[0] if t.dim() > 1 else t) for k, t in st.tensors().items()})
    with pytest.raises(ValueError, match="dimensions"):
        ep.step(flat, verify=one(v, 0))
