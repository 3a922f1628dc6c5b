#include "troupe/tensor/tensor.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "cpu_vector_math.hpp"
#include "dispatch.hpp"
#include "troupe/tensor/backend.hpp"
#include "zeroed_storage.hpp"

namespace troupe {

std::int64_t numel_of(const dims& shape) {
  std::int64_t n = 1;
  for (auto s : shape) {
    require(s >= 0, "tensor: negative dimension in shape {}", shape);
    require(s == 0 || n <= std::numeric_limits<std::int64_t>::max() / s,
            "tensor: element count of shape {} overflows int64", shape);
    n *= s;
  }
  return n;
}

dims contiguous_strides(const dims& shape) {
  dims strides(shape.size());
  std::int64_t stride = 1;
  for (auto d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<std::int64_t>(shape[d], 1);
  }
  return strides;
}

std::int64_t normalize_dim(std::int64_t dim, std::int64_t rank, const char* op) {
  auto d = dim < 0 ? dim + rank : dim;
  require(d >= 0 && d < rank, "{}: dimension {} out of range for rank {}", op, dim, rank);
  return d;
}

// -- factories ------------------------------------------------------------------

namespace {

std::size_t bytes_of(const dims& shape, dtype type, const char* op) {
  auto n = numel_of(shape);
  require(static_cast<std::uint64_t>(n) <= std::numeric_limits<std::size_t>::max() / size_of(type),
          "{}: shape {} of {} is too large", op, shape, type);
  return static_cast<std::size_t>(n) * size_of(type);
}

static_assert(sizeof(bfloat16) == sizeof(std::uint16_t), "bfloat16 is its 16 bits");

/// A contiguous row of n from float32 to bfloat16 or back in vector lanes
/// where the CPU has them, with convert's bits; false for any other pair
/// (the caller's element loop converts it).
template <class S, class D> bool convert_bfloat16_rows(const S* s, D* d, std::int64_t n) {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bfloat16>) {
    if (!detail::vector_math::available())
      return false;
    detail::vector_math::to_bfloat16(s, reinterpret_cast<std::uint16_t*>(d), n);
    return true;
  } else if constexpr (std::is_same_v<S, bfloat16> && std::is_same_v<D, float>) {
    if (!detail::vector_math::available())
      return false;
    detail::vector_math::from_bfloat16(reinterpret_cast<const std::uint16_t*>(s), d, n);
    return true;
  }
  return false;
}

} // namespace

tensor tensor::empty(const dims& shape, dtype type, device where) {
  auto n = numel_of(shape);
  tensor t;
  t.storage_ = storage::allocate(bytes_of(shape, type, "tensor::empty"), where);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = n;
  t.dtype_ = type;
  return t;
}

tensor tensor::zeros(const dims& shape, dtype type, device where) {
  if (where.kind != device_kind::cpu)
    return full(shape, 0.0, type, where);
  // Memory that is zero already, left unwritten (zeroed_storage.hpp).
  tensor t;
  t.storage_ = detail::zeroed_host_storage(bytes_of(shape, type, "tensor::zeros"));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = numel_of(shape);
  t.dtype_ = type;
  return t;
}

tensor tensor::ones(const dims& shape, dtype type, device where) {
  return full(shape, 1.0, type, where);
}

tensor tensor::full(const dims& shape, double value, dtype type, device where) {
  auto t = empty(shape, type, where);
  t.fill(value);
  return t;
}

tensor tensor::scalar(double value, dtype type) {
  return full({}, value, type);
}

tensor tensor::from_storage(std::shared_ptr<storage> memory, const dims& shape,
                            const dims& strides, std::int64_t offset, dtype type) {
  require(memory != nullptr, "tensor::from_storage: null storage");
  require(shape.size() == strides.size(), "tensor::from_storage: shape {} and strides {} differ in rank",
          shape, strides);
  require(offset >= 0, "tensor::from_storage: negative offset {}", offset);
  auto n = numel_of(shape);
  // The addressable element range is [offset + sum(neg), offset + sum(pos)].
  // Strides are required non-negative: troupe never creates negative strides.
  std::int64_t last = offset;
  if (n > 0) {
    for (std::size_t d = 0; d < shape.size(); ++d) {
      require(strides[d] >= 0, "tensor::from_storage: negative stride {} in {}", strides[d], strides);
      auto span = (shape[d] - 1);
      require(strides[d] == 0 || span <= (std::numeric_limits<std::int64_t>::max() - last) / strides[d],
              "tensor::from_storage: strides {} overflow for shape {}", strides, shape);
      last += span * strides[d];
    }
    auto capacity = static_cast<std::int64_t>(memory->bytes() / size_of(type));
    require(last < capacity,
            "tensor::from_storage: shape {} strides {} offset {} reach element {} but storage holds {}",
            shape, strides, offset, last, capacity);
  }
  tensor t;
  t.storage_ = std::move(memory);
  t.shape_ = shape;
  t.strides_ = strides;
  t.offset_ = offset;
  t.numel_ = n;
  t.dtype_ = type;
  return t;
}

