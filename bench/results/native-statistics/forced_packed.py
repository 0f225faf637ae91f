"""T = 1, batch 1, the shipped model: the adaptive engine forced into `packed` W = 3/3 at every iteration against the
fixed `packed` W = 3 with diffusion drafts and `ar` (HumanEval prompts 8-23, 128 new tokens, no EOS, 2 rounds, the
engines taking turns): tok/s, tokens a call and ms per iteration by call shape. What the adaptive packed shape costs
beyond the fixed schedule's.

    cd /tmp && python forced_packed.py 1
"""
import collections, sys, time, torch, packed_ss
from packed_ss.decode.policy import Policy, Shape
from packed_ss.lab.bench.adaptive import tokenized_prompts
from packed_ss.runtime.batch import Batch
from packed_ss.runtime.request import SamplingParams
torch.set_num_threads(2)
T = float(sys.argv[1])
model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]

class Forced(Policy):
    def choose(self, st, length, order, passive=None):
        st.choice.fill_(self.shapes.index(Shape(3, 3)))

forced = packed_ss.Engine(model); forced.policy_type = Forced
engines = {"adaptive forced 3/3": forced, "packed W=3": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion"),
           "ar": packed_ss.Engine(model, schedule="ar")}
iterate, spent = Batch.iterate, collections.defaultdict(list)
cur = [None]
def timed(self, first, shape=0):
    t = time.perf_counter(); r = iterate(self, first, shape); spent[(cur[0], shape)].append(time.perf_counter() - t); return r
Batch.iterate = timed
for e in engines.values(): e.generate(ids[0], 8, temperature=T, seed=0)
spent.clear()
tok = collections.Counter(); calls = collections.Counter(); secs = collections.Counter()
for rnd in range(2):
    for i, p in enumerate(ids):
        for k in (engines if (i + rnd) % 2 else list(reversed(engines))):
            cur[0] = k; t = time.perf_counter()
            out = engines[k].generate(p, 128, temperature=T, seed=100 * rnd + i, eos_token_id=[])
            secs[k] += time.perf_counter() - t; tok[k] += len(out.tokens); calls[k] += out.nfe
for k in engines: print(f"{k}: {tok[k]/secs[k]:.0f} tok/s, {tok[k]/calls[k]:.2f} tokens a call")
for (k, s), v in sorted(spent.items(), key=lambda x: str(x[0])): print(f"  {k} shape {s}: {len(v)} iterations, {1e3*sum(v)/len(v):.3f} ms")
