"""Without a GPU, Triton kernels run in its interpreter (the flag must be set before triton is imported); the
CUDA-graph loop runs on the CPU through stand-ins (`eager_graphs`)."""
import functools
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Every engine's default K/V pool: small, since tests hold many engines at once, and a step compiled with
# aot_eager (which does not reinplace, as inductor does) copies the whole pool its attention writes to.
os.environ.setdefault("PACKED_SS_KV_CACHE_BYTES", str(32 << 20))

# The test models are tiny: one intra-op thread is fastest, and avoids thrashing on a shared 2-core box.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_width_choices(tmp_path, monkeypatch):
    """Every test measures width="auto" afresh (the choices remembered across processes go to its tmp_path)."""
    monkeypatch.setenv("PACKED_SS_CACHE_DIR", str(tmp_path / "packed-ss-cache"))


@pytest.fixture
def eager_graphs(monkeypatch):
    """Engine(cuda_graph=True) on the CPU: capture returns the iteration itself, the poll reads one late.
    Yields the list of iterations run through the graph stand-in (warm-ups and replays)."""
    replays = []

    def capture(run):
        def replay():
            replays.append(1)
            run()
        return replay

    import packed_ss.runtime.graphs as graphs_mod
    import packed_ss.runtime.poll as poll_mod

    monkeypatch.setattr(graphs_mod, "warm_up", lambda run: (replays.append(1), run()))
    monkeypatch.setattr(graphs_mod, "capture", capture)
    monkeypatch.setattr(poll_mod.Poll, "__init__", functools.partialmethod(poll_mod.Poll.__init__, lag=1))
    return replays


@pytest.fixture(scope="module")
def shipped():
    """The shipped model and its tokens of the first three HumanEval prompts (code repeats: lookup drafts are
    accepted many tokens deep)."""
    import packed_ss
    model = packed_ss.load_model()
    tok = packed_ss.load_tokenizer(packed_ss.model.loading.default_model_path())
    rows = [json.loads(line) for line in open("bench/humaneval-32.jsonl")][:3]
    return model, [tok.encode(r["prompt"]).ids for r in rows]
