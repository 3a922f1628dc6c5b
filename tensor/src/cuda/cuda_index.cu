// Indexing kernels of the CUDA backend (cuda_kernels.hpp): gather and
// index_select as one strided "indexed read", scatter_add and index_add_
// as one "indexed accumulate", and embedding bags. The ops validated every
// index on the host before a launch.
//
// Accumulation without atomics: a thread owns every position that differs
// only in the indexed dimension and adds them in order of that dimension,
// so repeated indices sum in the CPU's order and the result is
// deterministic (cpu_index.cpp visits indices in the same order).
#include "cuda_device_common.cuh"

namespace troupe::detail::cuda {

namespace {

/// Element i's offset in an operand and in the index, from one walk over
/// the coordinates; also returns i's coordinate in `dim`.
struct indexed_offsets {
  std::int64_t operand;
  std::int64_t index;
};

__device__ inline indexed_offsets offsets_of(std::int64_t i, const index_space& s, const operand& o,
                                             const std::int64_t* index_strides) {
  indexed_offsets out{0, 0};
  for (int d = s.rank - 1; d >= 0; --d) {
    const auto size = s.sizes[d];
    const auto coordinate = i % size;
    out.operand += coordinate * o.strides[d];
    out.index += coordinate * index_strides[d];
    i /= size;
  }
  return out;
}

/// Index strides by value (kernel parameters cannot point to host arrays);
/// __grid_constant__ where a kernel takes it, as it is indexed at run time.
struct index_layout {
  std::int64_t strides[max_rank];
};

template <class T>
__global__ void indexed_read_kernel(const __grid_constant__ index_space shape, const __grid_constant__ operand out,
                                    const __grid_constant__ operand source, const std::int64_t* index,
                                    const __grid_constant__ index_layout layout, std::int64_t dim_stride) {
  TROUPE_FOR_EACH_INDEX(i, shape) {
    // `source` has its dim stride zeroed: the position there comes from the index.
    const auto o = offsets_of(i, shape, source, layout.strides);
    at<T>(out, offset_of(i, shape, out)) = at<T>(source, o.operand + index[o.index] * dim_stride);
  }
}

template <class T>
__global__ void indexed_accumulate_kernel(const __grid_constant__ index_space shape, std::int64_t length,
                                          const __grid_constant__ operand target,
                                          const __grid_constant__ operand source, const std::int64_t* index,
                                          const __grid_constant__ index_layout layout, int dim,
                                          std::int64_t target_dim_stride) {
  // `shape` has dim collapsed to 1: i names one line along dim.
  TROUPE_FOR_EACH_INDEX(i, shape) {
    const auto t = offsets_of(i, shape, target, layout.strides); // target's dim stride is zeroed
    const auto s = offset_of(i, shape, source);
    for (std::int64_t j = 0; j < length; ++j) {
      const auto k = index[t.index + j * layout.strides[dim]];
      at<T>(target, t.operand + k * target_dim_stride) += at<T>(source, s + j * source.strides[dim]);
    }
  }
}

template <class T>
__global__ void embedding_bag_kernel(const T* weight, const std::int64_t* indices, std::int64_t n,
                                     const std::int64_t* offsets, std::int64_t bags, std::int64_t d, bool mean,
                                     T* out) {
  const std::int64_t total = bags * d;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto bag = e / d;
    const auto j = e % d;
    const auto begin = offsets[bag];
    const auto end = bag + 1 < bags ? offsets[bag + 1] : n;
    T sum = T(0);
    for (auto i = begin; i < end; ++i)
      sum += weight[indices[i] * d + j];
    if (mean && end > begin)
      sum *= T(1) / static_cast<T>(end - begin);
    out[e] = sum;
  }
}

// One thread per column j, bags in order (an index may appear in many bags).
template <class T>
__global__ void embedding_bag_backward_kernel(const T* grad, const std::int64_t* indices, std::int64_t n,
                                              const std::int64_t* offsets, std::int64_t bags, std::int64_t d,
                                              bool mean, T* grad_weight) {
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    for (std::int64_t bag = 0; bag < bags; ++bag) {
      const auto begin = offsets[bag];
      const auto end = bag + 1 < bags ? offsets[bag + 1] : n;
      if (end == begin)
        continue;
      const T scale = mean ? T(1) / static_cast<T>(end - begin) : T(1);
      const T g = grad[bag * d + j];
      for (auto i = begin; i < end; ++i)
        grad_weight[indices[i] * d + j] += scale * g;
    }
  }
}

index_layout layout_of(const std::int64_t* strides) {
  index_layout layout{};
  for (int d = 0; d < max_rank; ++d)
    layout.strides[d] = strides[d];
  return layout;
}

} // namespace

void launch_indexed_read(const index_space& shape, const operand& out, const operand& source,
                         const std::int64_t* index, const std::int64_t* index_strides, int dim,
                         std::int64_t dim_stride, cudaStream_t stream) {
  auto without_dim = source;
  without_dim.strides[dim] = 0;
  dispatch_any(out.type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(indexed_read_kernel<T>, shape, stream, shape, out, without_dim, index, layout_of(index_strides),
           dim_stride);
  });
}

void launch_indexed_accumulate(const index_space& shape, std::int64_t length, const operand& target,
                               const operand& source, const std::int64_t* index,
                               const std::int64_t* index_strides, int dim, std::int64_t target_dim_stride,
                               cudaStream_t stream) {
  if (length == 0)
    return;
  auto without_dim = target;
  without_dim.strides[dim] = 0;
  dispatch_arithmetic(target.type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(indexed_accumulate_kernel<T>, shape, stream, shape, length, without_dim, source, index,
           layout_of(index_strides), dim, target_dim_stride);
  });
}

void launch_embedding_bag(element type, const void* weight, const std::int64_t* indices, std::int64_t n,
                          const std::int64_t* offsets, std::int64_t bags, std::int64_t d, bool mean, void* out,
                          cudaStream_t stream) {
  const auto total = bags * d;
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(embedding_bag_kernel<T>, (total + block_size - 1) / block_size, block_size, stream,
                  static_cast<const T*>(weight), indices, n, offsets, bags, d, mean, static_cast<T*>(out));
  });
}

void launch_embedding_bag_backward(element type, const void* grad, const std::int64_t* indices, std::int64_t n,
                                   const std::int64_t* offsets, std::int64_t bags, std::int64_t d, bool mean,
                                   void* grad_weight, cudaStream_t stream) {
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(embedding_bag_backward_kernel<T>, (d + block_size - 1) / block_size, block_size, stream,
                  static_cast<const T*>(grad), indices, n, offsets, bags, d, mean, static_cast<T*>(grad_weight));
  });
}

} // namespace troupe::detail::cuda
