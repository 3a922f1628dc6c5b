#pragma once
// Private: what kind of backward pass is running on this thread, so that a
// checkpoint node's nested pass does the same kind of work (accumulate into
// leaves for backward(), only compute input gradients for grad()).

namespace troupe::autograd {

class pass_scope {
public:
  explicit pass_scope(bool accumulating) noexcept;
  ~pass_scope();
  pass_scope(const pass_scope&) = delete;
  pass_scope& operator=(const pass_scope&) = delete;

  /// True outside any pass and inside backward(); false inside grad().
  static bool accumulating() noexcept;

private:
  bool previous_;
};

} // namespace troupe::autograd
