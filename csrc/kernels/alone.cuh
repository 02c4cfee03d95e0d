// A dispatch alone (one rank), from plain routing tables: no peer, no pool, so every row goes
// from x straight to its output rows. The NVSHMEM protocol launches these alone in place of
// its dispatch_kernel. They need no transport, so they are built into symmoe_cuda, compiled
// whole as the CUDA protocols' data kernels are: built into the NVSHMEM module (relocatable
// device code), the fan-out ran 205 µs against 142 here, and that module's dispatch_kernel
// spills registers.
//   alone_fan_kernel   expert-major (alone_fan.cuh)
//   alone_rows_kernel  rank-major (alone_rows.cuh)
#pragma once

#include "alone_fan.cuh"
#include "alone_rows.cuh"
