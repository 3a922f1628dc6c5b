// tensor_message's CAF serialization: the path a tensor takes when it goes
// through CAF's own remote messages (BASP) instead of the data plane.
#include "troupe/actors/tensor_message.hpp"

#include <cstring>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <gtest/gtest.h>

#include "troupe/actors/error_category.hpp"
#include "troupe/serialization/encoded_message.hpp"

using namespace troupe;
using namespace troupe::actors;

namespace {

tensor_message sample(const dims& shape) {
  tensor_message message;
  message.meta = {message_kind::forward_activation, 3, 1, 77, "worker1/cpu/stage1"};
  message.value = tensor::empty(shape, dtype::float32);
  auto* p = message.value.data<float>();
  for (std::int64_t i = 0; i < message.value.numel(); ++i)
    p[i] = static_cast<float>(i) * 0.5f - 3.0f;
  message.flow_id = 0xabcdef;
  return message;
}

std::vector<char> serialize(tensor_message message) {
  std::vector<char> bytes;
  caf::binary_serializer sink(nullptr, bytes);
  EXPECT_FALSE(inspect(sink, message));
  return bytes;
}

caf::error deserialize(const std::vector<char>& bytes, tensor_message& out) {
  caf::binary_deserializer source(nullptr, bytes.data(), bytes.size());
  return inspect(source, out);
}

} // namespace

TEST(TensorMessage, CafRoundTripKeepsMetaFlowAndBytes) {
  auto original = sample({4, 8});
  auto bytes = serialize(original);
  tensor_message decoded;
  ASSERT_FALSE(deserialize(bytes, decoded));
  EXPECT_EQ(decoded.meta.destination, original.meta.destination);
  EXPECT_EQ(decoded.meta.step, 3u);
  EXPECT_EQ(decoded.meta.context_id, 77u);
  EXPECT_EQ(decoded.flow_id, 0xabcdefu);
  ASSERT_EQ(decoded.value.shape(), original.value.shape());
  EXPECT_EQ(std::memcmp(decoded.value.raw_data(), original.value.raw_data(),
                        original.value.nbytes()),
            0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(decoded.value.raw_data()) % 64, 0u);
  EXPECT_EQ(to_string(decoded),
            "tensor_message(forward_activation -> worker1/cpu/stage1, step 3, mb 1, "
            "float32[4, 8])");
}

TEST(TensorMessage, EmptyTensorRoundTrips) {
  auto bytes = serialize(sample({0, 3}));
  tensor_message decoded;
  ASSERT_FALSE(deserialize(bytes, decoded));
  EXPECT_EQ(decoded.value.numel(), 0);
}

TEST(TensorMessage, UndefinedTensorIsAnErrorNotACrash) {
  tensor_message empty;
  std::vector<char> bytes;
  caf::binary_serializer sink(nullptr, bytes);
  EXPECT_TRUE(inspect(sink, empty));
}

TEST(TensorMessage, CorruptedStreamsAreRejected) {
  auto good = serialize(sample({16}));
  tensor_message out;
  // Truncated anywhere: header length, header, payload length, payload.
  for (std::size_t keep : {std::size_t{2}, std::size_t{10}, good.size() - 70, good.size() - 1}) {
    std::vector<char> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep));
    EXPECT_TRUE(deserialize(cut, out)) << "kept " << keep << " bytes";
  }
  // A header length that is huge, zero or not a whole number of words.
  for (std::uint32_t length : {0xffffffffu, 0u, 12u}) {
    auto bad = good;
    // CAF's binary serializer writes integers in network byte order.
    for (int i = 0; i < 4; ++i)
      bad[static_cast<std::size_t>(i)] = static_cast<char>(length >> (8 * (3 - i)));
    auto err = deserialize(bad, out);
    ASSERT_TRUE(err);
    EXPECT_EQ(err.category(), error_category);
  }
  // Garbage in the Cap'n Proto header frame.
  {
    auto bad = good;
    for (std::size_t i = 4; i < 12; ++i)
      bad[i] = static_cast<char>(0xff);
    EXPECT_TRUE(deserialize(bad, out));
  }
  // A payload length that disagrees with the header's byteCount.
  {
    auto bad = good;
    auto header_size = encode(sample({16}).meta, sample({16}).value).header_bytes().size();
    bad[4 + header_size + 2] = 1; // big-endian u64: now 2^40 + 64 bytes
    auto err = deserialize(bad, out);
    ASSERT_TRUE(err);
    EXPECT_EQ(err.code(), static_cast<std::uint8_t>(errc::malformed_message));
  }
}

TEST(TensorMessage, PayloadLimitIsEnforced) {
  auto bytes = serialize(sample({1024}));
  set_tensor_message_payload_limit(1000);
  tensor_message out;
  auto err = deserialize(bytes, out);
  set_tensor_message_payload_limit(std::uint64_t{1} << 30);
  ASSERT_TRUE(err);
  EXPECT_EQ(err.code(), static_cast<std::uint8_t>(errc::size_limit_exceeded));
  EXPECT_FALSE(deserialize(bytes, out));
}
