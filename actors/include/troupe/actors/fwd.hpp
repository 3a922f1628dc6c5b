#pragma once
// Forward declarations of the actor runtime's public types.

namespace troupe::actors {

class device_map;
class node;
class tensor_router;
struct node_options;
struct peer_lost;
struct place;
struct rendezvous;
struct tensor_message;
struct tls_options;

} // namespace troupe::actors
