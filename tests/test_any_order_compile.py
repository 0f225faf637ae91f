"""Any-order steps are fixed-shape and read nothing on the host: each one (input, model call, update)
compiles with torch.compile(fullgraph=True), which refuses host reads and data-dependent control flow,
and decodes exactly as eager; eagerly, a step runs with Tensor.item / tolist / bool / int / float /
nonzero patched to fail; a step after the stop changes nothing."""
from __future__ import annotations

import contextlib

import pytest
import torch
from tiny_models import checkpoint

from packed_ss import SamplingParams, host, load_model
from packed_ss.decode.registry import schedules
from packed_ss.decode.epilogue import TorchEpilogue
from packed_ss.model.attention import reference_attention
from packed_ss.runtime import Request, Runtime
from packed_ss.runtime.executor import Compiled

PROMPTS = [[5, 17, 33, 2, 8], [60, 3]]
GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=1.0, top_k=20)
CASES = [(s, o, GREEDY, "aot_eager") for s in ("packed", "linear", "quadratic") for o in ("ltr", "confidence")] + [
    ("threshold", "ltr", GREEDY, "aot_eager"), ("ar", "ltr", GREEDY, "aot_eager"), ("packed", "ltr", SAMPLED, "aot_eager"),
    ("linear", "ltr", SAMPLED, "aot_eager"), ("packed", "confidence", GREEDY, "inductor")]


@pytest.fixture(scope="module")
def model():
    return load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float64)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every schedule's steps share the driver's code objects: start each test with dynamo's cache empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _decode(runtime, program, prompt, stops, params):
    decoding = runtime.decode(program, [Request(prompt, 12, 1, [], stops, params)])
    while True:
        try:
            next(decoding)
        except StopIteration as end:
            out = end.value[0]
            return out.tokens, out.nfe, out.n_verify, out.n_accepted, out.iterations


@pytest.mark.parametrize("schedule,order,params,backend", CASES,
                         ids=[f"{s}-{o}-{'greedy' if p.greedy else 'sampled'}-{b}" for s, o, p, b in CASES])
def test_compiled_steps_equal_eager(model, schedule, order, params, backend):
    """Runtime modes "eager" and "compile" (each step: input, model call, update) give the same run."""
    sampled = not params.greedy
    program = schedules(any_order=True)[schedule](model, 3, sampled, TorchEpilogue(model.device, 3, sampled), order)
    eager = Runtime(model, reference_attention)
    compiled = Runtime(model, reference_attention, Compiled(backend))
    for prompt in PROMPTS[:1]:   # each new shape (cache, stop table) compiles again
        free = _decode(eager, program, prompt, [], params)[0]
        for stops in ([], [tuple(free[5:7]), (free[9],)]):
            assert _decode(eager, program, prompt, stops, params) == _decode(compiled, program, prompt, stops, params)


@contextlib.contextmanager
def no_host_reads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a decode step read a tensor on the host")
    with monkeypatch.context() as m:
        m.setattr(host, "reads_are_free", lambda t: False)    # the logits processing's and attention's device path
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero"):
            m.setattr(torch.Tensor, name, refuse)
        yield


@pytest.mark.parametrize("schedule", sorted(schedules(any_order=True)))
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_steps_read_nothing_and_freeze_after_done(model, monkeypatch, schedule, params):
    if not params.greedy and schedule == "threshold":
        pytest.skip("the threshold decoder is greedy")
    sampled = not params.greedy
    sched = schedules(any_order=True)[schedule](model, 3, sampled, TorchEpilogue(model.device, 3, sampled), "ltr")
    st = sched.new_state(Request(PROMPTS[0], 6, 0, [], [(7, 8)], params))
    cache = model.new_cache(64, batch=1)

    def run(step):
        step.update(st, model(*step.inputs(st)[:3], cache, step.inputs(st).cache_len, attend=reference_attention))
    with torch.inference_mode():
        run(sched.prefill(torch.tensor(PROMPTS[0])))
        for _ in range(6):
            with no_host_reads(monkeypatch):
                for step in sched.steps:
                    run(step)
        assert bool(st.done)
        before = {k: v.clone() for k, v in st.tensors().items()}
        for step in sched.steps:
            run(step)
        assert all(torch.equal(before[k].nan_to_num(), v.nan_to_num()) for k, v in st.tensors().items())


@pytest.mark.parametrize("schedule", ["packed", "linear", "quadratic", "threshold"])
def test_states_padded_to_the_graph_loops_shapes_decode_alike(model, schedule):
    """The CUDA-graph loop keeps one persistent state per program, made with fixed shapes (output length,
    stop table) and overwritten per request with copy_: requests of any prompt, length and stops get states
    of those shapes, and a padded state decodes exactly as a fresh one."""
    sched = schedules(any_order=True)[schedule](model, 3, False, TorchEpilogue(model.device, 3, False),
                                "confidence" if schedule != "threshold" else "ltr")
    shape = {"out_len": 64, "stop_slots": 8, "sequence_slots": (4, 8)}
    requests = [Request(PROMPTS[0], 12, 0, [9], [(7, 8)]), Request(PROMPTS[1], 20, 3, [], [(1, 2, 3), (4,)])]
    persistent = sched.new_state(Request([], 64, 0, [], []), **shape)
    for request in requests:
        runs = []
        for st in (sched.new_state(request), persistent.copy_(sched.new_state(request, **shape))):
            cache = model.new_cache(128, batch=1)

            def call(inp, cache=cache):
                return model(inp.tokens, inp.positions, inp.layout, cache, inp.cache_len, attend=reference_attention)
            with torch.inference_mode():
                prefill = sched.prefill(torch.tensor(request.prompt))
                prefill.update(st, call(prefill.inputs(st)))
                while not bool(st.done):
                    for step in sched.steps:
                        step.update(st, call(step.inputs(st)))
                    sched.resume(st, call)
            runs.append((st.out[0, :int(st.n_out)].tolist(), int(st.nfe), st.request().iterations()))
        assert runs[0] == runs[1]
