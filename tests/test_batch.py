"""Batched decoding (Engine.generate_batch): each request decodes exactly as `generate` decodes it alone.

1. Invariance, for every left-to-right schedule, both epilogues, greedy and sampled, eager and through the
   CUDA-graph loop's CPU stand-ins (poll one iteration late): ragged prompts, a request stopping on a stop
   token in the middle of an accepted block (found by streaming the request alone), caps of 1 and 7 next to long ones, a prompt that nearly fills the
   engine's max_seq_len; all at once and in fewer slots than requests (continuous batching: a finished
   request's slot takes the next one; once none waits, running requests move to the front slots and the
   batch shrinks). Tokens and counts (NFE, verifications, accepted drafts) are equal.
2. The drafting adapter rides along (batched calls apply it to the drafting rows of every request).
3. At most one host read per iteration for the whole batch (tests/host_reads.py), plus one per request end.
4. Bad input is refused with a ValueError naming the request, before anything runs.
5. Compiled steps with a batch that shrinks: a few padded sizes, not a recompile per size.
(The sampled first tokens of batched requests against the AR distribution, and their independence within a
batch: tests/test_sampling_exactness.py.)
"""
import json
import subprocess
import sys

import pytest
import torch
from host_reads import count_host_reads
from tiny_models import checkpoint

import packed_ss
import packed_ss.decode.epilogue.native as native_mod
import packed_ss.decode.epilogue.operator as operator_mod
from packed_ss.cli import main
from packed_ss.decode.epilogue import native_available
from packed_ss.runtime.executor import Graphs

EPILOGUES = [pytest.param("native", marks=pytest.mark.skipif(not native_available("cpu"),
                                                             reason="native epilogue not built")), "torch"]
MAX_SEQ_LEN = 64
PROMPTS = [[3, 17, 42, 8, 9], list(range(1, 20)), [5], [7, 7, 7, 7], [(11 * i) % 90 + 2 for i in range(59)]]
CAPS = [30, 25, 1, 7, 5]          # the last prompt fills 59 + 5 = 64 = max_seq_len
SAMPLINGS = {"greedy": {}, "sampled": dict(temperature=1.0, top_k=8)}


@pytest.fixture(scope="module")
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"), dtype=torch.float32)


def alone(engine, prompts, caps, seeds, **kwargs):
    return [engine.generate(p, max_new_tokens=c, seed=s, **kwargs) for p, c, s in zip(prompts, caps, seeds)]


def stop_inside_a_block(engine, prompt, cap, seed, kwargs, mid_block: bool) -> tuple[list[int], int]:
    """(free-running output, index of a stop token for it): a token first emitted there, and (speculative
    schedules) not the last of its iteration's accepted block, so stopping there drops the block's rest."""
    blocks = list(engine.stream(prompt, max_new_tokens=cap, seed=seed, **kwargs))   # one list per iteration
    out = [t for block in blocks for t in block]
    ends = {sum(map(len, blocks[:i + 1])) - 1 for i in range(len(blocks))}   # a block's last index
    at = next(i for i in range(2, len(out)) if out[i] not in out[:i] and not (mid_block and i in ends))
    return out, at


def assert_same(got, want):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.tokens == w.tokens, (i, g.tokens, w.tokens)
        assert (g.nfe, g.n_verify, g.n_accepted) == (w.nfe, w.n_verify, w.n_accepted), i


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_batch_equals_alone(request, model, schedule, epilogue, sampling, mode):
    drafts = None if schedule == "ar" else "diffusion"    # a lookup draft never holds a new token: no mid-block stop
    engine = packed_ss.Engine(model, schedule=schedule, width=3, epilogue=epilogue, max_seq_len=MAX_SEQ_LEN,
                              drafts=drafts)
    kwargs = dict(SAMPLINGS[sampling], eos_token_id=[])
    seeds = [100 + i for i in range(len(PROMPTS))]
    out, at = stop_inside_a_block(engine, PROMPTS[0], CAPS[0], seeds[0], kwargs, mid_block=schedule != "ar")
    want = alone(engine, PROMPTS, CAPS, seeds, stop_token_ids=[out[at]], **kwargs)
    assert want[0].tokens == out[:at + 1]
    if mode == "graph":
        request.getfixturevalue("eager_graphs")
        engine.runtime.executor = Graphs(engine.runtime.executor.compile_backend)  # CPU stand-ins capture (conftest)
    for batch_size in (len(PROMPTS), 2):
        got = engine.generate_batch(PROMPTS, max_new_tokens=CAPS, seed=seeds, stop_token_ids=[out[at]],
                                    batch_size=batch_size, **kwargs)
        assert_same(got, want)
        if batch_size == len(PROMPTS):   # nothing waits: finished requests left the batch (slots compacted)
            assert engine.runtime.slot_iterations < batch_size * engine.runtime.iterations


