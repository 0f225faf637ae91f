// Host API of the CUDA step epilogue (epilogue.cu): raw device pointers, the caller's stream.
// Plain C++: no CUDA, torch or pybind11 headers, so the binding compiles with the host compiler alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epilogue.h"

namespace pss {

// Launch one epilogue call on the whole batch (one thread block per request, st.batch of them, plus a
// copy of the retained Q rows under sampling, a [blocks, batch] grid) on `stream` (a cudaStream_t; 0 =
// legacy default). Asynchronous and CUDA-graph capturable: no allocation, no synchronisation. Returns 0
// (also for an empty batch, launching nothing), or a CUDA error code with a message in `err`.
int cuda_step_f32(const State& st, const Step<float>& s, int32_t phase, void* stream, char* err, size_t err_len);
int cuda_step_f64(const State& st, const Step<double>& s, int32_t phase, void* stream, char* err, size_t err_len);

// Number of visible CUDA devices, or -1 with the runtime's message in `err` (no driver, no device).
int cuda_device_count(char* err, size_t err_len);

// The SM architectures compiled in, e.g. "80;90".
const char* cuda_archs();

}  // namespace pss
