#pragma once
// How many threads one CPU op may use in this process: one by default, the
// rule every distributed figure of troupe's uses (each compute actor is a
// thread of its own, and a second thread per op would take another actor's
// core). A program that trains in one process can give its ops every core,
// as torch.set_num_threads does (char_lm's --threads=N).
// From examples/char_lm.cpp:
//
//   troupe::set_intra_op_threads(static_cast<int>(threads));
//
// or, for a job, `--troupe.intra-op-threads=4` (node_options). GEMMs then
// run on that many OpenBLAS threads; elementwise ops, softmax, layer norm's
// forward, cross-entropy and the optimizers' updates split their contiguous
// rows or elements into that many ranges. Each output element is computed
// by the same code whichever range holds it, so results are bitwise the
// same for any thread count, except a GEMM's (OpenBLAS may split its
// summation). Reductions over a whole tensor, strided views and the
// backward of layer norm (which sums over rows) stay on one thread.
namespace troupe {

/// Sets the count for every op started afterwards, in every thread of the
/// process; at least 1. Throws usage_error for 0 or less.
void set_intra_op_threads(int threads);

/// The count set (1 unless set_intra_op_threads changed it).
int intra_op_threads() noexcept;

} // namespace troupe
