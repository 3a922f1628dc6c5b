#pragma once
// The reducer ring and every collective on it.
#include "troupe/parallel/all_gather.hpp"
#include "troupe/parallel/broadcast.hpp"
#include "troupe/parallel/reduce_scatter.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/ring_allreduce.hpp"
