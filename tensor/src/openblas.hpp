// OpenBLAS, loaded by troupe itself rather than by the dynamic linker, so
// that troupe can choose its kernel and its thread count before OpenBLAS
// initialises. Both are read from the environment once, in OpenBLAS's own
// load-time constructor, and cannot be changed afterwards:
//
// - The kernel. A DYNAMIC_ARCH OpenBLAS (Debian's) picks its GEMM kernel
//   from the CPU's family and model. A CPU newer than the build falls back to
//   the oldest x86-64 kernel: on the Xeon (family 6, model 207) these
//   machines have, OpenBLAS 0.3.21 ran SGEMM with its SSE3 "Prescott" kernel
//   at 26-33 GFLOP/s instead of 140-160 GFLOP/s with the AVX-512 kernel the
//   CPU supports. troupe names the kernel from the CPU's features
//   (OPENBLAS_CORETYPE) unless the user already did.
// - The threads. In troupe every compute actor is a thread of its own; the
//   default (a thread per core inside every GEMM) would oversubscribe the
//   cores, and an idle OpenBLAS worker spins in sched_yield after start-up.
//   Unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set, OpenBLAS is loaded
//   with one thread and starts no workers at all.
//
// The process's environment is restored after loading: children see what the
// user set, not troupe's choice (benchmarks pass it on explicitly).
#pragma once

#include <cblas.h>

namespace troupe::detail {

/// The entry points troupe calls, resolved from the loaded library.
struct openblas_library {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
  /// openblas_set_num_threads: the process-wide thread count of GEMM.
  void (*set_num_threads)(int) = nullptr;
  /// The kernel OpenBLAS runs ("Cooperlake", "Haswell", ...).
  const char* core = "";
};

/// Loads OpenBLAS on first use (thread-safe); aborts with a message naming
/// the library when it cannot be loaded: nothing in troupe runs without it.
const openblas_library& openblas();

} // namespace troupe::detail