// -- properties -------------------------------------------------------------------

std::int64_t tensor::size(std::int64_t dim) const {
  return shape_[normalize_dim(dim, rank(), "tensor::size")];
}

bool tensor::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (auto d = rank() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected)
      return false;
    expected *= shape_[d];
  }
  return true;
}

void* tensor::raw_data() const noexcept {
  if (!storage_)
    return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(size_of(dtype_));
}

double tensor::at(std::initializer_list<std::int64_t> index) const {
  require(defined(), "tensor::at: undefined tensor");
  require(static_cast<std::int64_t>(index.size()) == rank(), "tensor::at: index of rank {} for shape {}",
          index.size(), shape_);
  require(where().kind == device_kind::cpu, "tensor::at: tensor is on {}", where());
  std::int64_t off = 0;
  std::int64_t d = 0;
  for (auto i : index) {
    require(i >= 0 && i < shape_[d], "tensor::at: index {} out of range for dimension {} of {}", i, d,
            shape_);
    off += i * strides_[d];
    ++d;
  }
  return detail::dispatch_any(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return detail::convert<double>(static_cast<const T*>(raw_data())[off]);
  });
}

double tensor::item() const {
  require(numel_ == 1, "tensor::item: expected one element, shape is {}", shape_);
  if (where().kind != device_kind::cpu)
    return to(device::cpu()).item(); // waits for the device's queued work
  std::initializer_list<std::int64_t> none{};
  if (rank() == 0)
    return at(none);
  return reshape({}).at(none);
}

template <class T> std::vector<T> tensor::to_vector() const {
  if (where().kind != device_kind::cpu)
    return to(device::cpu()).to_vector<T>();
  auto c = to(dtype_of_v<T>).contiguous();
  auto* p = c.template data<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> tensor::to_vector<float>() const;
template std::vector<double> tensor::to_vector<double>() const;
template std::vector<std::int64_t> tensor::to_vector<std::int64_t>() const;
template std::vector<std::int32_t> tensor::to_vector<std::int32_t>() const;
template std::vector<std::uint8_t> tensor::to_vector<std::uint8_t>() const;
template std::vector<bfloat16> tensor::to_vector<bfloat16>() const;

// -- views ----------------------------------------------------------------------------

namespace {

// Resolves one -1 in a requested shape against the element count.
dims infer_shape(const dims& requested, std::int64_t numel, const char* op) {
  dims shape = requested;
  std::int64_t known = 1;
  std::int64_t infer_at = -1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      require(infer_at < 0, "{}: more than one -1 in shape {}", op, requested);
      infer_at = static_cast<std::int64_t>(d);
    } else {
      require(shape[d] >= 0, "{}: invalid size {} in shape {}", op, shape[d], requested);
      known *= shape[d];
    }
  }
  if (infer_at >= 0) {
    require(known != 0 && numel % known == 0, "{}: shape {} is invalid for {} elements", op, requested,
            numel);
    shape[infer_at] = numel / known;
  } else {
    require(known == numel, "{}: shape {} is invalid for {} elements", op, requested, numel);
  }
  return shape;
}

// Strides for viewing (old_shape, old_strides) as new_shape without a copy,
// or nullopt (the algorithm of PyTorch's computeStride: merge runs of
// dimensions that are contiguous with each other).
std::optional<dims> view_strides(const dims& old_shape, const dims& old_strides, const dims& new_shape,
                                 std::int64_t numel) {
  dims new_strides(new_shape.size());
  if (numel == 0)
    return contiguous_strides(new_shape);
  // A scalar has no strides to merge; any all-ones shape views it.
  if (old_shape.empty())
    return dims(new_shape.size(), 1);
  auto view_d = static_cast<std::int64_t>(new_shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  std::int64_t tensor_numel = 1;
  std::int64_t view_numel = 1;
  for (auto tensor_d = static_cast<std::int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel)
        return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1)
    return std::nullopt;
  return new_strides;
}

} // namespace

