"""The runtime's loop logic on the CPU: the CUDA-graph mode (capture and events replaced by stand-ins, the
poll reading one iteration late) decodes exactly as the eager loop, for every left-to-right and any-order
schedule, across requests that reuse the persistent state with other lengths, seeds and stops (the
stand-ins: the `eager_graphs` fixture of conftest.py)."""
import math

import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.runtime.executor import Graphs
from packed_ss.decode.epilogue import native_available
from packed_ss.decode.sampling import SamplingParams

PROMPT = [3, 17, 42, 8, 9]
EPILOGUES = [pytest.param("native", marks=pytest.mark.skipif(not native_available("cpu"),
                                                             reason="native epilogue not built")), "torch"]


def _check_graph_loop(eager, graphed, replays, requests):
    graphed.runtime.executor = Graphs(graphed.runtime.executor.compile_backend)   # CPU stand-ins capture (fixture)
    for i, req in enumerate(requests * 2):
        kwargs = dict(req, seed=i)
        prompt = kwargs.pop("prompt")
        want = eager.generate(prompt, **kwargs)
        del replays[:]
        got = graphed.generate(prompt, **kwargs)
        assert got.tokens == want.tokens, (i, got.tokens, want.tokens)
        assert (got.nfe, got.n_verify, got.n_accepted) == (want.nfe, want.n_verify, want.n_accepted)
        assert got.iterations == want.iterations
        assert math.isnan(got.model_s)
        params = SamplingParams(float(kwargs.get("temperature", 0.0)), kwargs.get("top_k"))
        steps = len(graphed.program(params).steps)
        calls = want.nfe - 1                      # eager iterations after the prefill, in model calls
        assert len(replays) <= -(-calls // steps) + 1, (len(replays), calls)   # at most one of overshoot


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_graph_loop_matches_eager(eager_graphs, schedule, epilogue):
    """Persistent state reset per request, stop flag polled one iteration late (at most one no-op
    iteration of overshoot), reuse across requests with other lengths, seeds, stop ids and sequences."""
    model = packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)
    engines = [packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue) for _ in range(2)]
    _check_graph_loop(*engines, eager_graphs, [
        dict(prompt=PROMPT, max_new_tokens=30, eos_token_id=[]),
        dict(prompt=list(range(1, 20)), max_new_tokens=25, eos_token_id=None, temperature=1.0),
        dict(prompt=PROMPT[:2], max_new_tokens=1, eos_token_id=[]),
        dict(prompt=PROMPT, max_new_tokens=20, stop_token_ids=[5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
             temperature=0.9, top_k=8),
        dict(prompt=PROMPT, max_new_tokens=30, eos_token_id=[], stop_sequences=[[20, 21], [7, 7, 7]])])


@pytest.mark.parametrize("schedule,order", [("packed", "ltr"), ("packed", "confidence"), ("linear", "confidence"),
                                            ("quadratic", "ltr"), ("threshold", None), ("ar", None)])
def test_any_order_graph_loop_matches_eager(eager_graphs, schedule, order):
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float32)
    engines = [packed_ss.Engine(model, schedule=schedule, width=3, order=order) for _ in range(2)]
    sampled = [] if order == "confidence" or schedule == "threshold" else [
        dict(prompt=list(range(1, 20)), max_new_tokens=25, eos_token_id=[], temperature=1.0, top_k=8)]
    _check_graph_loop(*engines, eager_graphs, [
        dict(prompt=PROMPT, max_new_tokens=30, eos_token_id=[]),
        dict(prompt=PROMPT[:2], max_new_tokens=1, eos_token_id=[]),
        dict(prompt=PROMPT, max_new_tokens=24, eos_token_id=[], stop_sequences=[[20, 21], [7, 7, 7]]),
        *sampled])


def test_graph_batch_follows_the_requests(eager_graphs):
    """Graph mode sizes a batch's page table from its requests (next power of two, at least 256 cache slots), not
    from max_seq_len, and captures a larger batch when a longer request comes; outputs equal eager decoding."""
    model = packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)
    eager = packed_ss.Engine(model, schedule="packed", width=3)
    graphed = packed_ss.Engine(model, schedule="packed", width=3, max_seq_len=4096)
    graphed.runtime.executor = Graphs(graphed.runtime.executor.compile_backend)
    scheduler = graphed.runtime.scheduler(graphed.program(SamplingParams(temperature=1.0)))
    for prompt, new, capacity in ((PROMPT, 20, 256), (list(range(1, 90)) * 3, 60, 512), (PROMPT, 20, 512)):
        kwargs = dict(max_new_tokens=new, eos_token_id=[], temperature=1.0, seed=1)
        stream = graphed.stream(prompt, **kwargs)
        tokens = next(stream)
        assert scheduler.batch.capacity == capacity
        tokens += [t for block in stream for t in block]
        assert tokens == eager.generate(prompt, **kwargs).tokens


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_compiled_steps_inside_the_graph_match_eager(eager_graphs, schedule):
    """compile with cuda_graph: each step compiled (fullgraph), the iteration of compiled steps captured; the
    tokens are eager decoding's, alone and batched (CPU stand-ins for the capture, aot_eager for inductor)."""
    model = packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)
    eager = packed_ss.Engine(model, schedule=schedule, width=3)
    both = packed_ss.Engine(model, schedule=schedule, width=3, compile="aot_eager")
    both.runtime.executor = Graphs(both.runtime.executor.compile_backend)
    prompts = [PROMPT, list(range(1, 20)), PROMPT[:2]]
    for kwargs in (dict(eos_token_id=[]), dict(eos_token_id=[], temperature=1.0, top_k=8, seed=4)):
        want = eager.generate_batch(prompts, max_new_tokens=[30, 12, 20], **kwargs)
        del eager_graphs[:]
        got = both.generate_batch(prompts, max_new_tokens=[30, 12, 20], **kwargs)
        assert [r.tokens for r in got] == [r.tokens for r in want]
        assert eager_graphs                                   # iterations replayed through the "graph"
    assert both.runtime.executor.compiled   # the compiled steps (with the native operator, where built) were captured
