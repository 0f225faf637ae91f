"""SmolLM2-135M-Instruct in bf16: the default engine under variants of the policy's constants (DOZE, MARGIN: module
globals read at each choice, so one engine serves every variant) against `lookup` W = 8, taking turns prompt by
prompt over N HumanEval prompts twice, 128 new tokens, no stop token; calls per shape (-1: the lean AR step).

    cd /tmp && python constants_ab.py N [TEMPERATURE]      # here: 8 0, 7 minutes
"""
import collections
import sys
import time

import torch

import packed_ss
import packed_ss.decode.policy as policy
from packed_ss.lab.humaneval import humaneval_prompts
from packed_ss.runtime.batch import Batch
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16)
tok = packed_ss.load_tokenizer("smollm2-135m")
n = int(sys.argv[1])
T = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
top_p = 0.95 if T else None
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(n)]
record = []
iterate = Batch.iterate


def timed(self, first, shape=0):
    record.append(shape)
    return iterate(self, first, shape)


Batch.iterate = timed
default, lookup = packed_ss.Engine(model), packed_ss.Engine(model, schedule="lookup")
variants = {"shipped": (default, dict(DOZE=2, MARGIN=1.1)), "DOZE0": (default, dict(DOZE=0, MARGIN=1.1)),
            "DOZE0 M0.9": (default, dict(DOZE=0, MARGIN=0.9)), "lookup": (lookup, {})}
for e in (default, lookup):
    e.generate(prompts[0], 8, temperature=T, top_p=top_p)
tot = {k: [0, 0.0, collections.Counter()] for k in variants}
for rnd in range(2):
    for i, p in enumerate(prompts):
        for k in (list(variants) if (i + rnd) % 2 == 0 else list(reversed(variants))):
            e, consts = variants[k]
            for c, v in {**dict(DOZE=2, MARGIN=1.1), **consts}.items():
                setattr(policy, c, v)
            record.clear()
            t = time.perf_counter()
            tot[k][0] += len(e.generate(p, 128, eos_token_id=[], seed=i, temperature=T, top_p=top_p).tokens)
            tot[k][1] += time.perf_counter() - t
            tot[k][2].update(record)
base = tot["shipped"][0] / tot["shipped"][1]
for k, (tk, s, c) in tot.items():
    print(f"{k}: {tk / s:.1f} tok/s, {tk / s / base:.3f}x shipped, {tk / sum(c.values()):.2f} tok/call, "
          f"calls per shape {dict(sorted(c.items()))}")
