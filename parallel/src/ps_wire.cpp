#include "ps_wire.hpp"

#include <cstring>

#include <fmt/format.h>

namespace troupe::parallel::ps_wire {

namespace {

struct header {
  std::uint32_t magic;
  std::uint8_t op;
  std::uint8_t flags;
  std::uint16_t table;
  std::uint32_t trainer;
  std::uint32_t reserved;
  std::uint64_t count_a;
  std::uint64_t count_b;
};
static_assert(sizeof(header) == header_bytes);

tensor allocate(const header& h, std::size_t body_bytes, const std::function<tensor(std::int64_t)>& where = {}) {
  const auto bytes = static_cast<std::int64_t>(header_bytes + body_bytes);
  auto out = where ? where(bytes) : tensor::empty({bytes}, dtype::uint8);
  std::memcpy(out.raw_data(), &h, sizeof h);
  return out;
}

template <class T> std::span<const T> array_at(const std::uint8_t* base, std::size_t& at, std::uint64_t count) {
  std::span<const T> s(reinterpret_cast<const T*>(base + at), static_cast<std::size_t>(count));
  at += static_cast<std::size_t>(count) * sizeof(T);
  return s;
}

} // namespace

tensor encode_lookup(std::uint16_t table, std::uint32_t trainer, std::span<const std::int64_t> offsets,
                     std::span<const std::int64_t> ids, std::span<const float> weights) {
  header h{magic, static_cast<std::uint8_t>(op::lookup), weights.empty() ? std::uint8_t{0} : flag_weighted,
           table, trainer, 0, offsets.size(), ids.size()};
  auto out = allocate(h, (offsets.size() + ids.size()) * 8 + weights.size() * 4);
  auto* p = out.data<std::uint8_t>() + header_bytes;
  std::memcpy(p, offsets.data(), offsets.size_bytes());
  p += offsets.size_bytes();
  std::memcpy(p, ids.data(), ids.size_bytes());
  p += ids.size_bytes();
  if (!weights.empty())
    std::memcpy(p, weights.data(), weights.size_bytes());
  return out;
}

gradients_buffer make_gradients(std::uint16_t table, std::uint32_t trainer, std::int64_t rows, std::int64_t dim,
                                const std::function<tensor(std::int64_t bytes)>& where) {
  header h{magic, static_cast<std::uint8_t>(op::gradients), 0, table, trainer, 0,
           static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(dim)};
  gradients_buffer b;
  b.bytes = allocate(h, static_cast<std::size_t>(rows) * 8 + static_cast<std::size_t>(rows * dim) * 4, where);
  auto* base = b.bytes.data<std::uint8_t>() + header_bytes;
  b.ids = reinterpret_cast<std::int64_t*>(base);
  b.rows = reinterpret_cast<float*>(base + rows * 8);
  return b;
}

tensor encode_checkpoint(op kind, const checkpoint_request& r) {
  header h{magic, static_cast<std::uint8_t>(kind), r.asynchronous ? flag_asynchronous : std::uint8_t{0},
           r.server, r.trainer, 0, r.checkpoint_step, r.table_step};
  auto out = allocate(h, r.directory.size());
  if (!r.directory.empty())
    std::memcpy(out.data<std::uint8_t>() + header_bytes, r.directory.data(), r.directory.size());
  return out;
}

expected<request> decode(const tensor& bytes) {
  if (!bytes.defined() || bytes.type() != dtype::uint8 || bytes.rank() != 1 || !bytes.is_contiguous())
    return make_error(errc::malformed_message, "parameter server: a request must be a contiguous uint8 vector");
  const auto length = static_cast<std::uint64_t>(bytes.numel());
  if (length < header_bytes)
    return make_error(errc::malformed_message, "parameter server: a request of {} bytes is shorter than its {}-byte header",
                      length, header_bytes);
  const auto* base = bytes.data<std::uint8_t>();
  header h{};
  std::memcpy(&h, base, sizeof h);
  if (h.magic != magic)
    return make_error(errc::malformed_message, "parameter server: bad magic {:#010x}", h.magic);
  if (h.reserved != 0)
    return make_error(errc::malformed_message, "parameter server: reserved field is {}, not 0", h.reserved);
  const std::uint64_t body = length - header_bytes;
  request r;
  std::size_t at = header_bytes;
  if (h.op == static_cast<std::uint8_t>(op::lookup)) {
    if ((h.flags & ~flag_weighted) != 0)
      return make_error(errc::malformed_message, "parameter server: unknown lookup flags {:#x}", h.flags);
    const bool weighted = (h.flags & flag_weighted) != 0;
    // Each count alone must fit the body (at most 2^61 for any tensor)
    // before a product is formed, so no sum below can overflow.
    if (h.count_a > body / 8 || h.count_b > body / 8)
      return make_error(errc::malformed_message, "parameter server: lookup of {} bags and {} ids does not fit {} bytes",
                        h.count_a, h.count_b, body);
    const std::uint64_t need = h.count_a * 8 + h.count_b * (weighted ? 12 : 8);
    if (need != body)
      return make_error(errc::malformed_message,
                        "parameter server: lookup of {} bags and {} ids{} needs {} bytes, got {}", h.count_a,
                        h.count_b, weighted ? " with weights" : "", need, body);
    r.kind = op::lookup;
    r.lookup.table = h.table;
    r.lookup.trainer = h.trainer;
    r.lookup.offsets = array_at<std::int64_t>(base, at, h.count_a);
    r.lookup.ids = array_at<std::int64_t>(base, at, h.count_b);
    if (weighted)
      r.lookup.weights = array_at<float>(base, at, h.count_b);
    const auto n = static_cast<std::int64_t>(h.count_b);
    for (std::size_t b = 0; b < r.lookup.offsets.size(); ++b) {
      auto o = r.lookup.offsets[b];
      if (b == 0 && o != 0)
        return make_error(errc::malformed_message, "parameter server: offsets[0] is {}, not 0", o);
      if (b > 0 && o < r.lookup.offsets[b - 1])
        return make_error(errc::malformed_message, "parameter server: offsets[{}] = {} is below offsets[{}] = {}", b, o,
                          b - 1, r.lookup.offsets[b - 1]);
      if (o > n)
        return make_error(errc::malformed_message, "parameter server: offsets[{}] = {} is past the {} ids", b, o, n);
    }
    if (r.lookup.offsets.empty() && n != 0)
      return make_error(errc::malformed_message, "parameter server: {} ids but no bags", n);
    return r;
  }
  if (h.op == static_cast<std::uint8_t>(op::gradients)) {
    if (h.flags != 0)
      return make_error(errc::malformed_message, "parameter server: unknown gradient flags {:#x}", h.flags);
    // Rows <= body / 8 and width <= 2^24: the product cannot overflow.
    if (h.count_a > body / 8 || h.count_b == 0 || h.count_b > (std::uint64_t{1} << 24))
      return make_error(errc::malformed_message, "parameter server: gradients of {} rows of width {} in {} bytes",
                        h.count_a, h.count_b, body);
    const std::uint64_t need = h.count_a * 8 + h.count_a * h.count_b * 4;
    if (need != body)
      return make_error(errc::malformed_message, "parameter server: {} gradient rows of width {} need {} bytes, got {}",
                        h.count_a, h.count_b, need, body);
    r.kind = op::gradients;
    r.gradients.table = h.table;
    r.gradients.trainer = h.trainer;
    r.gradients.dim = static_cast<std::int64_t>(h.count_b);
    r.gradients.ids = array_at<std::int64_t>(base, at, h.count_a);
    r.gradients.rows = array_at<float>(base, at, h.count_a * h.count_b);
    return r;
  }
  if (h.op >= static_cast<std::uint8_t>(op::save) && h.op <= static_cast<std::uint8_t>(op::await_load)) {
    const auto kind = static_cast<op>(h.op);
    const bool with_directory = kind == op::save || kind == op::load;
    if (h.flags != 0 && !(kind == op::save && h.flags == flag_asynchronous))
      return make_error(errc::malformed_message, "parameter server: unknown checkpoint request flags {:#x}", h.flags);
    if (with_directory ? (body == 0 || body > max_directory_bytes) : body != 0)
      return make_error(errc::malformed_message,
                        "parameter server: a checkpoint request (operation {}) with {} bytes of directory; {}",
                        h.op, body, with_directory ? fmt::format("it must be 1 to {}", max_directory_bytes) : "it takes none");
    std::string_view directory(reinterpret_cast<const char*>(base + header_bytes), static_cast<std::size_t>(body));
    if (directory.find('\0') != std::string_view::npos)
      return make_error(errc::malformed_message, "parameter server: a checkpoint directory with a NUL byte");
    r.kind = kind;
    r.checkpoint = {h.table, h.trainer, (h.flags & flag_asynchronous) != 0, h.count_a, h.count_b, directory};
    return r;
  }
  return make_error(errc::malformed_message, "parameter server: unknown operation {}", h.op);
}

tensor encode_text(const std::string& text) {
  auto out = tensor::empty({static_cast<std::int64_t>(text.size())}, dtype::uint8);
  if (!text.empty())
    std::memcpy(out.raw_data(), text.data(), text.size());
  return out;
}

std::string decode_text(const tensor& bytes) {
  if (!bytes.defined() || bytes.type() != dtype::uint8 || bytes.rank() != 1 || !bytes.is_contiguous())
    return "(an error reply that is not text)";
  auto n = std::min<std::int64_t>(bytes.numel(), 4096);
  return std::string(reinterpret_cast<const char*>(bytes.raw_data()), static_cast<std::size_t>(n));
}

} // namespace troupe::parallel::ps_wire
