// The one flag parser (troupe/command_line.hpp): values checked as read,
// every usage error reported at once, `--troupe.*` left to the node.
#include "troupe/command_line.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe {
namespace {

struct args {
  explicit args(std::vector<std::string> a) : text(std::move(a)) {
    text.insert(text.begin(), "/some/dir/prog");
    for (auto& t : text)
      pointers.push_back(t.c_str());
  }
  int argc() const { return static_cast<int>(pointers.size()); }
  const char* const* argv() const { return pointers.data(); }
  std::vector<std::string> text;
  std::vector<const char*> pointers;
};

TEST(CommandLine, ReadsEveryKindOfValue) {
  args a({"--steps=7", "--lr=0.25", "--schedule=gpipe", "--data=/tmp/x", "--sizes=1,2,4", "--quick",
          "--troupe.rank=1"});
  command_line cl(a.argc(), a.argv());
  EXPECT_EQ(cl.program(), "prog");
  EXPECT_EQ(cl.integer("steps", 5, 1, 100), 7);
  EXPECT_EQ(cl.number("lr", 1.0, 0.0, 1.0), 0.25);
  EXPECT_EQ(cl.choice("schedule", "1f1b", {"1f1b", "gpipe"}), "gpipe");
  EXPECT_EQ(cl.text("data", ""), "/tmp/x");
  EXPECT_EQ(cl.integers("sizes", {}), (std::vector<std::int64_t>{1, 2, 4}));
  EXPECT_TRUE(cl.has("quick"));
  EXPECT_FALSE(cl.has("slow"));
  EXPECT_EQ(cl.integer("absent", 3, 1, 9), 3);
  EXPECT_TRUE(cl.finish()) << "every argument was read; --troupe.* belongs to the node";
}

TEST(CommandLine, ReportsEveryBadValueAndUnreadArgumentAtOnce) {
  args a({"--steps=0", "--lr=nan", "--schedule=zigzag", "--sizes=1,x", "--stpes=3", "--steps-extra"});
  command_line cl(a.argc(), a.argv());
  EXPECT_EQ(cl.integer("steps", 5, 1, 100), 5) << "a bad value reads as the fallback";
  EXPECT_EQ(cl.number("lr", 0.5, 0.0, 1.0), 0.5);
  EXPECT_EQ(cl.choice("schedule", "1f1b", {"1f1b", "gpipe"}), "1f1b");
  EXPECT_EQ(cl.integers("sizes", {8}), (std::vector<std::int64_t>{8}));
  EXPECT_EQ(cl.rejected().size(), 4u);
  cl.reject("--a needs --b");
  auto done = cl.finish();
  ASSERT_FALSE(done);
  EXPECT_EQ(done.error().code(), errc::invalid_argument);
  const auto& m = done.error().message();
  for (const char* part : {"--steps is '0' but must be an integer in [1, 100]", "--lr is 'nan' but must be a number",
                           "--schedule is 'zigzag' but must be one of 1f1b, gpipe",
                           "--sizes: 'x' is not a positive integer", "--a needs --b", "unknown argument '--stpes=3'",
                           "unknown argument '--steps-extra'"})
    EXPECT_NE(m.find(part), std::string::npos) << part << " missing from: " << m;
}

TEST(CommandLine, AnIntegerOutOfRangeOrWithTrailingTextIsRejected) {
  for (const char* bad : {"--n=101", "--n=-1", "--n=5x", "--n=", "--n=99999999999999999999"}) {
    args a({bad});
    command_line cl(a.argc(), a.argv());
    EXPECT_EQ(cl.integer("n", 1, 0, 100), 1) << bad;
    EXPECT_EQ(cl.rejected().size(), 1u) << bad;
  }
}

} // namespace
} // namespace troupe
