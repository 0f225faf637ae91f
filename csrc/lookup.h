// The lookup drafter's continuation (packed_ss/decode/lookup.py `continuation`), row by row on the CPU.
//
// Row b of hay [batch, length] (tokens >= 0, -1 for none) ends at end[b]. Its last n tokens, n from `ngrams`
// (longest first), are looked up at every earlier end e <= end - 2, the most recent winning; the draft is
// the `width` tokens after the match, continued past the end as a copy of itself (period end - 1 - e), and
// order[b] the n of the match (0: none, and a meaningless draft). It reproduces the torch reference exactly,
// the rows without a match included.
#pragma once

#include <algorithm>
#include <cstdint>

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

// Every row of a batch: hay [batch, length], end [batch] -> draft [batch, width], order [batch].
inline void lookup_rows(const int64_t* hay, const int64_t* end, int64_t batch, int64_t length, const int64_t* ngrams,
                        int64_t n_ngrams, int64_t width, int64_t* draft, int64_t* order) {
  for (int64_t b = 0; b < batch; ++b)
    lookup_row(hay + b * length, length, end[b], ngrams, n_ngrams, width, draft + b * width, order + b);
}

}  // namespace pss