tensor tensor::view(const dims& shape) const {
  auto new_shape = infer_shape(shape, numel_, "view");
  auto strides = view_strides(shape_, strides_, new_shape, numel_);
  require(strides.has_value(),
          "view: shape {} with strides {} cannot be viewed as {} without a copy (use reshape)", shape_,
          strides_, shape);
  auto out = *this;
  out.shape_ = std::move(new_shape);
  out.strides_ = std::move(*strides);
  return out;
}

tensor tensor::reshape(const dims& shape) const {
  auto new_shape = infer_shape(shape, numel_, "reshape");
  if (view_strides(shape_, strides_, new_shape, numel_))
    return view(new_shape);
  return contiguous().view(new_shape);
}

tensor tensor::transpose(std::int64_t dim0, std::int64_t dim1) const {
  auto a = normalize_dim(dim0, rank(), "transpose");
  auto b = normalize_dim(dim1, rank(), "transpose");
  auto out = *this;
  std::swap(out.shape_[a], out.shape_[b]);
  std::swap(out.strides_[a], out.strides_[b]);
  return out;
}

tensor tensor::t() const {
  require(rank() == 2, "t: expected a 2-D tensor, got shape {}", shape_);
  return transpose(0, 1);
}

tensor tensor::permute(const dims& order) const {
  require(static_cast<std::int64_t>(order.size()) == rank(), "permute: order {} for shape {}", order,
          shape_);
  std::vector<bool> seen(order.size(), false);
  auto out = *this;
  for (std::size_t i = 0; i < order.size(); ++i) {
    auto d = normalize_dim(order[i], rank(), "permute");
    require(!seen[d], "permute: dimension {} repeated in {}", d, order);
    seen[d] = true;
    out.shape_[i] = shape_[d];
    out.strides_[i] = strides_[d];
  }
  return out;
}

tensor tensor::narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
  auto d = normalize_dim(dim, rank(), "narrow");
  require(start >= 0 && length >= 0 && start + length <= shape_[d],
          "narrow: range [{}, {}) out of bounds for dimension {} of size {}", start, start + length, d,
          shape_[d]);
  auto out = *this;
  out.offset_ += start * strides_[d];
  out.shape_[d] = length;
  out.numel_ = numel_of(out.shape_);
  return out;
}

tensor tensor::slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) const {
  auto d = normalize_dim(dim, rank(), "slice");
  require(step > 0, "slice: step must be positive, got {}", step);
  auto n = shape_[d];
  auto clamp = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
  auto s = clamp(start);
  auto e = std::max(s, clamp(end));
  auto out = *this;
  out.offset_ += s * strides_[d];
  out.shape_[d] = (e - s + step - 1) / step;
  out.strides_[d] = strides_[d] * step;
  out.numel_ = numel_of(out.shape_);
  return out;
}

tensor tensor::select(std::int64_t dim, std::int64_t index) const {
  auto d = normalize_dim(dim, rank(), "select");
  auto i = index < 0 ? index + shape_[d] : index;
  require(i >= 0 && i < shape_[d], "select: index {} out of range for dimension {} of size {}", index, d,
          shape_[d]);
  auto out = *this;
  out.offset_ += i * strides_[d];
  out.shape_.erase(out.shape_.begin() + d);
  out.strides_.erase(out.strides_.begin() + d);
  out.numel_ = numel_of(out.shape_);
  return out;
}

tensor tensor::expand(const dims& shape) const {
  require(shape.size() >= shape_.size(), "expand: cannot expand shape {} to fewer dimensions {}", shape_,
          shape);
  auto lead = shape.size() - shape_.size();
  dims strides(shape.size(), 0);
  dims out_shape(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      require(shape[i] >= 0, "expand: invalid size {} in {}", shape[i], shape);
      out_shape[i] = shape[i];
      continue;
    }
    auto own = shape_[i - lead];
    auto want = shape[i] == -1 ? own : shape[i];
    require(own == want || own == 1, "expand: shape {} cannot be expanded to {}", shape_, shape);
    out_shape[i] = want;
    strides[i] = own == want ? strides_[i - lead] : 0;
  }
  auto out = *this;
  out.shape_ = std::move(out_shape);
  out.strides_ = std::move(strides);
  out.numel_ = numel_of(out.shape_);
  return out;
}

