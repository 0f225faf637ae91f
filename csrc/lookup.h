// The lookup drafter (packed_ss/decode/lookup.py), request by request on the CPU: the continuation, the draft
// cut at its first stop, and the point mass that is a lookup draft's Q.
//
// Row b of hay [batch, length] (tokens >= 0, -1 for none) ends at end[b]. Its last n tokens, n from `ngrams`
// (longest first), are looked up at every earlier end e <= end - 2, the most recent winning; the draft is
// the `width` tokens after the match, continued past the end as a copy of itself (period end - 1 - e), and
// order[b] the n of the match (0: none, and a meaningless draft). It reproduces the torch reference exactly,
// the rows without a match included.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pss {

constexpr int kMaxNgram = 8;

inline void lookup_row(const int64_t* hay, int64_t length, int64_t end, const int64_t* ngrams, int64_t n_ngrams,
                       int64_t width, int64_t* draft, int64_t* order) {
  int64_t longest = 0;
  for (int64_t j = 0; j < n_ngrams; ++j) longest = std::max(longest, ngrams[j]);
  int64_t suffix[kMaxNgram];
  int64_t valid = 0;  // suffix tokens 0 .. valid - 1 exist (the last, the one before, ...)
  while (valid < longest && end > valid && hay[std::max<int64_t>(end - 1 - valid, 0)] >= 0) {
    suffix[valid] = hay[end - 1 - valid];
    ++valid;
  }
  int64_t latest[kMaxNgram + 1];  // latest[n]: the most recent end of a match of the last n tokens, -1: none
  std::fill(latest, latest + kMaxNgram + 1, int64_t{-1});
  int64_t found = 0;              // the longest n whose latest end is known: the scan goes back from the end
  for (int64_t e = std::min(end - 2, length - 1); e >= 0 && found < valid; --e) {
    int64_t n = 0;
    while (n < valid && e - n >= 0 && hay[e - n] == suffix[n]) ++n;
    for (int64_t k = found + 1; k <= n; ++k) latest[k] = e;
    found = std::max(found, n);
  }
  int64_t best = -1;
  *order = 0;
  for (int64_t j = 0; j < n_ngrams && best < 0; ++j) {
    if (ngrams[j] <= valid && latest[ngrams[j]] >= 0) {
      best = latest[ngrams[j]];
      *order = ngrams[j];
    }
  }
  const int64_t period = std::max<int64_t>(end - 1 - best, 1);
  for (int64_t i = 0; i < width; ++i) {
    const int64_t src = std::clamp<int64_t>(end - period + i % period, 0, length - 1);
    draft[i] = hay[src];
  }
}

// lookup.py's lookup_draft over a batch-major DecodeState, request by request: the sequence of request b is
// context[b] [context_len] (-1 before the prompt) then out[b, :n_out[b]] (out [batch, out_len]), searched as one
// row of context_len + out_len tokens that ends at context_len + n_out[b], without concatenating the batch; its
// continuation (draft [batch, width], order [batch]) is cut after its first stop (any of stop_ids[b] [n_stop]):
// length[b] counts the tokens up to and including it, else width.
inline void lookup_draft_rows(const int64_t* context, int64_t context_len, const int64_t* out, int64_t out_len,
                              const int64_t* n_out, const int64_t* stop_ids, int64_t n_stop, int64_t batch,
                              const int64_t* ngrams, int64_t n_ngrams, int64_t width, int64_t* draft,
                              int64_t* length, int64_t* order) {
  std::vector<int64_t> hay(context_len + out_len);
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(context + b * context_len, context + (b + 1) * context_len, hay.begin());
    std::copy(out + b * out_len, out + (b + 1) * out_len, hay.begin() + context_len);
    int64_t* d = draft + b * width;
    lookup_row(hay.data(), context_len + out_len, context_len + n_out[b], ngrams, n_ngrams, width, d, order + b);
    const int64_t* stops = stop_ids + b * n_stop;
    length[b] = width;
    for (int64_t i = 0; i < width && length[b] == width; ++i)
      if (std::find(stops, stops + n_stop, d[i]) != stops + n_stop) length[b] = i + 1;
  }
}

// A lookup draft's stored Q in one request's rows q [width, support] (dense, idx = token): zeroed, then 1 on each
// draft token (a negative one: on token 0).
template <typename T>
inline void point_mass_row(T* q, const int64_t* draft, int64_t width, int64_t support) {
  std::fill(q, q + width * support, T(0));
  for (int64_t i = 0; i < width; ++i) q[i * support + std::max<int64_t>(draft[i], 0)] = T(1);
}

// Epilogue.point_mass: the point mass Q of the requests `rows` [batch] that take a lookup draft [batch, width].
template <typename T>
inline void point_mass_rows(T* q_prob, const int64_t* draft, const bool* rows, int64_t batch, int64_t width,
                            int64_t support) {
  for (int64_t b = 0; b < batch; ++b)
    if (rows[b]) point_mass_row(q_prob + b * width * support, draft + b * width, width, support);
}

// Epilogue.take_lookup, request by request: an unfinished request takes its lookup draft (draft [batch, width],
// length) where one was found (order > 0), it is preferred to the proposals its call kept or none were kept, and
// the request is not quiet (passive), with a point mass Q where q_prob is given; otherwise it keeps its proposals
// where it kept them and is not quiet, else it has no draft. lookup_draft (or null) says which took a lookup draft.
struct TakeLookup {
  const int64_t* draft;      // [B, W]
  const int64_t* length;     // [B]
  const int64_t* order;      // [B]
  const bool* preferred;     // [B]
  const bool* keep;          // [B]
  const bool* passive;       // [B]
  const bool* done;          // [B]
  int64_t* st_draft;         // [B, W]
  int64_t* st_draft_len;     // [B]
  bool* lookup_draft;        // [B] or null
  int64_t batch, width;
};

template <typename T>
inline void take_lookup_rows(const TakeLookup& a, T* q_prob, int64_t support) {
  for (int64_t b = 0; b < a.batch; ++b) {
    if (a.done[b]) continue;
    const bool lookup = a.order[b] > 0 && (a.preferred[b] || !a.keep[b]) && !a.passive[b];
    if (lookup) {
      std::copy(a.draft + b * a.width, a.draft + (b + 1) * a.width, a.st_draft + b * a.width);
      a.st_draft_len[b] = a.length[b];
      if (q_prob) point_mass_row(q_prob + b * a.width * support, a.draft + b * a.width, a.width, support);
    } else if (!a.keep[b] || a.passive[b]) {
      a.st_draft_len[b] = 0;
    }
    if (a.lookup_draft) a.lookup_draft[b] = lookup;
  }
}

}  // namespace pss