def test_int_seed_and_repeated_prompts(model):
    """An int seed s gives request i the seed s + i: repeated prompts draw their own samples."""
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    got = engine.generate_batch([PROMPTS[0]] * 4, max_new_tokens=12, temperature=1.0, seed=7, eos_token_id=[])
    assert_same(got, alone(engine, [PROMPTS[0]] * 4, [12] * 4, range(7, 11), temperature=1.0, eos_token_id=[]))
    assert len({tuple(r.tokens) for r in got}) > 1


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_drafting_adapter_in_a_batch(schedule):
    """The shipped default model with its drafting adapter: batched drafts are the adapter's (same NFE and
    accepted counts as alone) and the tokens are the greedy ones."""
    model = packed_ss.load_model(draft_adapter=packed_ss.default_model_path() / "drafter")
    prompts = [packed_ss.load_tokenizer().encode(t).ids for t in ("def add(a, b):", "import os\n", "class Stack:")]
    engine = packed_ss.Engine(model, schedule=schedule, width=4)
    assert_same(engine.generate_batch(prompts, max_new_tokens=24, eos_token_id=[]),
                alone(engine, prompts, [24] * 3, [0] * 3, eos_token_id=[]))


@pytest.mark.parametrize("schedule", ["linear", "packed"])
def test_one_host_read_per_iteration_for_the_batch(model, schedule):
    engine = packed_ss.Engine(model, schedule=schedule, width=3)
    kwargs = dict(max_new_tokens=[40, 40, 40, 40], eos_token_id=[], temperature=1.0, seed=0)
    engine.generate_batch(PROMPTS[:4], **kwargs)
    with count_host_reads() as reads:
        results = engine.generate_batch(PROMPTS[:4], **kwargs)
    iterations = engine.runtime.iterations
    # One table per iteration (the prefills' included) and one fetch per request end. One read per request
    # and iteration would be ~4x as many.
    bound = iterations + 1 + len(results)
    assert reads.reads <= bound, reads.summary()
    assert iterations <= max(r.n_verify for r in results) + 1


def test_bad_input_names_the_request_before_anything_runs(model, monkeypatch):
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    monkeypatch.setattr(engine.runtime, "decode", lambda *a, **k: pytest.fail("decoding started"))
    cases = [
        (dict(prompts=[]), "at least one prompt"),
        (dict(prompts=[[1], [2]], max_new_tokens=[3]), "max_new_tokens must be one value or a list of one per "
                                                       r"prompt \(2\), got a list of 1"),
        (dict(prompts=[[1], [2]], seed=[1, 2, 3]), "seed must be one value"),
        (dict(prompts=[[1], [2, 3], [], [4]]), "request 2: prompt_ids must contain at least one token"),
        (dict(prompts=[[1], [2, 300]]), r"request 1: prompt_ids must be token ids in \[0, 97\)"),
        (dict(prompts=[[1], [2]], max_new_tokens=[4, 0]), "request 1: max_new_tokens must be an integer"),
        (dict(prompts=[[1], [2]], seed=[4, -1]), "request 1: seed must be an integer"),
        (dict(prompts=[[1]], batch_size=0), r"batch_size must be an integer \[1, 256\]"),
        (dict(prompts=[[1], [2]], temperature=[0.5]), "temperature must be one value or a list of one per prompt"),
        (dict(prompts=[[1], [2]], temperature=[0.5, -1.0]), "request 1: temperature must be a finite number >= 0"),
        (dict(prompts=[[1], [2]], temperature=1.0, top_p=[0.9, 0.0]), r"request 1: top_p must be in \(0, 1\]"),
        (dict(prompts=[[1], [2]], temperature=1.0, top_k=[None, 0]), "request 1: top_k must be an integer"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.generate_batch(**kwargs)


def test_any_order_models_decode_one_at_a_time():
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float32)
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    with pytest.raises(ValueError, match="batch_size must be 1 for an any-order model"):
        engine.generate_batch(PROMPTS[:2], max_new_tokens=4, batch_size=2)
    got = engine.generate_batch(PROMPTS[:3], max_new_tokens=[9, 1, 5], eos_token_id=[])
    assert_same(got, alone(engine, PROMPTS[:3], [9, 1, 5], [0] * 3, eos_token_id=[]))


def test_an_any_order_batch_takes_a_setting_per_prompt():
    """Greedy and sampled prompts of one generate_batch on an any-order model (LTR): each request gets what
    `generate` gives it alone, a greedy one decoding at temperature 0 in the sampled program (float64: the two
    programs' calls differ)."""
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float64)
    engine = packed_ss.Engine(model, schedule="packed", width=3)
    settings = [dict(temperature=0.0), dict(temperature=1.0, top_k=20), dict(temperature=0.7, top_p=0.9)]
    want = [engine.generate(p, 12, seed=5 + i, eos_token_id=[], **s).tokens
            for i, (p, s) in enumerate(zip(PROMPTS, settings))]
    got = engine.generate_batch(PROMPTS[:3], 12, seed=5, eos_token_id=[],
                                temperature=[s["temperature"] for s in settings],
                                top_k=[s.get("top_k") for s in settings], top_p=[s.get("top_p") for s in settings])
    assert [r.tokens for r in got] == want


