"""A/A/A/A: four identical `schedule="ar"` engines (each its own K/V pool) on the shipped model, T = 0.7 / top-p 0.95,
batch 1, HumanEval prompts 8-23 of bench-adaptive's, 128 new tokens, no EOS, three rounds; within a round the
engines take turns prompt by prompt, the first rotating. Prints each engine's ms a call in each round: an engine
whose pool sat badly in memory would be slow in every round.

    cd /tmp && python four_engines.py
"""
import collections
import time

import torch

import packed_ss
from packed_ss.lab.bench.adaptive import tokenized_prompts

torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engines = [packed_ss.Engine(model, schedule="ar") for _ in range(4)]
for e in engines:
    e.generate(ids[0], 8, temperature=0.7, top_p=0.95, seed=0)
seconds, calls = collections.defaultdict(float), collections.defaultdict(int)
for rnd in range(3):
    for i, prompt in enumerate(ids):
        for k in [(i + j) % 4 for j in range(4)]:
            t = time.perf_counter()
            out = engines[k].generate(prompt, 128, temperature=0.7, top_p=0.95, seed=i, eos_token_id=[])
            seconds[k, rnd] += time.perf_counter() - t
            calls[k, rnd] += out.nfe
for k in range(4):
    print(f"engine {k}: " + "  ".join(f"{1e3 * seconds[k, r] / calls[k, r]:.3f}" for r in range(3)) + " ms a call")
