"""Paired, open batches (units of QUEUE batches' worth, at most a batch at once): the default engine that values
gained tokens by whether requests wait (open) against one that always prices a closed batch (closed), AR, and a
second copy of the default (open2: an A/A control, whose ratio to open shows this machine's bias at this size).

    python open_closed.py PROMPTS NEW_TOKENS BATCH QUEUE "SETTING;SETTING" MODEL
    # here: 128 64 8 4 "T=0;T=0.7,top-p=0.95" shipped (fp32), and 128 64 8 4 "T=0" smollm2-135m (bf16)

Run it from outside the repository's root, whose kernels/ would shadow the `kernels` package transformers imports.
"""
import sys

import torch

import packed_ss
from packed_ss.decode.policy import Policy
from packed_ss.lab.bench.adaptive import decode_units
from packed_ss.lab.bench.stats import bootstrap_counts, paired, per_prompt
from packed_ss.lab.humaneval import tokenized_prompts
from packed_ss.model.tokenizer import load_tokenizer
from packed_ss.lab.progress import progress

class Closed(Policy):
    def batch_tokens(self, st, expected, choosing, ar_cost):
        queued = st.queued.clone()
        st.queued.zero_()
        try:
            return super().batch_tokens(st, expected, choosing, ar_cost)
        finally:
            st.queued.copy_(queued)

limit, new_tokens, batch, queue = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
settings = sys.argv[5].split(";")
torch.set_num_threads(2)
shipped = sys.argv[6] == "shipped"
path = packed_ss.default_model_path() if shipped else sys.argv[6]
model = packed_ss.load_model(path, dtype=torch.float32 if shipped else torch.bfloat16)
tok = load_tokenizer(path)
prompts = [ids for _, ids in tokenized_prompts(tok, 16 + limit)][16:]
closed = packed_ss.Engine(model); closed.policy_type = Closed
methods = {"open": packed_ss.Engine(model), "closed": closed, "ar": packed_ss.Engine(model, schedule="ar", sampler="rejection"), "open2": packed_ss.Engine(model)}
bar = progress(total=len(settings) * 4 * limit, desc="requests")
for setting in settings:
    recs = decode_units(methods, prompts, batch, setting, new_tokens, 0, bar, queue)
    units = max(r.unit for r in recs) + 1
    counts = bootstrap_counts(units, 20000, 0)
    of = {m: per_prompt([r for r in recs if r.method == m], units) for m in methods}
    line = {m: (float(of[m]["tokens"].sum() / of[m]["wall_s"].sum()), float(of[m]["tokens"].sum() / of[m]["nfe"].sum())) for m in of}
    r = lambda a, b: {k: round(float(v), 3) for k, v in paired(of[a], of[b], counts)["throughput_ratio"].items()}
    print(setting, f"batch {batch} queue {queue} units {units}", {m: f"{a:.1f} tok/s {b:.2f}/call" for m, (a, b) in line.items()},
          "open/closed", r("open", "closed"), "open/ar", r("open", "ar"), "closed/ar", r("closed", "ar"), "open/open2 (A/A)", r("open", "open2"), flush=True)
