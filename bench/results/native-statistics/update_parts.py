"""Where a full adaptive iteration's update goes: the shipped model, the default engine, greedy (T = 0) or sampled,
batch 1, HumanEval prompts 0-7, 128 new tokens; us per full update (the lean AR step not counted), each part timed
by a wrapper (so the parts include the wrappers' few us). Parts that a checkout lacks are left out.

    cd /tmp && python update_parts.py 0
"""
import collections
import inspect
import sys
import time

import torch

import packed_ss
import packed_ss.decode.schedules.adaptive as adaptive
from packed_ss.decode.epilogue import NativeEpilogue
from packed_ss.decode.policy import Policy
from packed_ss.lab.humaneval import humaneval_prompts

torch.set_num_threads(2)
model = packed_ss.load_model()
tok = packed_ss.load_tokenizer()
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(8)]
T = float(sys.argv[1])
top_p = 0.95 if 0 < T < 1 else None
spent = collections.defaultdict(lambda: [0, 0.0])


def timed(owner, name, key=None):
    if not hasattr(owner, name):
        return
    f = getattr(owner, name)

    def g(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        spent[key or name][0] += 1
        spent[key or name][1] += time.perf_counter() - t
        return out
    setattr(owner, name, staticmethod(g) if isinstance(inspect.getattr_static(owner, name), staticmethod) else g)


for name in ("score_lookup", "observe", "prefers_lookup", "choose", "continuation", "lookup_draft", "point_mass",
             "step", "rows"):
    timed(NativeEpilogue, name, f"epilogue.{name}")
for name in ("score_lookup", "observe", "prefers_lookup", "covers"):
    timed(Policy, name, f"policy.{name}")
timed(adaptive.Adaptive, "redraft")
timed(adaptive, "lookup_draft")
timed(adaptive.Adaptive, "point_mass")
build = adaptive.Adaptive._update


def _update(self, index, shape):
    update = build(self, index, shape)

    def g(st, logits):
        t = time.perf_counter()
        update(st, logits)
        spent["update"][0] += 1
        spent["update"][1] += time.perf_counter() - t
    return g


adaptive.Adaptive._update = _update
engine = packed_ss.Engine(model)
engine.generate(prompts[0], 16, seed=1, temperature=T, top_p=top_p)
spent.clear()
for p in prompts:
    engine.generate(p, 128, seed=1, temperature=T, top_p=top_p)
n = spent["update"][0]
for name, (calls, s) in sorted(spent.items(), key=lambda x: -x[1][1]):
    print(f"{name:24s} {calls:5d} calls {1e6 * s / n:8.1f} us per full update")
