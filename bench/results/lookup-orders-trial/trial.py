"""Paired, one process: the default engine against a variant of its policy, and AR (the trials of bench/RESULTS.md,
"Open batches, lookup statistics per match order, and a doze trial").

    python trial.py MODEL DTYPE PROMPTS NEW_TOKENS BATCH "SETTING;SETTING" VARIANT

VARIANT: "pooled" (one row of lookup statistics for every match order, the policy before 1c44d34), "pooled-w16"
(both engines at width 16, and the default at its own width as "w8"), or "dozing" (the doze trial: apply
../doze-lean-trial/doze.diff first; the variant always dozes). Run it from outside the repository's root, whose
kernels/ would shadow the `kernels` package transformers imports.
"""
import sys

import torch

import packed_ss
from packed_ss.decode.lookup import NGRAMS
from packed_ss.decode.policy import Policy
from packed_ss.lab.bench.adaptive import decode_units
from packed_ss.lab.bench.stats import bootstrap_counts, paired, per_prompt
from packed_ss.lab.humaneval import tokenized_prompts
from packed_ss.lab.progress import progress
from packed_ss.model.tokenizer import load_tokenizer


class Pooled(Policy):
    """One row of lookup statistics for every order of match."""
    def hit_of(self, st, order):
        return super().hit_of(st, torch.where(order > 0, max(NGRAMS), 0))

    def score_lookup(self, st, draft, length, order, passive=None):
        return super().score_lookup(st, draft, length, torch.where(order > 0, max(NGRAMS), 0), passive)


class Dozing(Policy):
    """The lean step priced free, so that a request never stays awake instead of dozing (with doze.diff only)."""
    def measured(self, costs, per_request=False):
        return super().measured(list(costs[:-1]) + [(1e-6, 1e-6)], per_request)


def engine(model, policy=None, **kw):
    made = packed_ss.Engine(model, **kw)
    if policy is not None:
        made.policy_type = policy
    return made


name, dtype, limit, new_tokens, batch, settings, variant = sys.argv[1:8]
limit, new_tokens, batch = int(limit), int(new_tokens), int(batch)
torch.set_num_threads(2)
model = packed_ss.load_model(None if name == "tiny" else name, dtype=getattr(torch, dtype))
prompts = [ids for _, ids in tokenized_prompts(load_tokenizer(None if name == "tiny" else name), 8 + limit)][8:]
methods = {"pooled": {"new": engine(model), "old": engine(model, Pooled)},
           "pooled-w16": {"new": engine(model, width=16), "old": engine(model, Pooled, width=16), "w8": engine(model)},
           "dozing": {"new": engine(model), "old": engine(model, Dozing)}}[variant]
methods["ar"] = engine(model, schedule="ar", sampler="rejection")
bar = progress(total=len(settings.split(";")) * len(methods) * limit, desc="requests")
for setting in settings.split(";"):
    records = decode_units(methods, prompts, batch, setting, new_tokens, 0, bar)
    units = max(r.unit for r in records) + 1
    counts = bootstrap_counts(units, 20000, 0)
    of = {m: per_prompt([r for r in records if r.method == m], units) for m in methods}
    speed = {m: f"{of[m]['tokens'].sum() / of[m]['wall_s'].sum():.1f} tok/s "
                f"{of[m]['tokens'].sum() / of[m]['nfe'].sum():.2f}/call" for m in of}
    ratios = {f"{a}/{b}": {k: round(float(v), 3) for k, v in paired(of[a], of[b], counts)["throughput_ratio"].items()}
              for a, b in [("new", "old"), ("new", "ar"), ("old", "ar")] + ([("new", "w8")] if "w8" in of else [])}
    print(setting, batch, speed, ratios, flush=True)
