"""One decode step: acceptance, sampling (Philox), the device-resident state, the epilogue interface with its
torch and native implementations, the left-to-right schedules and the any-order (paper Alg. 3) schedules."""
