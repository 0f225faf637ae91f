"""Where an iteration of the adaptive schedule's sampled program goes on the shipped 4M model (fp32, T = 1 / top-p
0.95, batch 1, 256 cached tokens, a full draft, as Runtime.shape_costs prices it): ms per shape, and the model
call and the policy's parts within it, against the fixed `packed` W = 3 schedule with diffusion drafts. The
parts are timed by wrappers (a few us each); what the list leaves out of the total is the inputs, the rows'
distributions (top-p included) and the rest of the update.

    cd /tmp && python parts.py          # half a minute
"""
import collections
import time

import torch

import packed_ss
import packed_ss.decode.schedules.adaptive as adaptive
from packed_ss.engine import PRICED
from packed_ss.model.dual_mode import own_cache
from packed_ss.runtime.request import Request

CACHED, REPS = 256, 60
torch.set_num_threads(2)
model = packed_ss.load_model(packed_ss.default_model_path(), dtype=torch.float32)
spent = collections.defaultdict(float)


def timed(name, fn):
    def wrapped(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        spent[name] += time.perf_counter() - t
        return out
    return wrapped


engine = packed_ss.Engine(model)
program = engine.program(PRICED)
fixed = packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion").program(PRICED)
program.epilogue.step = timed("epilogue.step", program.epilogue.step)
program.point_mass = timed("point_mass", program.point_mass)
adaptive.lookup_draft = timed("lookup_draft", adaptive.lookup_draft)
for name in ("choose", "observe", "score_lookup", "prefers_lookup"):
    setattr(program.policy, name, timed(name, getattr(program.policy, name)))
runtime = engine.runtime
runtime.forward = timed("model", runtime.forward)


def run(program, steps, label):
    one = program.new_state(Request([2 + i % 64 for i in range(CACHED)], 8, 0, [], [], PRICED))
    start = type(one).cat([one])
    start.cache_len.fill_(CACHED)
    start.draft_len.fill_(program.width)
    st = type(one).cat([start])
    cache = own_cache(model, CACHED + program.reserve, 1)
    for rep in range(REPS + 5):
        if rep == 5:
            spent.clear()
            t = time.perf_counter()
        st.copy_(start)
        for step in steps:
            runtime.call(step, st, cache, None)
    total = (time.perf_counter() - t) / REPS * 1e3
    parts = sorted(spent.items(), key=lambda kv: -kv[1])
    print(f"{label}: {total:.2f} ms; " + ", ".join(f"{k} {v / REPS * 1e3:.2f}" for k, v in parts))


for i, shape in enumerate(program.policy.shapes):
    run(program, program.shapes[i], f"adaptive {shape}")
run(program, program.shapes[-1], "adaptive lean")
run(fixed, fixed.steps, "fixed packed W=3")
