"""SmolLM2-135M-Instruct: the default engine with DOZE 2 (as shipped) and DOZE 0 against `lookup` W = 8, taking
turns prompt by prompt. Five chat turns (the Quickstart's first), 64 new tokens, three rounds; with `humaneval`,
HumanEval prompts 0-7, 128 new tokens, two rounds. The model's EOS ends a reply.

    cd /tmp && python chat_ab.py [fp32] [humaneval]      # bf16 by default; 2-4 minutes
"""
import sys
import time

import torch

import packed_ss
import packed_ss.decode.policy as policy
from packed_ss.cli import resolve_model, user_turn
from packed_ss.runtime.batch import Batch

torch.set_num_threads(2)
dtype = torch.float32 if "fp32" in sys.argv else torch.bfloat16
model = packed_ss.load_model("smollm2-135m", dtype=dtype)
tok = packed_ss.load_tokenizer("smollm2-135m")
turn = user_turn(resolve_model("smollm2-135m"))
qs = ["Write a Python function that checks whether a number is prime.", "Explain what a hash map is.",
      "Write a function that reverses a linked list in Python.",
      "What is the capital of France? Answer in one sentence.",
      "Write a bash script that counts the lines of every .py file in a directory."]
prompts = [tok.encode(turn(q)).ids for q in qs]
N = 64
if "humaneval" in sys.argv:
    from packed_ss.lab.humaneval import humaneval_prompts
    prompts, N = [tok.encode(p).ids for _, p in humaneval_prompts(8)], 128

rec = []
it = Batch.iterate


def timed(self, first, shape=0):
    rec.append(shape)
    return it(self, first, shape)


Batch.iterate = timed
d, l = packed_ss.Engine(model), packed_ss.Engine(model, schedule="lookup")
d.generate(prompts[0], 4)
l.generate(prompts[0], 4)
V = {"shipped": (d, 2), "DOZE0": (d, 0), "lookup": (l, 2)}
tot = {k: [0, 0.0, 0] for k in V}
for rnd in range(3 if N == 64 else 2):
    for i, p in enumerate(prompts):
        for k in (list(V) if (i + rnd) % 2 == 0 else list(reversed(V))):
            e, doze = V[k]
            policy.DOZE = doze
            rec.clear()
            t = time.perf_counter()
            n = len(e.generate(p, N).tokens)
            tot[k][1] += time.perf_counter() - t
            tot[k][0] += n
            tot[k][2] += len(rec)
for k, (n, s, c) in tot.items():
    base = tot["shipped"][0] / tot["shipped"][1]
    print(f"{k}: {n / s:.1f} tok/s, {n / s / base:.3f}x shipped, {n / c:.2f} tok/call")
