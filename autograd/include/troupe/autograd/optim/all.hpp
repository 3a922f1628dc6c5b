#pragma once
// All optimizers (namespace troupe::optim).
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/autograd/optim/sgd.hpp"
