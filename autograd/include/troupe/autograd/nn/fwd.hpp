#pragma once
// Forward declarations for the nn modules (namespace troupe::nn).
#include <memory>

namespace troupe::nn {

class module;
class linear;
class embedding;
class embedding_bag;
class conv2d;
class max_pool2d;
class layer_norm;
class relu;
class gelu;
class dropout;
class sequential;
class causal_self_attention;
class transformer_block;
class gpt;

using module_ptr = std::shared_ptr<module>;

} // namespace troupe::nn
