"""The drafter trainer and profiler: a drafting LoRA for a dual-mode model, trained by self-distillation
(`python -m packed_ss train-drafter`, train.py), and a drafter's acceptance profile for width="auto"
(`python -m packed_ss profile-drafter`, measure.py).

options.py holds the options both commands share; data.py generates the model's own continuations with the
engine; calls.py builds the drafting calls the engine issues, over a prefix cache the base model computes;
lora.py attaches the trainable adapter and saves it in PEFT's layout; profile.py measures per-slot acceptance
and the acceptance profile that `width="auto"` reads (packed_ss/width.py).
"""
