"""Where a sampled call's truncation goes in the decode loop (not on hot data): the shipped model, `packed` W = 3 with
diffusion drafts, batch 1, T = 0.7 / top-p 0.95, HumanEval prompts 8-15, 128 tokens, no EOS; us per call of
truncated_probs, of truncate (where the checkout has it) and of nucleus_cut with the native call inside it, each
timed by a wrapper.

    cd /tmp && python in_loop.py            (PYTHONPATH=<a base worktree> for the base)
"""
import collections
import time

import torch

import packed_ss
import packed_ss.decode.epilogue.base as base
from packed_ss.decode import sampling
from packed_ss.decode.epilogue.extension import native_module
from packed_ss.lab.bench.adaptive import tokenized_prompts

torch.set_num_threads(2)
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 16)][8:16]
engine = packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")
spent, calls = collections.Counter(), collections.Counter()


def timed(owner, name, key):
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = inner(*args, **kwargs)
        spent[key] += time.perf_counter() - t
        calls[key] += 1
        return out
    setattr(owner, name, wrapper)


timed(native_module(), "nucleus_cpu", "native nucleus_cpu")
for name in ("truncated_probs", "truncate", "nucleus_cut"):
    if hasattr(sampling, name):
        timed(sampling, name, name)
base.truncated_probs = sampling.truncated_probs
for i, prompt in enumerate(ids):
    engine.generate(prompt, 128, seed=i, eos_token_id=[], temperature=0.7, top_p=0.95)
for key in ("truncated_probs", "truncate", "nucleus_cut", "native nucleus_cpu"):
    if calls[key]:
        print(f"{key:20s} {calls[key]:5d} calls {1e6 * spent[key] / calls[key]:7.1f} us each")
