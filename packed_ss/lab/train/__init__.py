"""Training of the shipped models, on the CPU, from the Python standard library.

    python -m packed_ss.lab.train --out DIR [options]             # the dual-mode default model (dual_mode.py)
    python -m packed_ss.lab.train.any_order --out DIR [options]   # its any-order sibling (any_order.py)

data.py (corpus, tokenizer, batches), objective.py (rows, masks, losses of both objectives), model.py (the
networks trained), optim.py (Muon + AdamW, lr schedule), loop.py (the step loop), evaluate.py (held-out
losses, draft quality), report.py (TRAINING.md).
"""
