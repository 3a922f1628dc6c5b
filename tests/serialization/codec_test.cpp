// Round trips and zero-copy checks of the data-plane codec (encoded_message.hpp,
// decode.hpp).
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/serialization/decode.hpp"
#include "troupe/serialization/encoded_message.hpp"

using namespace troupe;

namespace {

message_meta sample_meta() {
  return {message_kind::backward_gradient, 42, 7, 0xfeedbeefcafeull, "stage-3/reducer",
          0x5eed'1234'abcdull, 99};
}

/// A tensor whose bytes are 0, 1, 2, ... (any dtype), so round trips compare bytes.
tensor patterned(const dims& shape, dtype type) {
  auto t = tensor::empty(shape, type);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<unsigned char>(i * 7 + 3);
  return t;
}

/// A received flat frame in an aligned storage block (as a pooled receive buffer).
std::shared_ptr<storage> received(const encoded_message& message) {
  auto flat = message.to_flat_bytes();
  auto buffer = storage::allocate(flat.size());
  if (!flat.empty())
    std::memcpy(buffer->data(), flat.data(), flat.size());
  return buffer;
}

bool same_elements(const tensor& a, const tensor& b) {
  if (a.type() != b.type() || a.shape() != b.shape())
    return false;
  auto ca = a.contiguous();
  auto cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() &&
         (ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0);
}

bool inside(const void* pointer, const storage& buffer) {
  auto* p = static_cast<const std::byte*>(pointer);
  auto* begin = static_cast<const std::byte*>(buffer.data());
  return p >= begin && p <= begin + buffer.bytes();
}

} // namespace

TEST(Codec, RoundTripsEveryDtype) {
  for (int wire = 0; wire < dtype_count; ++wire) {
    auto type = *dtype_from_wire(static_cast<std::uint32_t>(wire));
    auto original = patterned({3, 5, 2}, type);
    auto message = encode(sample_meta(), original);
    auto buffer = received(message);
    auto decoded = decode_flat(buffer);
    ASSERT_TRUE(decoded) << decoded.error().to_string();
    EXPECT_EQ(decoded->meta, sample_meta());
    EXPECT_EQ(decoded->value.type(), type) << name_of(type);
    EXPECT_TRUE(same_elements(decoded->value, original)) << name_of(type);
  }
}

TEST(Codec, EncodePayloadIsTheTensorsMemory) {
  auto original = patterned({64, 64}, dtype::float32);
  auto message = encode(sample_meta(), original);
  EXPECT_EQ(static_cast<const void*>(message.payload().data()), original.raw_data());
  EXPECT_EQ(message.payload().size(), original.nbytes());
  EXPECT_EQ(message.header_bytes().size() % 8, 0u);
  EXPECT_LT(message.header_bytes().size(), 256u);
  EXPECT_TRUE(message.payload_tensor().shares_storage_with(original));
}

TEST(Codec, EncodedMessageKeepsTheTensorAlive) {
  std::weak_ptr<storage> watch;
  encoded_message message = [&] {
    auto t = patterned({16}, dtype::int32);
    watch = t.memory();
    return encode(sample_meta(), t);
  }();
  EXPECT_FALSE(watch.expired());
  auto decoded = decode_flat(received(message));
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->value.to_vector<std::int32_t>().size(), 16u);
}

TEST(Codec, DecodedTensorAliasesTheFlatBuffer) {
  auto message = encode(sample_meta(), patterned({128}, dtype::float64));
  auto buffer = received(message);
  auto decoded = decode_flat(buffer);
  ASSERT_TRUE(decoded);
  auto* expected_start = static_cast<std::byte*>(buffer->data()) + message.header_bytes().size();
  EXPECT_EQ(decoded->value.raw_data(), expected_start);
  EXPECT_TRUE(inside(decoded->value.raw_data(), *buffer));
  // Writing through the tensor writes the buffer: it is the same memory.
  decoded->value.data<double>()[0] = 1234.5;
  double first;
  std::memcpy(&first, expected_start, sizeof first);
  EXPECT_EQ(first, 1234.5);
}

