"""Plain-Python any-order decoders: the oracles of the confidence order and of the native threshold decoder.

They decide everything themselves, on the host, from one uncached forward pass per prediction
(packed_ss.decode.any_order.serial.logits_at: the prompt and a context of accepted pairs as causal rows, one
mask query; no cache, no packing, none of the decoder's device state):
- `speculative`: paper Alg. 3 greedy for Packed-SS, Quadratic-SS and Linear-SS, the window U_t (line 4), the
  order pi_t by the E.6 rule (decreasing score, ties by position, unscored positions last in textual order;
  Packed-SS scores a draft by the probability its proposal gave it, Quadratic-SS by its selected branch's,
  Linear-SS by the previous verifier's top probability), the verifier's prediction at each rank given the
  drafts of the ranks before it (eq. 8), h_t, A_t = min(h_t + 1, u_t), and the next drafts;
- `threshold`: the threshold decoder of E.6, every unresolved window position predicted from P, the positions
  with confidence >= 0.9 committed in textual order, at least the most confident one.
Each returns the output tokens and, per iteration, the positions it verified in order and how many it
accepted (the threshold decoder: the positions it committed), for comparison with the engine's trace.
Confidences are float32 softmax probabilities of the row's logits, as the decoder scores them.
"""
from __future__ import annotations

import math

from packed_ss.decode.any_order.serial import logits_at


def _probs(model, prompt, context, position, drafting=False):
    return logits_at(model, prompt, context, position, drafting).float().softmax(-1).double()


def _top(probs) -> tuple[int, float]:
    token = int(probs.argmax())
    return token, float(probs[token])


def _window(out: dict[int, int], width: int, end: int) -> list[int]:
    left = min(j for j in range(end + 1) if j not in out)
    return [j for j in range(left, min(end, left + width - 1) + 1) if j not in out]


def _order(window: list[int], scores: dict[int, float], order: str) -> list[int]:
    if order == "ltr":
        return window
    scored = [j for j in window if math.isfinite(scores.get(j, math.nan))]
    return sorted(scored, key=lambda j: (-scores[j], j)) + [j for j in window if j not in scored]


def speculative(model, schedule: str, prompt: list[int], width: int, max_new: int, order: str):
    """(tokens, [(pi_t, A_t)]) of greedy any-order decoding with `schedule` and `order`, no stop tokens."""
    end, out, context = max_new - 1, {}, []          # context: P_t as (position, token) in acceptance order
    drafts: dict[int, int] = {}                       # D_{t-1}: position -> token
    scores: dict[int, float] = {}                     # the score of each position for the next order
    trace = []
    while len(out) < max_new:
        window = _window(out, width, end)
        pi = _order(window, scores, order)
        u = len(pi)
        if schedule == "linear":                       # the drafting call, from P_{t-1}
            drafts = {j: _top(_probs(model, prompt, context, j, drafting=True))[0] for j in pi}
        kappa = next((r for r, j in enumerate(pi) if j not in drafts), u)
        verifier_scores, h, accepted = {}, 0, []
        for r in range(min(kappa + 1, u)):             # eq. 8: rank r sees the drafts of ranks < r
            ranked = [(pi[s], drafts[pi[s]]) for s in range(r)]
            v, top = _top(_probs(model, prompt, context + ranked, pi[r]))
            verifier_scores[pi[r]] = top
            if r < kappa and drafts[pi[r]] == v:
                h += 1
                continue
            accepted = ranked + [(pi[r], v)]
            break
        else:                                          # all u drafts matched: no extra token
            accepted = [(j, drafts[j]) for j in pi]
        a = min(h + 1, u)
        assert len(accepted) == a
        if schedule == "linear":                       # the next order: the verifier's confidence at every rank
            for r in range(len(verifier_scores), u):
                ranked = [(pi[s], drafts[pi[s]]) for s in range(r)]
                verifier_scores[pi[r]] = _top(_probs(model, prompt, context + ranked, pi[r]))[1]
            proposals = {j: (None, verifier_scores[j]) for j in pi}
        else:                                          # Packed-SS: from P_{t-1}; Quadratic-SS: branch A_t - 1
            branch = [] if schedule == "packed" else [(pi[s], drafts[pi[s]]) for s in range(a - 1)]
            proposals = {j: _top(_probs(model, prompt, context + branch, j, drafting=True)) for j in pi}
        context += accepted
        out.update(accepted)
        drafts = {j: t for j, (t, _) in proposals.items() if j not in out and t is not None}
        scores = {j: s for j, (_, s) in proposals.items() if j not in out}
        trace.append((pi, a))
    return [out[j] for j in range(max_new)], trace


def threshold(model, prompt: list[int], width: int, max_new: int, level: float = 0.9):
    """(tokens, [committed positions]) of the native threshold decoder."""
    end, out, context, trace = max_new - 1, {}, [], []
    while len(out) < max_new:
        window = _window(out, width, end)
        predicted = {j: _top(_probs(model, prompt, context, j)) for j in window}
        best = max(window, key=lambda j: (predicted[j][1], -j))
        committed = [j for j in window if predicted[j][1] >= level or j == best]
        context += [(j, predicted[j][0]) for j in committed]
        out.update(context[-len(committed):])
        trace.append(committed)
    return [out[j] for j in range(max_new)], trace
