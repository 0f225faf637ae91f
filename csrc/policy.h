// The adaptive schedule's policy (packed_ss/decode/policy.py), request by request on the CPU: its choice
// (`Policy.choose`) and the statistics it keeps after each step (`observe`, `score_lookup`, `prefers_lookup`).
//
// It reproduces the torch reference's float32 arithmetic operation by operation (a cumulative sum and the
// batch's sums accumulate in double, as the reference does; no fused multiply-adds: CMakeLists builds with
// -ffp-contract=off), so both keep the same statistics and pick the same shapes and quiet periods.
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

// Policy.lookup_gain for one request: the expected tokens gain [W] of verifying its lookup draft (`length` tokens,
// each right as often as `hit` [W] says) at widths 1..W.
inline void lookup_gain(int64_t width, const float* hit, int64_t length, float* gain) {
  double sum = 0.0;
  for (int64_t k = 0; k < width; ++k) {
    sum += static_cast<double>(hit[k] * (k < length ? 1.0f : 0.0f));
    gain[k] = 1.0f + static_cast<float>(sum);
  }
}

// Policy.prefers_lookup for one request: a lookup draft (a match of order > 0) expected to earn, at full width
// (`full_gain`), as much as the best of its `packed` diffusion estimates.
inline bool prefers_lookup(float full_gain, int64_t order, const float* diffusion, int64_t packed) {
  bool preferred = order > 0;
  if (packed > 0) {
    float best = diffusion[0];
    for (int64_t j = 1; j < packed; ++j) best = std::max(best, diffusion[j]);
    preferred = preferred && full_gain >= best;
  }
  return preferred;
}

// Policy.prefers_lookup over the batch: `preferred` [B], given each request's lookup draft (`length`, `order`) and
// look_hit [B, orders, W].
inline void prefers_lookup_rows(const float* look_hit, const float* diffusion, const int64_t* length,
                                const int64_t* order, int64_t batch, int64_t width, int64_t orders, int64_t packed,
                                bool* preferred) {
  std::vector<float> gain(width);
  for (int64_t b = 0; b < batch; ++b) {
    lookup_gain(width, look_hit + (b * orders + order[b]) * width, length[b], gain.data());
    preferred[b] = prefers_lookup(gain[width - 1], order[b], diffusion + b * packed, packed);
  }
}

// Policy.expected for one request: tokens [S] of each shape, given its draft (`hit` [W], `length`, `order`).
inline void expected_row(const PolicyNumbers& p, const float* hit, int64_t length, int64_t order,
                         const float* diffusion, float* out) {
  std::vector<float> gain(p.width);
  lookup_gain(p.width, hit, length, gain.data());
  const bool preferred = prefers_lookup(gain[p.width - 1], order, diffusion, p.packed);
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

// Policy.score_lookup, request by request: score each active request's probe against the tokens it emitted since
// (its leading tokens right, among those emitted), fold a settled probe into the rows of look_hit of its order and
// of any order, count the order of the new match in look_order, and probe the new lookup draft once settled.
struct LookupScore {
  float* look_hit;            // [B, orders, W]
  float* look_order;          // [B, orders]
  int64_t* probe;             // [B, W]
  int64_t* probe_len;         // [B]
  int64_t* probe_at;          // [B]
  int64_t* probe_order;       // [B]
  const int64_t* out;         // [B, out_len]
  const int64_t* n_out;       // [B]
  const int64_t* draft;       // [B, W]: the new lookup draft
  const int64_t* length;      // [B]: ... its length
  const int64_t* order;       // [B]: ... and the order of its match (0: none)
  const bool* done;
  const bool* passive;
  int64_t batch, width, orders, out_len;
  float rate;
};

inline void score_lookup_rows(const LookupScore& a) {
  const int64_t W = a.width;
  for (int64_t b = 0; b < a.batch; ++b) {
    if (a.done[b] || a.passive[b]) continue;
    const int64_t at = a.probe_at[b], len = a.probe_len[b];
    const int64_t compared = std::min(a.n_out[b] - at, len);
    int64_t right = 0;
    while (right < W && right < compared &&
           a.out[b * a.out_len + std::min(at + right, a.out_len - 1)] == a.probe[b * W + right])
      ++right;
    const bool settled = right < compared || compared >= len;
    if (settled && len > 0) {
      for (int64_t r = 0; r < a.orders; ++r) {
        if (r != 0 && r != a.probe_order[b]) continue;
        float* hit = a.look_hit + (b * a.orders + r) * W;
        for (int64_t k = 0; k < std::min(len, W); ++k)
          hit[k] = hit[k] + a.rate * ((k < right ? 1.0f : 0.0f) - hit[k]);
      }
    }
    float* seen = a.look_order + b * a.orders;
    for (int64_t r = 0; r < a.orders; ++r) seen[r] = seen[r] + a.rate * ((r == a.order[b] ? 1.0f : 0.0f) - seen[r]);
    if (!settled) continue;
    std::copy(a.draft + b * W, a.draft + (b + 1) * W, a.probe + b * W);
    a.probe_len[b] = a.order[b] > 0 ? a.length[b] : 0;
    a.probe_at[b] = a.n_out[b];
    a.probe_order[b] = a.order[b];
  }
}

// Policy.observe, request by request: a steady packed run that verified a diffusion draft (the same shape the step
// before) moves that shape's estimate toward the tokens it emitted; every other estimate drifts to its prior.
struct DiffusionObservation {
  float* diffusion;           // [B, P]
  int64_t* last_ran;          // [B]: the shape each request ran the step before; becomes `ran`
  const float* prior;         // [P]
  const int64_t* packed;      // [P]: the packed shapes' indices
  const int64_t* ran;         // [B]
  const int64_t* emitted;     // [B]
  const bool* verified_lookup;
  const bool* done;
  const bool* passive;
  int64_t batch, packed_shapes;
  float rate, drift;
};

inline void observe_rows(const DiffusionObservation& a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    if (a.done[b] || a.passive[b]) continue;
    const bool steady = a.last_ran[b] == a.ran[b] && !a.verified_lookup[b];
    float* estimate = a.diffusion + b * a.packed_shapes;
    for (int64_t j = 0; j < a.packed_shapes; ++j) {
      const float d = estimate[j];
      estimate[j] = (steady && a.ran[b] == a.packed[j]) ? d + a.rate * (static_cast<float>(a.emitted[b]) - d)
                                                        : d + a.drift * (a.prior[j] - d);
    }
    a.last_ran[b] = a.ran[b];
  }
}

}  // namespace pss
