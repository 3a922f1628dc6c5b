// Indexing ops. Index values come from the caller's data, so every one is
// checked here before a kernel dereferences it.
#include "ops_common.hpp"

namespace troupe {

using namespace detail;

tensor index_select(const tensor& a, std::int64_t dim, const tensor& index) {
  require_defined("index_select", a, "input");
  require_index("index_select", index, "index");
  require_same_device("index_select", a, index);
  require_rank("index_select", index, 1, "index");
  auto d = normalize_dim(dim, a.rank(), "index_select");
  auto& kernels = backend_for(a.where(), "index_select");
  require_indices_below("index_select", index, a.shape()[d], d, a.shape());
  auto shape = a.shape();
  shape[d] = index.numel();
  auto out = tensor::empty(shape, a.type(), a.where());
  kernels.index_select(a, d, index, out);
  return out;
}

tensor gather(const tensor& a, std::int64_t dim, const tensor& index) {
  require_defined("gather", a, "input");
  require_index("gather", index, "index");
  require_same_device("gather", a, index);
  require(index.rank() == a.rank(), "gather: index shape {} and input shape {} differ in rank",
          index.shape(), a.shape());
  auto d = normalize_dim(dim, a.rank(), "gather");
  for (std::int64_t k = 0; k < a.rank(); ++k)
    require(k == d || index.shape()[k] <= a.shape()[k],
            "gather: index shape {} exceeds input shape {} in dimension {}", index.shape(),
            a.shape(), k);
  auto& kernels = backend_for(a.where(), "gather");
  require_indices_below("gather", index, a.shape()[d], d, a.shape());
  auto out = tensor::empty(index.shape(), a.type(), a.where());
  kernels.gather(a, d, index, out);
  return out;
}

tensor scatter_add(const tensor& a, std::int64_t dim, const tensor& index, const tensor& src) {
  require_defined("scatter_add", a, "input");
  require_defined("scatter_add", src, "source");
  require_index("scatter_add", index, "index");
  require_same_device("scatter_add", a, index);
  require_same_device("scatter_add", a, src);
  require_same_dtype("scatter_add", a, src);
  require_arithmetic("scatter_add", a);
  require(index.rank() == a.rank() && src.rank() == a.rank(),
          "scatter_add: input {}, index {} and source {} differ in rank", a.shape(), index.shape(),
          src.shape());
  auto d = normalize_dim(dim, a.rank(), "scatter_add");
  for (std::int64_t k = 0; k < a.rank(); ++k) {
    require(index.shape()[k] <= src.shape()[k],
            "scatter_add: index shape {} exceeds source shape {} in dimension {}", index.shape(),
            src.shape(), k);
    require(k == d || index.shape()[k] <= a.shape()[k],
            "scatter_add: index shape {} exceeds input shape {} in dimension {}", index.shape(),
            a.shape(), k);
  }
  auto& kernels = backend_for(a.where(), "scatter_add");
  require_indices_below("scatter_add", index, a.shape()[d], d, a.shape());
  auto out = a.clone();
  kernels.scatter_add_(out, d, index, src);
  return out;
}

void index_add_(tensor& a, std::int64_t dim, const tensor& index, const tensor& src) {
  require_defined("index_add_", a, "input");
  require_defined("index_add_", src, "source");
  require_index("index_add_", index, "index");
  require_same_device("index_add_", a, index);
  require_same_device("index_add_", a, src);
  require_same_dtype("index_add_", a, src);
  require_arithmetic("index_add_", a);
  require_rank("index_add_", index, 1, "index");
  auto d = normalize_dim(dim, a.rank(), "index_add_");
  auto expected = a.shape();
  expected[d] = index.numel();
  require(src.shape() == expected, "index_add_: source shape {} should be {} (input {}, {} indices)",
          src.shape(), expected, a.shape(), index.numel());
  auto& kernels = backend_for(a.where(), "index_add_");
  require_indices_below("index_add_", index, a.shape()[d], d, a.shape());
  kernels.index_add_(a, d, index, src);
}

namespace {

/// Checks indices [n] and offsets [bags] of an embedding bag against
/// `num` embeddings (see ops.hpp for the layout).
void check_bags(const char* op, const tensor& indices, const tensor& offsets, std::int64_t num) {
  require_index(op, indices, "indices");
  require_index(op, offsets, "offsets");
  require_rank(op, indices, 1, "indices");
  require_rank(op, offsets, 1, "offsets");
  const auto n = indices.numel();
  auto starts = index_values(offsets);
  for (std::size_t i = 0; i < starts.size(); ++i) {
    if (i == 0)
      require(starts[0] == 0, "{}: offsets must start at 0, got {}", op, starts[0]);
    else
      require(starts[i] >= starts[i - 1], "{}: offsets decrease at position {}: {} after {}", op, i,
              starts[i], starts[i - 1]);
    require(starts[i] <= n, "{}: offset {} at position {} exceeds the {} indices", op, starts[i], i,
            n);
  }
  require_indices_below(op, indices, num, 0, {num});
}

} // namespace

tensor embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets,
                     bag_mode mode) {
  require_defined("embedding_bag", weight, "weight");
  require_floating("embedding_bag", weight);
  require_rank("embedding_bag", weight, 2, "weight");
  require_same_device("embedding_bag", weight, indices);
  require_same_device("embedding_bag", weight, offsets);
  auto& kernels = backend_for(weight.where(), "embedding_bag");
  check_bags("embedding_bag", indices, offsets, weight.shape()[0]);
  auto out = tensor::empty({offsets.numel(), weight.shape()[1]}, weight.type(), weight.where());
  kernels.embedding_bag(weight.contiguous(), indices.contiguous(), offsets.contiguous(),
                        mode == bag_mode::mean, out);
  return out;
}

tensor embedding_bag_backward(const tensor& grad, const tensor& indices, const tensor& offsets,
                              bag_mode mode, std::int64_t num_embeddings) {
  const char* op = "embedding_bag_backward";
  require_defined(op, grad, "grad");
  require_floating(op, grad);
  require_rank(op, grad, 2, "grad");
  require_same_device(op, grad, indices);
  require_same_device(op, grad, offsets);
  require(num_embeddings >= 0, "{}: negative num_embeddings {}", op, num_embeddings);
  require(grad.shape()[0] == offsets.numel(), "{}: grad shape {} does not match {} bags", op,
          grad.shape(), offsets.numel());
  auto& kernels = backend_for(grad.where(), op);
  check_bags(op, indices, offsets, num_embeddings);
  auto grad_weight = tensor::zeros({num_embeddings, grad.shape()[1]}, grad.type(), grad.where());
  kernels.embedding_bag_backward(grad.contiguous(), indices.contiguous(), offsets.contiguous(),
                                 mode == bag_mode::mean, grad_weight);
  return grad_weight;
}

} // namespace troupe
