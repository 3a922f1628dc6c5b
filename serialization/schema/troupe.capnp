# Wire types of troupe's data plane and checkpoint files (docs/design.md, "The two
# planes"). These generated types stay private to serialization/: public
# headers speak troupe types only.
#
# Compatibility: never renumber fields or enumerants; only append.
@0xd2e1a4298eb0274c;

$import "/capnp/c++.capnp".namespace("troupe::wire");

enum DeviceKind {
  cpu @0;
  cuda @1;
}

# Describes one tensor payload. The payload itself never lives in this
# message: it travels beside it (UCX iov, the bytes after the header frame,
# or a checkpoint's payload region), so the receiver can validate the header
# and allocate before touching any payload byte.
struct TensorHeader {
  # troupe::dtype wire value (tensor/dtype.hpp); unknown values are rejected.
  dtype @0 :UInt8;
  # Sizes in elements; each in [0, 2^40].
  shape @1 :List(Int64);
  # Strides in elements, one per dimension, each in [0, 2^40], relative to
  # the first payload byte. Contiguous tensors carry row-major strides;
  # transposed/broadcast views are sent as-is (no copy).
  strides @2 :List(Int64);
  # Bytes of payload; must equal the extent that shape and strides address:
  # ((sum (shape[d]-1) * strides[d]) + 1) * sizeof(dtype), or 0 when empty.
  byteCount @3 :UInt64;
  # The device the sender's tensor lived on (informational: the receiver
  # decides where the delivered tensor lives).
  deviceKind @4 :DeviceKind;
  deviceIndex @5 :Int32;
}

# A data-plane message: routing and schedule metadata plus one tensor.
struct TrainingMessage {
  enum Kind {
    control @0;
    forwardActivation @1;
    backwardGradient @2;
    gradientBucket @3;
    parameters @4;
  }
  kind @0 :Kind;
  step @1 :UInt64;
  microBatch @2 :UInt32;
  contextId @3 :UInt64;
  destination @4 :Text;
  tensor @5 :TensorHeader;
  # The job's token (docs/design.md, "Encryption"): the data plane drops frames
  # whose token is not its own job's. 0 outside the data plane.
  token @6 :UInt64;
  # Links a send record to its receive record in a trace; 0 when untraced.
  flowId @7 :UInt64;
  # Where the receiving node puts the tensor before handing it to an actor:
  # the sender's device map applied to the device its tensor was on
  # (docs/design.md, "Devices"). asCarried: on the host, as the plane
  # carried it.
  landingKind @8 :LandingKind;
  landingIndex @9 :Int32;
}

enum LandingKind {
  asCarried @0;
  cpu @1;
  cuda @2;
}

# The index of a checkpoint file (checkpoint_file.cpp narrates the layout).
struct CheckpointEntry {
  name @0 :Text;
  tensor @1 :TensorHeader;
  # Offset of this tensor's payload from the start of the payload region;
  # a multiple of 64.
  payloadOffset @2 :UInt64;
}

struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}

struct CheckpointIndex {
  entries @0 :List(CheckpointEntry);
  metadata @1 :List(KeyValue);
}

# A distributed checkpoint's manifest (checkpoint_manifest.hpp narrates the
# file around it). It names every tensor and where each saved piece of it
# lies; the pieces' bytes live in the shard files beside it.
struct ManifestPiece {
  # The piece's box in the whole tensor: offset and shape per dimension.
  offset @0 :List(Int64);
  shape @1 :List(Int64);
  # A shard file in the same directory (a plain name, no '/').
  file @2 :Text;
  # The piece's dense row-major bytes in that file.
  byteOffset @3 :UInt64;
  byteCount @4 :UInt64;
  crc32c @5 :UInt32;
}

struct ManifestTensor {
  # Fully qualified ("stage1.block0.mlp.fc1.weight", "optimizer.exp_avg.…").
  name @0 :Text;
  # troupe::dtype wire value, as in TensorHeader.
  dtype @1 :UInt8;
  globalShape @2 :List(Int64);
  # Tile the whole tensor exactly: no gaps, no overlaps.
  pieces @3 :List(ManifestPiece);
}

# Driver state (data position, random state): opaque bytes.
struct BytesValue {
  key @0 :Text;
  value @1 :Data;
}

struct CheckpointManifest {
  step @0 :UInt64;
  tensors @1 :List(ManifestTensor);
  metadata @2 :List(BytesValue);
}
