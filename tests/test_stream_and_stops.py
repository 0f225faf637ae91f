"""`Engine.stream` yields exactly `generate`'s tokens; stop sequences of several tokens end every schedule's
output at the earliest whole marker, matched on the device (eager, compiled and with either epilogue)."""
import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.decode.epilogue import native_available

PROMPT = [3, 17, 42, 8, 9]
SCHEDULES = ["ar", "linear", "quadratic", "packed"]
EPILOGUES = ["torch", pytest.param("native", marks=pytest.mark.skipif(not native_available("cpu"),
                                                                       reason="native epilogue not built"))]
SAMPLING = [dict(), dict(temperature=1.0, top_k=20, seed=4)]


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "sampled"])
def test_stream_yields_generate_tokens(model, schedule, epilogue, sampling):
    engine = packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue)
    want = engine.generate(PROMPT, max_new_tokens=30, eos_token_id=[], **sampling)
    chunks = []
    stream = engine.stream(PROMPT, max_new_tokens=30, eos_token_id=[], **sampling)
    try:
        while True:
            chunks.append(next(stream))
    except StopIteration as end:
        result = end.value
    assert all(chunks) and sum(chunks, []) == want.tokens == result.tokens
    assert (result.nfe, result.n_verify, result.n_accepted) == (want.nfe, want.n_verify, want.n_accepted)
    if schedule != "ar":
        assert len(chunks) < len(want.tokens) or want.n_accepted == 0   # accepted blocks arrive together


def test_stream_checks_arguments_before_running(model):
    with pytest.raises(ValueError, match="max_new_tokens"):
        packed_ss.Engine(model).stream(PROMPT, max_new_tokens=0)


def _first_end(tokens, marker):
    n = len(marker)
    return next(e for e in range(n - 1, len(tokens)) if tokens[e - n + 1:e + 1] == marker)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "sampled"])
def test_stop_sequences_end_output_at_earliest_marker(model, schedule, epilogue, sampling):
    engine = packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue)
    free = engine.generate(PROMPT, max_new_tokens=40, eos_token_id=[], **sampling).tokens
    late, early = free[20:23], free[9:11]            # markers of 3 and 2 tokens taken from the free run
    never = [model.cfg.vocab_size - 1] * 4
    for markers in ([late], [late, early], [never, early], [PROMPT[-2:]]):
        out = engine.generate(PROMPT, max_new_tokens=40, eos_token_id=[], stop_sequences=markers, **sampling)
        ends = [_first_end(free, m) for m in markers if any(free[e - len(m) + 1:e + 1] == m
                                                              for e in range(len(m) - 1, len(free)))]
        want = free[:min(ends) + 1] if ends else free          # a marker in the prompt alone never stops
        assert out.tokens == want, (markers, out.tokens, free)


def test_stop_sequences_compile(model):
    """The sequence match is shape-static: the compiled step (fullgraph) gives the eager tokens."""
    torch._dynamo.reset()
    kwargs = dict(max_new_tokens=16, eos_token_id=[])
    free = packed_ss.Engine(model, schedule="packed", width=3).generate(PROMPT, **kwargs).tokens
    marker = free[6:8]
    eager = packed_ss.Engine(model, schedule="packed", width=3).generate(PROMPT, stop_sequences=[marker], **kwargs)
    compiled = packed_ss.Engine(model, schedule="packed", width=3, compile="aot_eager").generate(
        PROMPT, stop_sequences=[marker], **kwargs)
    assert compiled.tokens == eager.tokens == free[:_first_end(free, marker) + 1]
