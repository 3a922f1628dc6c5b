// troupe errors as CAF errors: code and message survive, and the category
// renders by name.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "troupe/actors/error_category.hpp"
#include "troupe/actors/message_types.hpp"

using namespace troupe;
using namespace troupe::actors;

TEST(ErrorCategory, RendersCodeNameAndMessage) {
  caf::actor_system_config config;
  add_message_types(config);
  caf::actor_system system{config};
  auto err = to_caf_error(make_error(errc::malformed_message, "frame {} is truncated", 3));
  EXPECT_EQ(err.category(), error_category);
  EXPECT_EQ(err.code(), static_cast<std::uint8_t>(errc::malformed_message));
  EXPECT_EQ(system.render(err), "troupe::malformed_message(frame 3 is truncated)");
  EXPECT_EQ(system.render(make_caf_error(errc::invalid_argument, "rank 5 is not below 4")),
            "troupe::invalid_argument(rank 5 is not below 4)");
}

TEST(ErrorCategory, TravelsAsAnErrorReply) {
  caf::actor_system_config config;
  add_message_types(config);
  caf::actor_system system{config};
  auto refuser = system.spawn([]() -> caf::behavior {
    return {[](int) -> caf::result<int> { return make_caf_error(errc::size_limit_exceeded, "too big"); }};
  });
  caf::scoped_actor self{system};
  std::string rendered;
  self->request(refuser, std::chrono::seconds(5), 1)
    .receive([](int) {}, [&](caf::error& err) { rendered = system.render(err); });
  EXPECT_EQ(rendered, "troupe::size_limit_exceeded(too big)");
  caf::anon_send_exit(refuser, caf::exit_reason::user_shutdown);
}
