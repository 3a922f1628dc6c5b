#include "troupe/autograd/grad_mode.hpp"

namespace troupe::autograd {

namespace {
thread_local bool grad_enabled_flag = true;
} // namespace

bool grad_enabled() noexcept { return grad_enabled_flag; }
void set_grad_enabled(bool enabled) noexcept { grad_enabled_flag = enabled; }

} // namespace troupe::autograd
