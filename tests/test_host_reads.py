"""The decode loop reads the device at most once per model call (issue: host reads per call).

tests/host_reads.py counts host reads (Tensor.item / tolist / bool / int / float / index / cpu / numpy and
data-dependent aten ops such as nonzero and boolean-mask indexing); the first half of this file checks
that counter, the second half counts the reads of one `generate` for every schedule and width class of
both shipped models, greedy and sampled, torch and native epilogue, and asserts

    reads <= res.nfe + SETUP_FINISH

i.e. at most one read per model call beyond a small constant for setup and finish.
"""
from __future__ import annotations

import threading

import pytest
import torch
from host_reads import METHODS, count_host_reads, paused

import packed_ss
from packed_ss.decode.epilogue import native_available

# ---------------------------------------------------------------------------------------------------
# The counter itself
# ---------------------------------------------------------------------------------------------------


def _x():
    return torch.arange(6.0)


# One logical read each, and the kind it is counted as.
ONE_READ = {
    "item": (lambda x: x[1].item(), "item"),
    "tolist": (lambda x: x.tolist(), "tolist"),
    "bool": (lambda x: bool(x[1]), "__bool__"),
    "if": (lambda x: 1 if x[1] > 0 else 0, "__bool__"),
    "int": (lambda x: int(x[1]), "__int__"),
    "float": (lambda x: float(x[1]), "__float__"),
    "index": (lambda x: [0, 1, 2, 3][x[2].long()], "__index__"),
    "cpu": (lambda x: x.cpu(), "cpu"),
    "numpy": (lambda x: x.numpy(), "numpy"),
    "repr": (lambda x: repr(x), "__repr__"),
    "format": (lambda x: f"{x[1]:.2f}", "__format__"),
    "contains": (lambda x: 3.0 in x, "item"),
    "nonzero": (lambda x: x.nonzero(), "aten.nonzero"),
    "where(cond)": (lambda x: torch.where(x > 2), "aten.nonzero"),
    "argwhere": (lambda x: torch.argwhere(x), "aten.nonzero"),
    "masked_select": (lambda x: x.masked_select(x > 2), "aten.masked_select"),
    "bool index": (lambda x: x[x > 2], "aten.index[bool]"),
    "bool index put": (lambda x: x.clone().__setitem__(x > 2, x[:3]), "aten.index_put_[bool]"),
    "unique": (lambda x: torch.unique(x), "aten._unique2"),
    "unique_consecutive": (lambda x: torch.unique_consecutive(x), "aten.unique_consecutive"),
    "equal": (lambda x: torch.equal(x, x), "aten.equal"),
    "allclose": (lambda x: torch.allclose(x, x), "aten.allclose"),
    "is_nonzero": (lambda x: torch.is_nonzero(x[1]), "aten._local_scalar_dense"),
    "arange(tensor)": (lambda x: torch.arange(x[3].long()), "aten._local_scalar_dense"),
    "repeat_interleave": (lambda x: torch.repeat_interleave(x[:3].long()), "aten.repeat_interleave"),
    "bincount": (lambda x: torch.bincount(x.long()), "aten.bincount"),
}

# Tensor math that stays on the device: no reads.
NO_READ = {
    "arithmetic": lambda x: (x * 2 + 1).softmax(-1).argmax(-1),
    "matmul": lambda x: x[:, None] @ x[None, :],
    "where(c, a, b)": lambda x: torch.where(x > 2, x, -x),
    "int index": lambda x: x[torch.tensor([0, 2])],
    "index_select / gather": lambda x: x.index_select(0, torch.tensor([1])) + x.gather(0, torch.tensor([2])),
    "topk / sort / cumsum": lambda x: (x.topk(2).values, x.sort().values, x.cumsum(0)),
    "masked_fill / t[mask] = 0.": lambda x: (x.masked_fill(x > 2, 0), x.clone().__setitem__(x > 2, 0.0)),
    "any / all (tensor)": lambda x: ((x > 2).any(), (x > 2).all()),
    "copy_ / clone / new tensor": lambda x: (torch.empty(6).copy_(x), x.clone(), torch.tensor([1, 2, 3])),
    "shape and dtype": lambda x: (x.shape[0], x.numel(), x.dtype, x.device, len(x)),
    "multinomial": lambda x: torch.multinomial(x.softmax(-1), 1),
}

