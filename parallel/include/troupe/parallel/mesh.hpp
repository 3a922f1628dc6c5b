#pragma once
// A mesh: the job's ranks laid out as a grid with named axes, outermost
// first, so that layouts compose by placement (issue 20). With axes
// {{"data", 2}, {"tensor", 2}} rank = 2 d + t: ranks 0 and 1 split one
// replica's layers (a tensor group), ranks 0 and 2 hold the same pieces in
// two replicas (a data group). Each rank joins one reducer group per axis
// it uses; group_options() names the members and this rank's place in
// them (one rank per thread here).
// From tests/parallel/tensor_parallel_test.cpp:
//
//   auto grid = mesh::create({{"data", 2}, {"tensor", 2}}, std::vector<std::string>(4, "worker0/cpu"));
//   ...
//   auto tensor_group = reducer_group::join(**node, grid->group_options(rank, "tensor"));
//   ...
//   auto data_group = reducer_group::join(**node, grid->group_options(rank, "data"));
//   ...
//   parallel_mlp mlp({.width = width, .hidden = hidden, .type = dtype::float64, .seed = 9}, *tensor_group);
//   auto dp = data_parallel::create(mlp.named_parameters(), *data_group);
//
// That test trains the layout and compares it with one process. A
// pipeline axis names which ranks hold one replica's stages, in stage order
// (tensor_parallel_pipeline.hpp lays out {"data", "pipeline", "tensor"}).
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/parallel/reducer_group.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

struct mesh_axis {
  std::string name;
  std::uint32_t size = 1;
};

class mesh {
public:
  /// `places`: every rank's "<node>/<device>", by rank. The axes' sizes
  /// must multiply to places.size(); names must be distinct identifiers.
  static expected<mesh> create(std::vector<mesh_axis> axes, std::vector<std::string> places);

  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(places_.size()); }
  const std::vector<mesh_axis>& axes() const noexcept { return axes_; }
  /// `rank`'s index along `axis` (usage_error for an unknown axis or rank).
  std::uint32_t coordinate(std::uint32_t rank, std::string_view axis) const;
  /// The ranks whose coordinates equal `rank`'s except along `axis`, in
  /// that axis's order: `rank`'s group along it.
  std::vector<std::uint32_t> group(std::uint32_t rank, std::string_view axis) const;
  /// Options to join that group: this rank's index in it and the members'
  /// reducer places "<place>/<axis>_r<rank>" (unique on a node, whatever
  /// else it hosts).
  reducer_group_options group_options(std::uint32_t rank, std::string_view axis) const;

private:
  mesh(std::vector<mesh_axis> axes, std::vector<std::string> places)
      : axes_(std::move(axes)), places_(std::move(places)) {}
  std::size_t axis_index(std::string_view axis) const;
  /// Ranks of one step along axis `a`.
  std::uint32_t stride(std::size_t a) const;

  std::vector<mesh_axis> axes_;
  std::vector<std::string> places_;
};

} // namespace troupe::parallel
