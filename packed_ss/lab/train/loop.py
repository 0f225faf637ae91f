"""The optimisation loop both trainers run: per step the trainer's loss, a gradient step with clipping and
the scheduled learning rate, and a progress bar with the recent losses."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..progress import progress
from .optim import lr_mult

# () -> (loss to minimise, its named terms, extra fields for the progress bar)
StepLoss = Callable[[], tuple[torch.Tensor, dict[str, torch.Tensor], dict]]


def fit(model, optimizers, args, step_loss: StepLoss, history: list[dict[str, float]] | None = None,
        after_step: Callable[[int, list[dict[str, float]]], None] | None = None) -> list[dict[str, float]]:
    """Run --steps steps; `step_loss()` draws the next batch and returns (loss to minimise, its named terms,
    extra fields for the progress bar). Gradients are clipped to --grad-clip and every base lr is scaled by
    `lr_mult`. Returns the terms of every step, as floats. A resumed run passes the `history` of the steps
    already taken and continues after them; `after_step(steps done, history)` runs after every step."""
    model.train()
    history = [] if history is None else history
    with progress(args.steps, "training", interval=args.log_every_s, unit="step", initial=len(history)) as bar:
        for step in range(len(history), args.steps):
            loss, terms, shown = step_loss()
            for opt, _ in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            mult = lr_mult(step, args)
            for opt, base_lrs in optimizers:
                for group, lr in zip(opt.param_groups, base_lrs):
                    group["lr"] = lr * mult
                opt.step()
            history.append({name: value.item() for name, value in terms.items()})
            recent = history[-20:]
            means = {name: f"{sum(h[name] for h in recent) / len(recent):.3f}" for name in terms}
            bar.set_postfix({**means, **shown, "lr": f"x{mult:.3f}", "gn": f"{float(grad_norm):.2f}"}, refresh=False)
            bar.update()
            if after_step is not None:
                after_step(step + 1, history)
                model.train()
    return history


def mean_last(history: list[dict[str, float]], name: str, k: int = 50) -> float:
    """The mean of a loss term over the last k steps (fewer if the run was shorter), rounded to 4 places."""
    recent = history[-k:]
    return round(sum(h[name] for h in recent) / len(recent), 4)