GRAD_MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("name", ONE_READ)
def test_each_kind_of_read_counts_once(name, grad_mode):
    fn, kind = ONE_READ[name]
    with GRAD_MODES[grad_mode]():   # the engine decodes under inference_mode: composite ops arrive whole
        x = _x()
        with count_host_reads() as reads:
            fn(x)
    assert reads.reads == 1 and reads.by_kind == {kind: 1}, reads.summary()
    (event,) = reads.events
    assert event.kind == kind and "test_host_reads.py:" in event.site, event


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("name", NO_READ)
def test_tensor_math_reads_nothing(name, grad_mode):
    with GRAD_MODES[grad_mode]():
        x = _x()
        with count_host_reads() as reads:
            NO_READ[name](x)
    assert reads.reads == 0, reads.summary()


@pytest.mark.parametrize("n", [0, 1, 7])
def test_a_read_in_a_loop_counts_every_time(n):
    def broken(t):
        total = 0.0
        for _ in range(n):
            t = t + 1
            total += t.sum().item()
        return total

    with torch.inference_mode(), count_host_reads() as reads:
        broken(_x())
    assert reads.reads == n and reads.by_kind == ({"item": n} if n else {}), reads.summary()
    if n:
        assert reads.by_site.most_common(1)[0][0][1].endswith("in broken")


def test_only_reads_inside_the_block_count():
    x = _x()
    x.tolist()
    with count_host_reads() as reads:
        x.tolist()
        with paused():
            x.tolist(), bool(x[0])
        worker = threading.Thread(target=lambda: x.tolist())   # another thread's reads are not ours
        worker.start()
        worker.join()
    x.tolist()
    assert reads.reads == 1, reads.summary()


def test_methods_restored_even_on_error():
    before = {name: torch.Tensor.__dict__.get(name) for name in METHODS}
    with pytest.raises(ZeroDivisionError):
        with count_host_reads():
            assert getattr(torch.Tensor.item, "__host_read_wrapper__", False)
            1 / 0
    assert {name: torch.Tensor.__dict__.get(name) for name in METHODS} == before
    assert not hasattr(torch.Tensor.item, "__host_read_wrapper__")
    with torch.inference_mode(), count_host_reads() as reads:
        _x().nonzero()
    _x().nonzero(), _x()[1].item()   # the mode is gone too
    assert reads.reads == 1


def test_nested_blocks_count_in_the_inner_one():
    x = _x()
    with count_host_reads() as outer:
        x.tolist()
        with count_host_reads() as inner:
            x.tolist(), int(x[0])
        x.tolist()
    assert (outer.reads, inner.reads) == (2, 2)


# ---------------------------------------------------------------------------------------------------
# The decode loop: at most one read per model call, beyond a small constant
# ---------------------------------------------------------------------------------------------------

MAX_NEW = 48
# Setup and finish may read a few times outside the per-call budget. The runtime reads one status row per
# iteration, the prefill's included (one iteration per call, or per two calls for Linear-SS), so the
# constant is for reads that happen once per generate: the final counts and output (one read), and for
# any-order models the trace (two: its length, then its rows). Nothing here grows with the output length:
# one extra read per call adds ~nfe reads (26..50 in these cases) and fails.
SETUP_FINISH = 3
GREEDY = {"temperature": 0.0}
SAMPLED = {"temperature": 1.0, "top_k": 50, "seed": 0}
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def ltr():
    return packed_ss.load_model(), packed_ss.load_tokenizer().encode(PROMPT).ids


@pytest.fixture(scope="module")
def any_order():
    path = packed_ss.default_model_path("any-order")
    return packed_ss.load_model(path), packed_ss.load_tokenizer(path).encode(PROMPT).ids


def measure(model, prompt, engine_kwargs, gen_kwargs):
    """Warm up one generate outside the counter (caches, lazy initialisation), then count one."""
    engine = packed_ss.Engine(model, **engine_kwargs)
    kwargs = {"max_new_tokens": MAX_NEW, "eos_token_id": [], **gen_kwargs}
    engine.generate(prompt, **kwargs)
    with count_host_reads() as reads:
        res = engine.generate(prompt, **kwargs)
    assert len(res.tokens) == MAX_NEW
    return reads, res


def _check(case, reads, res):
    bound = res.nfe + SETUP_FINISH
    assert reads.reads <= bound, (
        f"{case}: {reads.reads} host reads for {res.nfe} model calls ({reads.reads / res.nfe:.2f} per call), "
        f"more than nfe + {SETUP_FINISH} = {bound}\n{reads.summary()}")


