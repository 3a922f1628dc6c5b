#pragma once
// Export to the safetensors format, which the Python ecosystem loads
// (safetensors.numpy.load_file, safetensors.torch.load_file):
//   [0, 8)   N: the header's length, u64 little-endian
//   [8, 8+N) a JSON object: per tensor {"dtype": "F32", "shape": [...],
//            "data_offsets": [begin, end]} (offsets into the bytes after the
//            header), and "__metadata__": {string: string}; padded with
//            spaces to a multiple of 8
//   then     every tensor's dense row-major little-endian bytes, in order
#include <filesystem>

#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/named_tensors.hpp"

namespace troupe {

/// Writes `tensors` (CPU; any dtype: F32, F64, I64, I32, U8, BF16) and
/// `metadata` to `path` atomically (temporary file, fsync, rename). A
/// metadata value that is not UTF-8 text is written hex-encoded under the
/// key "<key>.hex". Errors: errc::invalid_argument (an undefined or non-CPU
/// tensor, a name given twice), errc::io_error.
expected<void> save_safetensors(const std::filesystem::path& path, const named_tensors& tensors,
                                const checkpoint_metadata& metadata = {});

} // namespace troupe