def test_cli_generates_a_prompts_file_in_batches(tmp_path):
    """`generate --prompts-file --batch-size`: a JSON line per prompt, in order, each the greedy continuation
    that `generate` gives that prompt alone; a bad line is an error naming it."""
    texts = ["def add(a, b):", "import os\n", "class Stack:"]
    file = tmp_path / "prompts.jsonl"
    file.write_text("".join(json.dumps({"task_id": i, "prompt": t}) + "\n" for i, t in enumerate(texts)))
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "generate", "--prompts-file", str(file),
                           "--batch-size", "2", "--max-new-tokens", "12", "--dtype", "float32"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    tok, engine = packed_ss.load_tokenizer(), packed_ss.Engine(packed_ss.load_model(), schedule="packed")
    for i, (line, text) in enumerate(zip(lines, texts, strict=True)):
        alone = engine.generate(tok.encode(text).ids, max_new_tokens=12, seed=i)
        assert line["index"] == i and line["completion"] == tok.decode(alone.tokens), line
    assert "3 requests" in proc.stderr
    file.write_text('{"prompt": "x"}\n["not an object"]\n')
    assert main(["generate", "--prompts-file", str(file)]) == 2


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_stream_batch_yields_each_requests_tokens(request, model, mode):
    """stream_batch: (index, tokens) as iterations add them; per request, in order, they make up exactly
    its generate_batch output, also while finished requests leave the batch and the others move slots."""
    engine = packed_ss.Engine(model, schedule="packed", width=3, max_seq_len=MAX_SEQ_LEN)
    kwargs = dict(max_new_tokens=CAPS, seed=5, temperature=1.0, eos_token_id=[])
    want = engine.generate_batch(PROMPTS, **kwargs)
    if mode == "graph":
        request.getfixturevalue("eager_graphs")
        engine.runtime.executor = Graphs(engine.runtime.executor.compile_backend)
    decoding, streamed = engine.stream_batch(PROMPTS, **kwargs), [[] for _ in PROMPTS]
    while True:
        try:
            index, tokens = next(decoding)
        except StopIteration as end:
            results = end.value
            break
        assert tokens
        streamed[index] += tokens
    assert streamed == [w.tokens for w in want] == [r.tokens for r in results]
    with pytest.raises(ValueError, match="request 1: max_new_tokens"):
        engine.stream_batch(PROMPTS[:2], max_new_tokens=[3, 0])


@pytest.mark.parametrize("schedule", ["packed", "quadratic"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_compiled_batch_with_staggered_requests(model, monkeypatch, schedule, epilogue):
    """compile=True with 12 requests of staggered lengths: the batch starts at 16 slots and shrinks through powers
    of two, so the step compiles for a few sizes (under dynamo's recompile limit with fullgraph=True; every exact
    size used to recompile until FailOnRecompileLimitHit), and the tokens equal eager decoding's. The native
    epilogue runs inside the compiled step as the torch operator packed_ss::epilogue_step (Quadratic-SS: its
    verify and commit halves, a branch picked between them)."""
    torch._dynamo.reset()
    prompts = [PROMPTS[0][: 1 + i % 5] + [i] for i in range(12)]
    kwargs = dict(max_new_tokens=[4 + 3 * i for i in range(12)], eos_token_id=[], temperature=1.0, seed=0)
    eager = packed_ss.Engine(model, schedule, width=3, epilogue=epilogue).generate_batch(prompts, **kwargs)
    calls, op = [], operator_mod.epilogue_step
    monkeypatch.setattr(operator_mod, "epilogue_step", lambda *args: (calls.append(1), op(*args))[1])
    monkeypatch.setattr(native_mod, "epilogue_step", operator_mod.epilogue_step)
    compiled = packed_ss.Engine(model, schedule, width=3, compile="aot_eager", epilogue=epilogue)
    assert compiled.epilogue == epilogue
    assert [r.tokens for r in compiled.generate_batch(prompts, **kwargs)] == [r.tokens for r in eager]
    assert bool(calls) == (epilogue == "native")     # traced: the operator, never the raw call
