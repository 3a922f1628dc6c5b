// Places (`<node>/<device>/<name>`) and device maps: what parses, and the
// errors for what does not.
#include <gtest/gtest.h>

#include "troupe/actors/device_map.hpp"
#include "troupe/actors/place.hpp"

using namespace troupe;
using namespace troupe::actors;

TEST(Place, ParsesNodeDeviceAndName) {
  auto p = place::parse("worker1/cpu/stage0");
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->node, "worker1");
  EXPECT_EQ(p->device, device::cpu());
  EXPECT_EQ(p->name, "stage0");
  EXPECT_EQ(p->to_string(), "worker1/cpu/stage0");

  auto gpu = place::parse("worker1/cuda:0/stage1");
  ASSERT_TRUE(gpu);
  EXPECT_EQ(gpu->device, device::cuda(0));
  EXPECT_EQ(gpu->to_string(), "worker1/cuda:0/stage1");

  auto bare = place::parse("host-3.example/cuda:12");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->name, "");
  EXPECT_EQ(bare->to_string(), "host-3.example/cuda:12");
  EXPECT_EQ(bare->with_name("ps").to_string(), "host-3.example/cuda:12/ps");
  EXPECT_TRUE(place::parse("w/cpu/reducer:2"));
}

TEST(Place, MalformedStringsAreClearErrors) {
  struct bad_case {
    const char* text;
    const char* says;
  };
  const bad_case cases[] = {
    {"worker1", "has no '/'"},
    {"", "has no '/'"},
    {"/cpu/stage0", "the node name is empty"},
    {"worker1//stage0", "the device is empty"},
    {"worker1/cpu/", "the actor name is empty"},
    {"worker1/gpu/stage0", "device \"gpu\" is not cpu or cuda:N"},
    {"worker1/cuda:-1/stage0", "device \"cuda:-1\" is not cpu or cuda:N"},
    {"worker1/cuda:/x", "device \"cuda:\" is not cpu or cuda:N"},
    {"worker1/cuda:0x/x", "is not cpu or cuda:N"},
    {"worker1/cpu/a/b", "more than three parts"},
    {"worker 1/cpu/x", "contains ' '"},
    {"w:1/cpu/x", "contains ':'"},
    {"worker1/cpu/st age", "contains ' '"},
  };
  for (auto& c : cases) {
    auto p = place::parse(c.text);
    ASSERT_FALSE(p) << c.text;
    EXPECT_EQ(p.error().code(), errc::invalid_argument);
    EXPECT_NE(p.error().message().find(c.says), std::string::npos) << c.text << " -> " << p.error().message();
    EXPECT_NE(p.error().message().find(c.text), std::string::npos) << "the error quotes the input";
  }
  EXPECT_FALSE(place::parse(std::string(65, 'a') + "/cpu/x"));
  auto unnamed = place::parse_named("worker1/cpu");
  ASSERT_FALSE(unnamed);
  EXPECT_NE(unnamed.error().message().find("names no actor"), std::string::npos);
}

TEST(DeviceMap, ParsesMapsAndPrints) {
  auto map = device_map::parse("cuda:0->cuda:1,cpu->cpu,cuda:1->cpu");
  ASSERT_TRUE(map) << map.error().message();
  EXPECT_EQ(map->landing(device::cuda(0)), device::cuda(1));
  EXPECT_EQ(map->landing(device::cuda(1)), device::cpu());
  EXPECT_EQ(map->landing(device::cuda(7)), device::cpu()) << "unlisted devices arrive on the host";
  EXPECT_EQ(map->find(device::cuda(0)), device::cuda(1));
  EXPECT_EQ(map->find(device::cuda(7)), std::nullopt);
  EXPECT_EQ(map->to_string(), "cpu->cpu,cuda:0->cuda:1,cuda:1->cpu");
  EXPECT_EQ(*device_map::parse(map->to_string()), *map);
  EXPECT_TRUE(device_map::parse("")->empty());
}

TEST(DeviceMap, MalformedMapsAreClearErrors) {
  EXPECT_NE(device_map::parse("cuda:0=cuda:1").error().message().find("has no \"->\""), std::string::npos);
  EXPECT_NE(device_map::parse("cuda:0->tpu").error().message().find("\"tpu\" is not cpu or cuda:N"),
            std::string::npos);
  EXPECT_NE(device_map::parse("cpu->cpu,cpu->cuda:0").error().message().find("maps cpu twice"), std::string::npos);
  EXPECT_FALSE(device_map::parse("cpu->cpu,"));
}
