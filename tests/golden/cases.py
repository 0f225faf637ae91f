"""Golden decode cases: outputs recorded before a refactor of the decode core must stay identical after it.

`python tests/golden/cases.py` (re)records tests/golden/outputs.json; test_golden.py replays every case.
Both shipped models in float64, every schedule, widths of every class, greedy and sampled (temperature,
top-k, top-p), fixed seeds, EOS and stop sequences.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

import packed_ss

OUTPUTS = Path(__file__).with_name("outputs.json")
PROMPTS = ['def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
           "import os\n\n\ndef list_files(path):\n",
           "class Stack:\n    def __init__(self):\n"]
MAX_NEW = 40


def _cases():
    for schedule in ("ar", "linear", "quadratic", "packed"):
        for width in ((1,) if schedule == "ar" else (1, 3, 8)):
            for sampling in ({}, {"temperature": 1.0, "seed": 7}, {"temperature": 0.8, "top_k": 20, "seed": 3},
                             {"temperature": 1.0, "top_p": 0.9, "seed": 11}):
                yield {"model": "default", "schedule": schedule, "width": width, "order": None, **sampling}
    # an EOS in the middle of an accepted block: a frequent token of the default model made a stop token
    for schedule in ("ar", "packed", "linear", "quadratic"):
        yield {"model": "default", "schedule": schedule, "width": 4, "order": None, "stop_token_ids": [13]}
    for schedule, orders in (("ar", (None,)), ("threshold", (None,)), ("linear", ("ltr", "confidence")),
                             ("quadratic", ("ltr", "confidence")), ("packed", ("ltr", "confidence"))):
        for order in orders:
            for width in ((1,) if schedule == "ar" else (3, 8)):
                yield {"model": "any-order", "schedule": schedule, "width": width, "order": order}
                if order != "confidence" and schedule != "threshold":
                    yield {"model": "any-order", "schedule": schedule, "width": width, "order": order,
                           "temperature": 1.0, "top_k": 50, "seed": 5}
                yield {"model": "any-order", "schedule": schedule, "width": width, "order": order,
                       "stop_sequences": [[279, 434], [10, 200]]}


def case_id(case) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items() if v is not None)


_models: dict[str, object] = {}


def run(case, epilogue: str = "torch") -> list[dict]:
    """Outputs of one case over every prompt: tokens and the call counts."""
    kind = case["model"]
    if kind not in _models:
        # the base drafter: the recorded NFE and accepted counts are those of the models without the drafting
        # adapters shipped since (test_shipped_drafters.py checks the outputs with them)
        # float64: a float32 model's sampled tokens flip at inverse-CDF near-ties between CPUs whose kernels round
        # differently (AVX2 vs AVX-512); in float64 such a tie is about 1e9 times rarer
        _models[kind] = (packed_ss.load_model(packed_ss.default_model_path(kind), dtype=torch.float64,
                                              draft_adapter=None),
                         packed_ss.load_tokenizer(packed_ss.default_model_path(kind)))
    model, tok = _models[kind]
    opts = {k: case[k] for k in ("schedule", "width", "order") if case.get(k) is not None}
    if kind == "default" and case["schedule"] != "ar":
        opts["drafts"] = case.get("drafts", "diffusion")   # recorded before lookup drafts (tests/test_lookup.py)
    engine = packed_ss.Engine(model, epilogue=epilogue, **opts)
    kwargs = {k: case[k] for k in ("temperature", "top_k", "top_p", "seed", "stop_token_ids", "stop_sequences")
              if k in case}
    results = []
    for prompt in PROMPTS:
        res = engine.generate(tok.encode(prompt).ids, max_new_tokens=MAX_NEW, **kwargs)
        results.append({"tokens": res.tokens, "nfe": res.nfe, "n_verify": res.n_verify,
                        "n_accepted": res.n_accepted})
    return results


def main() -> None:
    torch.set_num_threads(1)
    cases = list(_cases())
    OUTPUTS.write_text(json.dumps([{"case": c, "outputs": run(c)} for c in cases], indent=0) + "\n")
    print(f"recorded {len(cases)} cases in {OUTPUTS}")


if __name__ == "__main__":
    main()
