// Ranks as a grid with named axes (mesh.hpp).
#include "troupe/parallel/mesh.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

expected<mesh> mesh::create(std::vector<mesh_axis> axes, std::vector<std::string> places) {
  if (axes.empty())
    return make_error(errc::invalid_argument, "mesh: no axes");
  std::uint64_t product = 1;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    const auto& name = axes[a].name;
    const bool identifier = !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
      return std::isalnum(c) || c == '_';
    });
    if (!identifier)
      return make_error(errc::invalid_argument, "mesh: axis name '{}' is not an identifier", name);
    for (std::size_t b = 0; b < a; ++b)
      if (axes[b].name == name)
        return make_error(errc::invalid_argument, "mesh: axis '{}' appears twice", name);
    if (axes[a].size == 0)
      return make_error(errc::invalid_argument, "mesh: axis '{}' has size 0", name);
    product *= axes[a].size;
  }
  if (product != places.size())
    return make_error(errc::invalid_argument, "mesh: the axes hold {} ranks but there are {} places", product,
                      places.size());
  return mesh(std::move(axes), std::move(places));
}

std::size_t mesh::axis_index(std::string_view axis) const {
  for (std::size_t a = 0; a < axes_.size(); ++a)
    if (axes_[a].name == axis)
      return a;
  throw usage_error(fmt::format("mesh: no axis '{}'", axis));
}

std::uint32_t mesh::stride(std::size_t a) const {
  std::uint32_t s = 1;
  for (std::size_t b = a + 1; b < axes_.size(); ++b)
    s *= axes_[b].size;
  return s;
}

std::uint32_t mesh::coordinate(std::uint32_t rank, std::string_view axis) const {
  require(rank < size(), "mesh: rank {} is outside the mesh of {}", rank, size());
  const auto a = axis_index(axis);
  return rank / stride(a) % axes_[a].size;
}

std::vector<std::uint32_t> mesh::group(std::uint32_t rank, std::string_view axis) const {
  const auto a = axis_index(axis);
  const auto first = rank - coordinate(rank, axis) * stride(a);
  std::vector<std::uint32_t> members;
  for (std::uint32_t k = 0; k < axes_[a].size; ++k)
    members.push_back(first + k * stride(a));
  return members;
}

reducer_group_options mesh::group_options(std::uint32_t rank, std::string_view axis) const {
  reducer_group_options options;
  options.rank = coordinate(rank, axis);
  for (auto member : group(rank, axis))
    options.places.push_back(fmt::format("{}/{}_r{}", places_.at(member), axis, member));
  return options;
}

} // namespace troupe::parallel
