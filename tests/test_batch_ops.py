"""The decode step is batch-major: the work outside the model does not grow with the batch.

Every aten op an iteration dispatches outside the model's forward (input building, the epilogue, the status
table) is counted at batch 1 and batch 16 (TorchDispatchMode), for every schedule, greedy and sampled, with
both epilogues. A step written per request (a Python loop over the slots) costs ~16x at batch 16; a batched
one the same number of ops, whatever the batch. The bound is 1.2x.
"""
import pytest
from torch.utils._python_dispatch import TorchDispatchMode

import packed_ss
from packed_ss.decode.sampling import SamplingParams
from packed_ss.runtime import loop
from packed_ss.runtime.batch import Batch

PROMPT = [3, 17, 42, 8, 9]
BOUND = 1.2


class OpCounter(TorchDispatchMode):
    """Counts aten ops dispatched while counting is not paused."""

    def __init__(self):
        super().__init__()
        self.ops, self.paused = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not self.paused
        return func(*args, **(kwargs or {}))


def ops_per_iteration(engine, batch: int, monkeypatch, **kwargs) -> float:
    """Mean aten ops per decode iteration outside the model forward, `batch` requests decoding together."""
    counter, iterations = OpCounter(), [0]
    iterate, forward = Batch.iterate, loop.Runtime.forward

    def counted_iterate(self, first, shape=0):
        iterations[0] += 1
        with counter:
            iterate(self, first, shape)

    def uncounted_forward(self, inp, cache):
        counter.paused = True
        try:
            return forward(self, inp, cache)
        finally:
            counter.paused = False
    with monkeypatch.context() as m:
        m.setattr(Batch, "iterate", counted_iterate)
        m.setattr(loop.Runtime, "forward", uncounted_forward)
        engine.generate_batch([PROMPT] * batch, max_new_tokens=24, eos_token_id=[], **kwargs)
    return counter.ops / iterations[0]


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model()


SAMPLING = [dict(), dict(temperature=1.0, seed=1), dict(temperature=0.8, top_k=20, seed=2)]


@pytest.mark.parametrize("epilogue", ["torch", "native"])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "T1", "top-k"])
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_ops_outside_the_model_do_not_grow_with_the_batch(model, monkeypatch, schedule, sampling, epilogue):
    if epilogue == "native" and not packed_ss.decode.epilogue.native_available("cpu"):
        pytest.skip("the native epilogue is not built")
    engine = packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue)
    one = ops_per_iteration(engine, 1, monkeypatch, **sampling)
    many = ops_per_iteration(engine, 16, monkeypatch, **sampling)
    print(f"{schedule} {epilogue} {sampling}: {one:.1f} ops per iteration at batch 1, {many:.1f} at batch 16")
    assert one > 0
    assert many <= BOUND * one, (one, many)


def test_the_count_sees_a_per_request_step(model, monkeypatch):
    """Power: the same count on a step that updates its requests one by one grows with the batch."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, epilogue="torch")
    one = ops_per_iteration(engine, 1, monkeypatch)
    program = engine.program(SamplingParams())
    step = program.steps[0]
    update = step.update

    def per_request(st, logits):
        for b in range(st.batch):
            update(st.slot(b), logits[b:b + 1])
    monkeypatch.setattr(step, "update", per_request)
    many = ops_per_iteration(engine, 16, monkeypatch)
    assert many > 8 * one, (one, many)


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_prompts_admitted_together_prefill_in_one_call(model, monkeypatch, schedule):
    """16 prompts of 16 lengths admitted together: one model call prefills them all (with one new token each,
    nothing else runs), and every request gets its tokens alone. The call returns the logits of the rows the
    prefill reads alone: each prompt's last row and its W + 1 mask rows (none for AR)."""
    engine = packed_ss.Engine(model, schedule=schedule, width=3)
    prompts = [(PROMPT * 4)[:3 + i] for i in range(16)]
    alone = [engine.generate(p, max_new_tokens=1, eos_token_id=[]).tokens for p in prompts]
    calls, forward = [], loop.Runtime.forward

    def counted(self, inp, cache):
        logits = forward(self, inp, cache)
        calls.append((tuple(inp.tokens.shape), tuple(logits.shape[:2])))
        return logits
    monkeypatch.setattr(loop.Runtime, "forward", counted)
    got = [r.tokens for r in engine.generate_batch(prompts, max_new_tokens=1, eos_token_id=[])]
    assert got == alone
    read = 1 if schedule == "ar" else 1 + 4
    assert len(calls) == 1 and calls[0][0][0] == 16 and calls[0][1] == (16, read), calls