def _ltr_cases():
    for schedule in ("ar", "linear", "quadratic", "packed"):
        for width in ((1,) if schedule == "ar" else (1, 8)):
            for sampling in ("greedy", "sampled"):
                for epilogue in ("torch", "native"):
                    yield pytest.param(schedule, width, sampling, epilogue,
                                       id=f"{schedule}-W{width}-{sampling}-{epilogue}")


def _any_order_cases():
    for schedule, order, sampling in (
            [(s, o, "greedy") for s in ("packed", "linear", "quadratic") for o in ("ltr", "confidence")]
            + [(s, "ltr", "sampled") for s in ("packed", "linear", "quadratic")]
            + [("threshold", None, "greedy"), ("ar", None, "greedy"), ("ar", None, "sampled")]):
        for epilogue in ("torch", "native"):
            yield pytest.param(schedule, order, sampling, epilogue,
                               id=f"{schedule}-{order or 'na'}-{sampling}-{epilogue}")


SAMPLINGS = {"greedy": GREEDY, "sampled": SAMPLED}


@pytest.mark.parametrize("schedule, width, sampling, epilogue", list(_ltr_cases()))
def test_ltr_reads_at_most_once_per_call(ltr, schedule, width, sampling, epilogue):
    if epilogue == "native" and not native_available("cpu"):
        pytest.skip("the native epilogue is not built")
    model, prompt = ltr
    reads, res = measure(model, prompt, {"schedule": schedule, "width": width, "epilogue": epilogue},
                         SAMPLINGS[sampling])
    _check(f"left-to-right {schedule} W={width} {sampling} {epilogue}", reads, res)


@pytest.mark.parametrize("schedule, order, sampling, epilogue", list(_any_order_cases()))
def test_any_order_reads_at_most_once_per_call(any_order, schedule, order, sampling, epilogue):
    model, prompt = any_order
    engine_kwargs = {"schedule": schedule, "width": 1 if schedule == "ar" else 8, "epilogue": epilogue}
    if order is not None:
        engine_kwargs["order"] = order
    reads, res = measure(model, prompt, engine_kwargs, SAMPLINGS[sampling])
    _check(f"any-order {schedule} order={order} {sampling} {epilogue}", reads, res)


def _one_more_read_per_call(model, monkeypatch):
    """Wrap model.forward (called once per model call) so that every call also reads its logits once."""
    forward = model.forward

    def forward_and_read(*args, **kwargs):
        logits = forward(*args, **kwargs)
        logits.sum().item()
        return logits

    monkeypatch.setattr(model, "forward", forward_and_read)


@pytest.mark.parametrize("which", ["ltr", "any_order"])
def test_a_read_added_per_call_is_caught(which, request, monkeypatch):
    """The bound is tight enough to catch a regression: one more read per model call exceeds it."""
    model, prompt = request.getfixturevalue(which)
    engine_kwargs = {"schedule": "packed", "width": 8, "epilogue": "torch"}
    base, base_res = measure(model, prompt, engine_kwargs, GREEDY)
    _one_more_read_per_call(model, monkeypatch)
    reads, res = measure(model, prompt, engine_kwargs, GREEDY)
    assert (res.tokens, res.nfe) == (base_res.tokens, base_res.nfe)
    assert reads.reads == base.reads + res.nfe, f"{base.summary()}\n--- with a read per call ---\n{reads.summary()}"
    added = {site: n for (kind, site), n in reads.by_site.items() if site.endswith("in forward_and_read")}
    assert list(added.values()) == [res.nfe], reads.summary()
    assert reads.reads > res.nfe + SETUP_FINISH, reads.summary()


@pytest.mark.parametrize("which,engine_kwargs", [
    ("ltr", {"schedule": "packed"}), ("ltr", {"schedule": "linear"}),
    ("any_order", {"schedule": "packed", "order": "confidence"})], ids=["packed", "linear", "any-order"])
def test_stream_adds_no_read(which, engine_kwargs, request):
    """stream() yields each iteration's tokens from the same status row generate() polls: equal counts."""
    model, prompt = request.getfixturevalue(which)
    engine = packed_ss.Engine(model, width=8, **engine_kwargs)
    kwargs = {"max_new_tokens": MAX_NEW, "eos_token_id": []}
    generated, _ = measure(model, prompt, dict(engine_kwargs, width=8), {})
    with count_host_reads() as streamed:
        tokens = sum(engine.stream(prompt, **kwargs), [])
    assert tokens == engine.generate(prompt, **kwargs).tokens
    assert streamed.reads == generated.reads, f"{generated.summary()}\n--- stream ---\n{streamed.summary()}"