TEST(Codec, DecodedTensorKeepsTheBufferAlive) {
  std::weak_ptr<storage> watch;
  tensor survivor;
  {
    auto buffer = received(encode(sample_meta(), patterned({8}, dtype::uint8)));
    watch = buffer;
    auto decoded = decode_flat(buffer);
    ASSERT_TRUE(decoded);
    survivor = decoded->value;
  }
  EXPECT_FALSE(watch.expired());
  survivor = tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(Codec, SplitHeaderAndPayloadAsUcxDeliversThem) {
  auto original = patterned({4, 3}, dtype::bfloat16);
  auto message = encode(sample_meta(), original);
  auto header = decode_header(message.header_bytes());
  ASSERT_TRUE(header) << header.error().to_string();
  EXPECT_EQ(header->byte_count, original.nbytes());
  EXPECT_EQ(header->shape, (dims{4, 3}));
  EXPECT_EQ(header->type, dtype::bfloat16);
  // The receiver allocates from the header, then the payload lands there.
  auto payload = storage::allocate(header->byte_count);
  std::memcpy(payload->data(), message.payload().data(), message.payload().size());
  auto decoded = decode(message.header_bytes(), payload);
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->value.raw_data(), payload->data());
  EXPECT_TRUE(decoded->value.shares_storage_with(tensor::from_storage(payload, {}, {}, 0, dtype::uint8)));
  EXPECT_TRUE(same_elements(decoded->value, original));
}

TEST(Codec, SpanDecodeHoldsTheOwner) {
  auto flat = std::make_shared<std::vector<std::uint64_t>>();
  auto bytes = encode(sample_meta(), patterned({5}, dtype::int64)).to_flat_bytes();
  flat->resize((bytes.size() + 7) / 8);
  std::memcpy(flat->data(), bytes.data(), bytes.size());
  std::span<const std::byte> frame(reinterpret_cast<const std::byte*>(flat->data()), bytes.size());
  std::weak_ptr<std::vector<std::uint64_t>> watch = flat;
  auto decoded = decode_flat(frame, std::move(flat));
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_FALSE(watch.expired());
  EXPECT_GE(decoded->value.raw_data(), static_cast<const void*>(frame.data()));
  decoded = make_error(errc::io_error, "drop");
  EXPECT_TRUE(watch.expired());
}

TEST(Codec, TransposedViewIsSentWithoutCopyAndArrivesAsTheSameView) {
  auto base = patterned({3, 4}, dtype::float32);
  auto view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  auto message = encode(sample_meta(), view);
  EXPECT_EQ(static_cast<const void*>(message.payload().data()), base.raw_data());
  EXPECT_EQ(message.payload().size(), base.nbytes());
  auto decoded = decode_flat(received(message));
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->value.strides(), view.strides());
  EXPECT_EQ(decoded->value.to_vector<float>(), view.to_vector<float>());
}

TEST(Codec, BroadcastViewShipsOnlyItsSource) {
  auto row = patterned({1, 4}, dtype::int32);
  auto view = row.expand({1000, 4});
  auto message = encode(sample_meta(), view);
  EXPECT_EQ(message.payload().size(), 16u);
  auto decoded = decode_flat(received(message));
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->value.to_vector<std::int32_t>(), view.to_vector<std::int32_t>());
}

TEST(Codec, ViewWithGapsAndOffsetIsEncodedDense) {
  auto base = patterned({6, 8}, dtype::float64);
  auto view = base.narrow(0, 1, 3).slice(1, 1, 8, 2);  // offset and gaps
  ASSERT_FALSE(view.is_contiguous());
  ASSERT_GT(view.offset(), 0);
  auto message = encode(sample_meta(), view);
  EXPECT_EQ(message.payload().size(), view.nbytes());
  EXPECT_TRUE(message.payload_tensor().is_contiguous());
  auto decoded = decode_flat(received(message));
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->value.to_vector<double>(), view.to_vector<double>());
}

