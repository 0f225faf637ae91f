// Host API of shared-noise sampling on CUDA (noise.cu): raw device pointers, the caller's stream.
// Plain C++: no CUDA, torch or pybind11 headers, so the binding compiles with the host compiler alone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pss {

// tokens[r] = the race of row r (noise.h sample_rows_cpu), one thread block per row (at most 2^31 - 1), on
// `stream`. Returns 0, or a CUDA error code with a message in `err`.
int cuda_race_rows_f32(const int64_t* seed, const int64_t* position, int64_t n_rows, int64_t rows_per_seed,
                       const float* prob, const int64_t* idx, int64_t k, int64_t* tokens, void* stream, char* err,
                       size_t err_len);
int cuda_race_rows_f64(const int64_t* seed, const int64_t* position, int64_t n_rows, int64_t rows_per_seed,
                       const double* prob, const int64_t* idx, int64_t k, int64_t* tokens, void* stream, char* err,
                       size_t err_len);

}  // namespace pss
