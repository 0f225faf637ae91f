// The adaptive schedule's choice (packed_ss/decode/policy.py `Policy.choose`), request by request on the CPU.
//
// It reproduces the torch reference's float32 arithmetic operation by operation (a cumulative sum and the
// batch's sums accumulate in double, as the reference does; no fused multiply-adds: CMakeLists builds with
// -ffp-contract=off), so both pick the same shapes and quiet periods.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pss {

struct PolicyNumbers {   // the policy's constants (Policy.constants) and scalars
  const float* costs;        // [S, 2]: ms per iteration at batch 1 and cost_batch
  const int64_t* widths;     // [S]
  const int64_t* masks;      // [S]
  const int64_t* estimate;   // [S]: a packed shape's column of the diffusion estimates
  int64_t shapes, width, orders, packed;   // S, W, N + 1, P
  float row, call, margin;
  int64_t cost_batch, doze, run_first, run_last;
  bool per_request;
};

struct PolicyRows {      // the state's rows [B, ...] and the choice's inputs
  const float* look_hit;     // [B, N + 1, W]
  const float* look_order;   // [B, N + 1]
  const float* diffusion;    // [B, P]
  const int64_t* length;     // [B]: the next lookup draft's length
  const int64_t* order;      // [B]: ... and the order of its match (0: none)
  const bool* done;
  const bool* passive;
  const bool* greedy;
  const bool* queued;
  const int64_t* nfe;
  int64_t* choice;
  int64_t* quiet_until;
  int64_t* quiet_run;
  int64_t batch;
};

// Policy.expected for one request: tokens [S] of each shape, given its draft (`hit` [W], `length`, `order`).
inline void expected_row(const PolicyNumbers& p, const float* hit, int64_t length, int64_t order,
                         const float* diffusion, float* out) {
  std::vector<float> gain(p.width);
  double sum = 0.0;
  for (int64_t k = 0; k < p.width; ++k) {
    sum += static_cast<double>(hit[k] * (k < length ? 1.0f : 0.0f));
    gain[k] = 1.0f + static_cast<float>(sum);
  }
  bool preferred = order > 0;
  if (p.packed > 0) {
    float best = diffusion[0];
    for (int64_t j = 1; j < p.packed; ++j) best = std::max(best, diffusion[j]);
    preferred = preferred && gain[p.width - 1] >= best;
  }
  for (int64_t s = 0; s < p.shapes; ++s) {
    const float at_width = gain[std::max<int64_t>(p.widths[s], 1) - 1];
    const float drafted = (order > 0 && p.widths[s] > 0) ? at_width : 1.0f;
    if (p.packed > 0 && p.masks[s] > 0)
      out[s] = preferred ? at_width : diffusion[p.estimate[s]];
    else
      out[s] = drafted;
  }
}

// Policy.best: the shape of the most tokens per ms, AR's rate counted `margin` times (the first on a tie).
inline int64_t best_shape(const PolicyNumbers& p, const float* tokens, const float* cost) {
  int64_t best = 0;
  float top = (tokens[0] / cost[0]) * p.margin;
  for (int64_t s = 1; s < p.shapes; ++s) {
    const float rate = tokens[s] / cost[s];
    if (rate > top) top = rate, best = s;
  }
  return best;
}

// Policy.batch_tokens over the rows `counted` (the choosing ones): what each shape earns the batch [S].
inline void batch_tokens(const PolicyNumbers& p, const PolicyRows& r, const std::vector<float>& expected,
                         const std::vector<char>& counted, float ar_cost, float* out) {
  const int64_t S = p.shapes;
  bool queued = false;
  int64_t n = 0;
  for (int64_t b = 0; b < r.batch; ++b) queued = queued || r.queued[b], n += counted[b] ? 1 : 0;
  for (int64_t s = 0; s < S; ++s) {
    double sum = 0.0;
    float most = 0.0f;
    for (int64_t b = 0; b < r.batch; ++b) {
      const float gain = counted[b] ? expected[b * S + s] - 1.0f : 0.0f;
      sum += static_cast<double>(gain);
      most = b == 0 ? gain : std::max(most, gain);
    }
    float least = 0.0f;
    for (int64_t b = 0; b < r.batch; ++b) {
      const float gain = r.done[b] ? most : (counted[b] ? expected[b * S + s] - 1.0f : 0.0f);
      least = b == 0 ? gain : std::min(least, gain);
    }
    const float total = static_cast<float>(sum);
    const float closed = (p.row * total + p.call * least) * static_cast<float>(r.batch) / ar_cost;
    out[s] = static_cast<float>(n) + (queued ? total : closed);
  }
}

// Policy.choose: each request's shape for the next iteration and its quiet period.
inline void choose_rows(const PolicyNumbers& p, const PolicyRows& r) {
  const int64_t B = r.batch, S = p.shapes, W = p.width, N = p.orders - 1;
  std::vector<float> expected(B * S), at_batch(S), marginal(S), tokens(S), full(S), none(S), potential(S);
  std::vector<char> choosing(B), greedy_choosing(B);
  const float step = static_cast<float>(static_cast<double>(B - 1) / static_cast<double>(p.cost_batch - 1));
  for (int64_t s = 0; s < S; ++s) {
    at_batch[s] = p.costs[2 * s] + (p.costs[2 * s + 1] - p.costs[2 * s]) * step;
    marginal[s] = p.costs[1] / static_cast<float>(p.cost_batch) + (p.costs[2 * s + 1] - p.costs[1]);
  }
  for (int64_t b = 0; b < B; ++b) {
    choosing[b] = !r.done[b] && !r.passive[b];
    greedy_choosing[b] = choosing[b] && r.greedy[b];
    const int64_t order = r.order[b];
    expected_row(p, r.look_hit + (b * p.orders + order) * W, r.length[b], order, r.diffusion + b * p.packed,
                 &expected[b * S]);
  }
  batch_tokens(p, r, expected, p.per_request ? greedy_choosing : choosing, at_batch[0], tokens.data());
  const int64_t free = best_shape(p, tokens.data(), at_batch.data());
  for (int64_t b = 0; b < B; ++b) {
    const bool sampled_alone = p.per_request && !r.greedy[b];
    const float* cost = sampled_alone ? marginal.data() : at_batch.data();
    int64_t own = free;
    if (sampled_alone) own = best_shape(p, &expected[b * S], cost);
    if (choosing[b] || !p.per_request) r.choice[b] = own;
    if (!choosing[b]) continue;
    const float* hit = r.look_hit + b * p.orders * W;
    const float* diffusion = r.diffusion + b * p.packed;
    const float found = 1.0f - r.look_order[b * p.orders];
    expected_row(p, hit, W, N, diffusion, full.data());
    expected_row(p, hit, 0, 0, diffusion, none.data());
    for (int64_t s = 0; s < S; ++s) potential[s] = none[s] + found * (full[s] - none[s]);
    const bool hopeless = best_shape(p, potential.data(), cost) == 0;
    if (own == 0) {
      r.quiet_until[b] = r.nfe[b] + (hopeless ? r.quiet_run[b] : p.doze);
      if (hopeless) r.quiet_run[b] = std::min<int64_t>(2 * r.quiet_run[b], p.run_last);
    }
    if (!hopeless) r.quiet_run[b] = p.run_first;
  }
}

}  // namespace pss
