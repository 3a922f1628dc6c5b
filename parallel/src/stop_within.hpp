#pragma once
// A bound on a finished job's node stop (job::finish). Private to parallel/.
#include <chrono>
#include <functional>
#include <string>

namespace troupe::parallel {

/// Runs `stop` (the node's shutdown once the job's work is done) and ends
/// the process with `status` if it has not returned within `bound`: a
/// shutdown that hangs (the node's stop_watch says in which phase) must not
/// keep the process, and the launcher waiting on it, from ending. The
/// trace of such a process may lack its last events.
void stop_within(std::chrono::milliseconds bound, const std::string& program, int status,
                 const std::function<void()>& stop);

} // namespace troupe::parallel