TEST(Codec, ContiguousViewAtAnOffsetIsZeroCopy) {
  auto base = patterned({10, 4}, dtype::int64);
  auto rows = base.narrow(0, 2, 5);
  ASSERT_TRUE(rows.is_contiguous());
  auto message = encode(sample_meta(), rows);
  EXPECT_EQ(static_cast<const void*>(message.payload().data()), rows.raw_data());
  auto decoded = decode_flat(received(message));
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->value.to_vector<std::int64_t>(), rows.to_vector<std::int64_t>());
}

TEST(Codec, RankZeroAndEmptyTensors) {
  auto scalar = tensor::scalar(2.5, dtype::float64);
  auto decoded = decode_flat(received(encode(sample_meta(), scalar)));
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->value.rank(), 0);
  EXPECT_EQ(decoded->value.item(), 2.5);

  for (const dims& shape : {dims{0}, dims{3, 0, 2}, dims{0, 0}}) {
    auto empty = tensor::empty(shape, dtype::float32);
    auto message = encode(sample_meta(), empty);
    EXPECT_EQ(message.payload().size(), 0u);
    auto back = decode_flat(received(message));
    ASSERT_TRUE(back) << back.error().to_string();
    EXPECT_EQ(back->value.shape(), shape);
    EXPECT_EQ(back->value.numel(), 0);
  }
}

TEST(Codec, EveryKindAndLongDestinationRoundTrip) {
  for (int k = 0; k < message_kind_count; ++k) {
    message_meta meta{static_cast<message_kind>(k), ~0ull, ~0u, 0, std::string(300, 'x')};
    auto decoded = decode_flat(received(encode(meta, tensor::zeros({2}))));
    ASSERT_TRUE(decoded) << decoded.error().to_string();
    EXPECT_EQ(decoded->meta, meta);
  }
}

TEST(Codec, LandingDeviceRoundTrips) {
  for (std::optional<device> landing : {std::optional<device>{}, std::optional<device>{device::cpu()},
                                        std::optional<device>{device::cuda(0)},
                                        std::optional<device>{device::cuda(65535)}}) {
    message_meta meta{message_kind::forward_activation, 3, 1, 0, "worker1/cpu/x"};
    meta.landing = landing;
    auto decoded = decode_flat(received(encode(meta, tensor::zeros({2}))));
    ASSERT_TRUE(decoded) << decoded.error().to_string();
    EXPECT_EQ(decoded->meta.landing, landing);
  }
}

TEST(Codec, SixteenMebibytesRoundTripWithoutCopies) {
  auto original = patterned({4, 1024, 1024}, dtype::float32);  // 16 MiB
  auto start = std::chrono::steady_clock::now();
  auto message = encode(sample_meta(), original);
  auto header = std::vector<std::byte>(message.header_bytes().begin(), message.header_bytes().end());
  // The payload "arrives" in the sender's own buffer (as with shared memory).
  auto payload = storage::wrap(const_cast<std::byte*>(message.payload().data()),
                               message.payload().size(), device::cpu(), {});
  auto decoded = decode(header, payload);
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(decoded) << decoded.error().to_string();
  EXPECT_EQ(decoded->value.raw_data(), original.raw_data());
  std::printf("encode+decode of a 16 MiB tensor (zero-copy): %.1f us\n",
              std::chrono::duration<double, std::micro>(elapsed).count());

  start = std::chrono::steady_clock::now();
  auto flat = received(message);  // to_flat_bytes + a copy into a receive buffer
  auto back = decode_flat(flat);
  elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(back);
  std::printf("to_flat_bytes + copy + decode_flat of 16 MiB: %.1f us\n",
              std::chrono::duration<double, std::micro>(elapsed).count());
  EXPECT_TRUE(same_elements(back->value, original));
}

TEST(Codec, HeaderFrameSizeReadsTheSegmentTable) {
  auto message = encode(sample_meta(), tensor::zeros({3}));
  auto flat = message.to_flat_bytes();
  auto size = header_frame_size(std::span(flat).first(8));
  ASSERT_TRUE(size);
  EXPECT_EQ(*size, message.header_bytes().size());
}

TEST(Codec, UndefinedTensorIsAUsageError) {
  EXPECT_THROW(encode(sample_meta(), tensor()), usage_error);
}
