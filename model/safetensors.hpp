#pragma once
// SafetensorsFile: a read-only, memory-mapped .safetensors file
// (https://github.com/huggingface/safetensors: an 8-byte little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {str: str}}, then the data; offsets are relative to the byte
// after the header). The whole header is checked when the file is opened, so
// every later read stays inside the mapping.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace troupe::model {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // as written in the file: "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;   // empty for a scalar
  uint64_t begin = 0;           // absolute byte offset of the data in the file
  uint64_t end = 0;             // one past the last byte
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws std::runtime_error naming the file and the
  // tensor or byte offset at fault: file too short, header length beyond the
  // file, header not JSON, unknown dtype, offsets out of range, overlapping or
  // not matching dtype x shape.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  // Entries in the order of their data in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Throws std::runtime_error when absent.
  const SafetensorsEntry& entry(const std::string& name) const;

  // A new fp32 CPU tensor holding a copy of the data (F32, F16 and BF16 are
  // converted exactly); it does not keep the mapping alive. Throws
  // std::runtime_error for another dtype.
  torch::Tensor to_float(const std::string& name) const;
  // The same copy in the file's own dtype (F32, F16 or BF16 as float, half,
  // bfloat16), not converted.
  torch::Tensor copy(const std::string& name) const;
  // A tensor over the mapped bytes themselves, without a copy, in the file's
  // own dtype: F32, F16 or BF16 data as a float, half or bfloat16 tensor (so
  // that 16-bit weights stay 16-bit until their reader converts them);
  // copy()'s where the bytes are not aligned for that type. Read-only memory:
  // writing to it faults. It keeps the mapping alive; when its storage is
  // freed, or release_mapped_pages() is called on it, its pages leave this
  // process's resident memory (the page cache keeps them). So a loader that
  // packs one matrix at a time holds one matrix of the file, not the whole
  // file. The file must not be truncated in place while such a tensor lives
  // (troupe writes model files to a temporary name and renames it).
  torch::Tensor map(const std::string& name) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<const Mapping> map_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Drops the resident pages under a tensor of map(), or a view of one
// (the pages wholly inside the bytes it spans; a later read faults them back
// from the page cache): for a caller that has read or copied it and keeps it.
// Does nothing for any other tensor. Never changes what the tensor reads.
void release_mapped_pages(const torch::Tensor& t);

// Writes the tensors as F32 (converted to fp32 and copied to the CPU first),
// bfloat16 ones as BF16, in the given order, with optional "__metadata__". Writes `path`.tmp and renames
// it, so a reader never sees half a file. Throws std::invalid_argument on a
// duplicate or reserved name, std::runtime_error on an I/O failure.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace troupe::model