tensor tensor::unsqueeze(std::int64_t dim) const {
  auto d = normalize_dim(dim, rank() + 1, "unsqueeze");
  auto out = *this;
  auto stride = d < rank() ? strides_[d] * shape_[d] : 1;
  out.shape_.insert(out.shape_.begin() + d, 1);
  out.strides_.insert(out.strides_.begin() + d, stride);
  return out;
}

tensor tensor::squeeze(std::int64_t dim) const {
  auto d = normalize_dim(dim, rank(), "squeeze");
  require(shape_[d] == 1, "squeeze: dimension {} of shape {} has size {}, not 1", d, shape_, shape_[d]);
  auto out = *this;
  out.shape_.erase(out.shape_.begin() + d);
  out.strides_.erase(out.strides_.begin() + d);
  return out;
}

// -- copies ---------------------------------------------------------------------------

tensor tensor::contiguous() const {
  if (is_contiguous())
    return *this;
  return clone();
}

tensor tensor::clone() const {
  require(defined(), "clone: undefined tensor");
  auto out = empty(shape_, dtype_, where());
  out.copy_from(*this);
  return out;
}

tensor tensor::to(dtype type) const {
  require(defined(), "to: undefined tensor");
  if (type == dtype_)
    return *this;
  auto out = empty(shape_, type, where());
  out.copy_from(*this);
  return out;
}

tensor tensor::to(device target) const {
  require(defined(), "to: undefined tensor");
  if (target == where())
    return *this;
  // The backend of the side that is not the CPU moves the bytes; the source
  // is made contiguous on its own device first.
  auto& kernels = backend_for(target.kind != device_kind::cpu ? target : where(), "to");
  if (numel_ == 0)
    return empty(shape_, dtype_, target);
  return kernels.transfer(contiguous(), target);
}

pending_host_copy start_copy_to_host(const tensor& t) {
  require(t.defined(), "start_copy_to_host: undefined tensor");
  if (t.where().kind == device_kind::cpu || t.numel() == 0)
    return {t.to(device::cpu()).contiguous(), [] {}};
  return backend_for(t.where(), "start_copy_to_host").start_transfer_to_host(t.contiguous());
}

void tensor::copy_from(const tensor& source) {
  require(defined() && source.defined(), "copy_from: undefined tensor");
  require(where() == source.where(), "copy_from: devices differ: {} and {} (move one with to(device))",
          where(), source.where());
  auto src = source.expand(shape_);
  if (where().kind != device_kind::cpu) {
    if (numel_ > 0)
      backend_for(where(), "copy_from").copy(src, *this);
    return;
  }
  detail::dispatch_any(dtype_, [&](auto dst_tag) {
    using D = typename decltype(dst_tag)::type;
    detail::dispatch_any(src.dtype_, [&](auto src_tag) {
      using S = typename decltype(src_tag)::type;
      auto* dst_base = static_cast<D*>(storage_->data());
      auto* src_base = static_cast<const S*>(src.storage_->data());
      auto copy_row = [&](auto off, std::int64_t n, auto step) {
        auto* d = dst_base + off[0];
        auto* s = src_base + off[1];
        if (step[0] == 1 && step[1] == 1) {
          if (convert_bfloat16_rows(s, d, n))
            return;
          for (std::int64_t i = 0; i < n; ++i)
            d[i] = detail::convert<D>(s[i]);
        } else {
          for (std::int64_t i = 0; i < n; ++i)
            d[i * step[0]] = detail::convert<D>(s[i * step[1]]);
        }
      };
      // Both contiguous: one row of every element, so a conversion sees
      // the whole size (the vector kernels stream a large output).
      if (is_contiguous() && src.is_contiguous())
        copy_row(std::array<std::int64_t, 2>{offset_, src.offset_}, numel_, std::array<std::int64_t, 2>{1, 1});
      else
        detail::for_each_row<2>(shape_, {&strides_, &src.strides_}, {offset_, src.offset_}, copy_row);
    });
  });
}

void tensor::fill(double value) {
  require(defined(), "fill: undefined tensor");
  if (where().kind != device_kind::cpu) {
    if (numel_ > 0)
      backend_for(where(), "fill").fill(*this, value);
    return;
  }
  detail::dispatch_any(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto v = detail::convert<T>(value);
    auto* base = static_cast<T*>(storage_->data());
    detail::for_each_row<1>(shape_, {&strides_}, {offset_}, [&](auto off, std::int64_t n, auto step) {
      for (std::int64_t i = 0; i < n; ++i)
        base[off[0] + i * step[0]] = v;
    });
  });
}

} // namespace troupe
