// The autograd-aware collectives of tensor parallelism
// (tensor_parallel_collectives.hpp): plain collectives on tensors, then one
// autograd node per pair whose backward is the conjugate collective.
#include "troupe/parallel/tensor_parallel_collectives.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/node.hpp"
#include "troupe/parallel/all_gather.hpp"
#include "troupe/parallel/reduce_scatter.hpp"
#include "troupe/parallel/ring_allreduce.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

#ifdef TROUPE_HAVE_NCCL
#include "troupe/parallel/nccl_communicator.hpp"
#endif

#include "gpu_placement.hpp"
#include "reducer_member.hpp"
#include "training_state.hpp"
#include "value_or_throw.hpp"

namespace troupe::parallel {

shard_range tensor_parallel_split(std::int64_t total, std::uint32_t degree, std::uint32_t rank) {
  require(total >= 0 && degree > 0 && rank < degree, "tensor_parallel_split: {} elements over {} ranks, rank {}",
          total, degree, rank);
  const auto piece = ring_segment(total, degree, rank);
  return {piece.begin, piece.end - piece.begin};
}

namespace {

std::int64_t normalized(const tensor& t, std::int64_t dim, const char* what) {
  const auto rank = t.rank();
  const auto d = dim < 0 ? dim + rank : dim;
  require(d >= 0 && d < rank, "{}: dimension {} of a {}-dimensional tensor", what, dim, rank);
  return d;
}

} // namespace

// -- tensors on GPUs ----------------------------------------------------------------------------
//
// The group's own collectives move host memory (the ring's messages, the
// same-host workspaces). Tensors on GPUs take NCCL where every member has a
// GPU of its own; where members share one (NCCL refuses two ranks on a
// device) or the build has no NCCL, they go through the host and their
// results come back onto the GPU, the same bits as on the CPU. The group's
// first collective on a GPU decides, for every member alike (it is a
// collective: gpu_placement.hpp), and makes the communicator.

#ifdef TROUPE_HAVE_NCCL
using device_communicator = nccl_communicator;
#else
/// Never made: without NCCL every tensor on a GPU goes through the host.
struct device_communicator {
  expected<void> allreduce(const tensor&) { return no_nccl(); }
  expected<tensor> all_gather(const tensor&) { return no_nccl(); }
  expected<tensor> reduce_scatter(const tensor&) { return no_nccl(); }
  static error no_nccl() { return make_error(errc::invalid_argument, "this build has no NCCL"); }
};
#endif

struct device_collectives {
  device where;
  std::optional<device_communicator> nccl; ///< empty: through the host
};

namespace {

/// The NCCL communicator for `x`'s collectives, or nullptr: `x` on the
/// host, or the group's device tensors go through the host.
device_communicator* nccl_for(reducer_group& group, const tensor& x, const char* what) {
  if (x.where().kind != device_kind::cuda)
    return nullptr;
  auto& path = reducer_group_access::member(group).device_path();
  if (!path) {
    auto decided = std::make_shared<device_collectives>();
    decided->where = x.where();
#ifdef TROUPE_HAVE_NCCL
    if (value_or_throw(every_member_has_its_own_gpu(group, x.where()), what))
      decided->nccl.emplace(value_or_throw(
        nccl_communicator::create(group, {.where = x.where(), .timeout = group.options().timeout}), what));
#endif
    path = std::move(decided);
  }
  require(path->where == x.where(), "{}: this group's collectives on a GPU run on {}, but this tensor is on {}",
          what, path->where, x.where());
  return path->nccl ? &*path->nccl : nullptr;
}

// -- the collectives on tensors -----------------------------------------------------------------

tensor allreduced(reducer_group& group, const tensor& x, const char* what) {
  const auto where = x.where();
  if (auto* nccl = nccl_for(group, x, what)) {
    auto out = x.contiguous().clone();
    value_or_throw(nccl->allreduce(out), what);
    return out;
  }
  auto out = host_copy(x, /*snapshot=*/true); // fresh: the ring reduces in place
  value_or_throw(ring_allreduce(group, out), what);
  return out.to(where);
}

tensor piece_of(reducer_group& group, const tensor& x, std::int64_t dim, const char* what) {
  const auto d = normalized(x, dim, what);
  const auto mine = tensor_parallel_split(x.shape()[d], group.size(), group.rank());
  return x.slice(d, mine.offset, mine.offset + mine.size).contiguous();
}

/// Every rank's piece along `dim` joined in rank order. Pieces are padded
/// to the largest (rank 0's) so that the ring's equal segments are the
/// pieces, then cut back.
tensor gathered(reducer_group& group, const tensor& x_anywhere, std::int64_t dim, std::int64_t total,
                const char* what) {
  auto* nccl = nccl_for(group, x_anywhere, what);
  const auto x = nccl ? x_anywhere : x_anywhere.to(device::cpu());
  const auto d = normalized(x, dim, what);
  const auto n = group.size();
  const auto mine = tensor_parallel_split(total, n, group.rank());
  require(x.shape()[d] == mine.size, "{}: rank {} holds {} of dimension {} but its piece of {} is {}", what,
          group.rank(), x.shape()[d], d, total, mine.size);
  auto padded_shape = x.shape();
  padded_shape[d] = tensor_parallel_split(total, n, 0).size;
  auto padded = tensor::zeros(padded_shape, x.type(), x.where());
  padded.slice(d, 0, mine.size).copy_from(x);
  auto all = value_or_throw(nccl ? nccl->all_gather(padded) : all_gather(group, padded), what);
  const auto per_rank = padded.numel();
  std::vector<tensor> pieces;
  for (std::uint32_t r = 0; r < n; ++r) {
    const auto size = tensor_parallel_split(total, n, r).size;
    pieces.push_back(all.slice(0, r * per_rank, (r + 1) * per_rank).view(padded_shape).slice(d, 0, size));
  }
  return cat(pieces, d).to(x_anywhere.where());
}

/// The group's sum of `x`, this rank's piece along `dim`: the dimension is
/// moved to the front and padded so that the ring's segments are the pieces.
tensor reduce_scattered(reducer_group& group, const tensor& x_anywhere, std::int64_t dim, const char* what) {
  auto* nccl = nccl_for(group, x_anywhere, what);
  const auto x = nccl ? x_anywhere : x_anywhere.to(device::cpu());
  const auto d = normalized(x, dim, what);
  const auto n = group.size();
  const auto total = x.shape()[d];
  const auto largest = tensor_parallel_split(total, n, 0).size;
  auto front = x.transpose(0, d); // a view; pieces are row ranges of it
  auto row_shape = front.shape();
  row_shape[0] = largest;
  auto padded_shape = row_shape;
  padded_shape[0] = largest * n;
  auto padded = tensor::zeros(padded_shape, x.type(), x.where());
  for (std::uint32_t r = 0; r < n; ++r) {
    const auto piece = tensor_parallel_split(total, n, r);
    padded.slice(0, r * largest, r * largest + piece.size).copy_from(front.slice(0, piece.offset, piece.offset + piece.size));
  }
  auto reduced = value_or_throw(nccl ? nccl->reduce_scatter(padded) : reduce_scatter(group, padded), what);
  const auto mine = tensor_parallel_split(total, n, group.rank());
  return reduced.view(row_shape).slice(0, 0, mine.size).transpose(0, d).contiguous().to(x_anywhere.where());
}

// -- autograd ------------------------------------------------------------------------------------

/// One input, one output; backward maps the output's gradient with `conjugate`.
template <class Conjugate> class collective_backward final : public autograd::node {
public:
  collective_backward(const char* name, const autograd::variable& input, Conjugate conjugate)
      : name_(name), conjugate_(std::move(conjugate)) {
    set_next_edges({autograd::gradient_edge(input)});
  }
  std::vector<tensor> apply(std::vector<tensor> grads) override {
    if (grads.empty() || !grads[0].defined())
      return {tensor{}};
    return {conjugate_(grads[0])};
  }
  std::string name() const override { return name_; }

private:
  const char* name_;
  Conjugate conjugate_;
};

template <class Conjugate>
autograd::variable with_backward(tensor out, const autograd::variable& x, const char* name, Conjugate conjugate) {
  if (!autograd::grad_enabled() || !x.requires_grad())
    return autograd::variable(std::move(out));
  return autograd::variable::make_result(
      std::move(out), std::make_shared<collective_backward<Conjugate>>(name, x, std::move(conjugate)));
}

} // namespace

autograd::variable copy_to_group(const autograd::variable& x, reducer_group& group) {
  return with_backward(x.data(), x, "copy_to_group_backward",
                       [g = reducer_group_access::share(group)](const tensor& grad) mutable {
                         return allreduced(g, grad, "copy_to_group backward");
                       });
}

autograd::variable reduce_from_group(const autograd::variable& x, reducer_group& group) {
  return with_backward(allreduced(group, x.data(), "reduce_from_group"), x, "reduce_from_group_backward",
                       [](const tensor& grad) { return grad; });
}

autograd::variable scatter_to_group(const autograd::variable& x, reducer_group& group, std::int64_t dim) {
  const auto total = x.data().shape()[normalized(x.data(), dim, "scatter_to_group")];
  return with_backward(piece_of(group, x.data(), dim, "scatter_to_group"), x, "scatter_to_group_backward",
                       [g = reducer_group_access::share(group), dim, total](const tensor& grad) mutable {
                         return gathered(g, grad, dim, total, "scatter_to_group backward");
                       });
}

autograd::variable gather_from_group(const autograd::variable& x, reducer_group& group, std::int64_t dim,
                                     std::int64_t total) {
  return with_backward(gathered(group, x.data(), dim, total, "gather_from_group"), x, "gather_from_group_backward",
                       [g = reducer_group_access::share(group), dim](const tensor& grad) mutable {
                         return piece_of(g, grad, dim, "gather_from_group backward");
                       });
}

autograd::variable reduce_scatter_to_group(const autograd::variable& x, reducer_group& group, std::int64_t dim) {
  const auto total = x.data().shape()[normalized(x.data(), dim, "reduce_scatter_to_group")];
  return with_backward(reduce_scattered(group, x.data(), dim, "reduce_scatter_to_group"), x,
                       "reduce_scatter_to_group_backward",
                       [g = reducer_group_access::share(group), dim, total](const tensor& grad) mutable {
                         return gathered(g, grad, dim, total, "reduce_scatter_to_group backward");
                       });
}

autograd::variable all_gather_from_group(const autograd::variable& x, reducer_group& group, std::int64_t dim,
                                         std::int64_t total) {
  return with_backward(gathered(group, x.data(), dim, total, "all_gather_from_group"), x,
                       "all_gather_from_group_backward",
                       [g = reducer_group_access::share(group), dim](const tensor& grad) mutable {
                         return reduce_scattered(g, grad, dim, "all_gather_from_group backward");
                       });
}

autograd::variable all_gather_from_group(const autograd::variable& x, reducer_group& group, std::int64_t dim) {
  constexpr const char* what = "all_gather_from_group";
  const auto d = normalized(x.data(), dim, what);
  auto mine = tensor::full({1}, static_cast<double>(x.data().shape()[d]), dtype::float64);
  auto sizes = value_or_throw(all_gather(group, mine), what).to_vector<double>();
  std::int64_t total = 0;
  for (auto size : sizes)
    total += static_cast<std::int64_t>(size);
  for (std::uint32_t r = 0; r < group.size(); ++r)
    require(static_cast<std::int64_t>(sizes[r]) == tensor_parallel_split(total, group.size(), r).size,
            "{}: the members' pieces along dimension {} are not tensor_parallel_split's of {} (rank {} holds {})",
            what, d, total, r, sizes[r]);
  return all_gather_from_group(x, group, dim, total);
}

} // namespace troupe::parallel
