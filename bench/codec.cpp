// Cost of the zero-copy wire format: encode a tensor message and decode it
// back (header validated, tensor aliasing the received buffer), against one
// memcpy of the same payload measured in the same run — what a codec that
// copies the payload would pay at least once per side. Correctness column:
// the decoded tensor aliases the sent bytes and equals the original.
//
//   build/bench/codec [--json] [--rounds=5]
#include <cstring>

#include "report.hpp"
#include "troupe/serialization/decode.hpp"
#include "troupe/serialization/encoded_message.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;


int main(int argc, char** argv) {
  bench::check_flags("codec", argc, argv, {"rounds="});
  bench::report out("codec", argc, argv);
  const auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 5, 1, 1000));
  generator gen{7};
  for (std::int64_t mib : {1, 16, 64}) {
    auto value = rand({mib * 1024 * 1024 / 4}, gen);
    message_meta meta{message_kind::forward_activation, 3, 1, 42, "worker1/cpu/stage1"};
    // The receiver's payload buffer, as the data plane would have filled it.
    auto received = storage::allocate(value.nbytes());
    std::memcpy(received->data(), value.raw_data(), value.nbytes());

    bool aliases = true;
    std::vector<double> codec, copy;
    auto scratch = storage::allocate(value.nbytes());
    for (int r = 0; r < rounds; ++r) {
      codec.push_back(bench::time_per_call([&] {
        auto message = encode(meta, value);
        aliases &= message.payload().data() == static_cast<const std::byte*>(value.raw_data());
        auto decoded = decode(message.header_bytes(), received);
        aliases &= decoded.has_value() && decoded->value.raw_data() == received->data();
      }));
      copy.push_back(bench::time_per_call([&] { std::memcpy(scratch->data(), value.raw_data(), value.nbytes()); }));
    }
    auto check = decode(encode(meta, value).header_bytes(), received);
    bool equal = check && check->meta == meta && allclose(check->value, value, 0, 0);
    out.add({fmt::format("{} MiB float32", mib), "encode+decode", bench::median(codec) * 1e6, "us",
             "memcpy of the payload", bench::median(copy) * 1e6,
             aliases && equal ? "zero-copy, equal" : "WRONG"});
  }
  out.print();
}
