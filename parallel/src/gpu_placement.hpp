#pragma once
// Whether the members of a reducer group hold GPUs of their own: what
// decides between NCCL (one GPU per rank: NCCL refuses two ranks on one
// device) and the host ring for the collectives of tensors on GPUs
// (data_parallel's automatic reduction, tensor parallelism's device
// collectives). Private to parallel/.
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// A collective of the group (every member calls it, in the same place of
/// its sequence of collectives): an all-gather of each member's machine (the
/// kernel's boot id, so processes in network namespaces of one machine are
/// one machine, as their GPUs are) and `where`, a CUDA device. True, on
/// every member alike, when no two members name the same device of the
/// same machine.
expected<bool> every_member_has_its_own_gpu(reducer_group& group, device where);

} // namespace troupe::parallel
