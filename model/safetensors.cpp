#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include <c10/util/strides.h>
#include <nlohmann/json.hpp>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this reader copies it as host bytes");

namespace troupe::model {
namespace {

using nlohmann::json;

// Largest header accepted; the reference implementation uses the same bound.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// Bytes per element for every dtype of the format; 0 = not a safetensors dtype.
size_t dtype_size(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

struct SafetensorsFile::Mapping {
  const unsigned char* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) munmap(const_cast<unsigned char*>(data), size);
  }
};

namespace {

// madvise(MADV_DONTNEED) on the pages wholly inside [begin, end) of a
// read-only private file mapping: they leave the resident set, their contents
// stay the file's.
void drop_pages(const unsigned char* begin, const unsigned char* end) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(end) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// The storage context of a map() tensor: its bytes and the mapping they
// live in. Its deleter is how release_mapped_pages() knows such a tensor.
struct MappedBytes {
  std::shared_ptr<const void> mapping;
  const unsigned char* begin;
  const unsigned char* end;
};

void free_mapped_bytes(void* ctx) {
  auto* m = static_cast<MappedBytes*>(ctx);
  drop_pages(m->begin, m->end);
  delete m;
}

}  // namespace

void release_mapped_pages(const torch::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.numel() == 0) return;
  const c10::DataPtr& p = t.storage().data_ptr();
  if (p.get_deleter() != &free_mapped_bytes) return;
  const auto* m = static_cast<const MappedBytes*>(p.get_context());
  // The bytes this view spans (first to last element), within the mapping.
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto* first = static_cast<const unsigned char*>(t.data_ptr());
  const unsigned char* end = first + (last + 1) * static_cast<int64_t>(t.element_size());
  drop_pages(std::max(first, m->begin), std::min(end, m->end));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { throw std::runtime_error(path + ": " + what); };

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("file too short (" + std::to_string(size) +
         " bytes): a safetensors file starts with an 8-byte header length");
  }
  auto map = std::make_shared<Mapping>();
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(std::string("mmap failed: ") + std::strerror(errno));
  map->data = static_cast<const unsigned char*>(p);
  map->size = size;
  map_ = map;

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map->data[i];
  if (header_len > size - 8) {
    fail("header length " + std::to_string(header_len) + " (bytes 0-7) goes beyond the file of " +
         std::to_string(size) + " bytes (truncated download?)");
  }
  if (header_len > kMaxHeaderBytes) {
    fail("header length " + std::to_string(header_len) + " (bytes 0-7) exceeds " +
         std::to_string(kMaxHeaderBytes) + " bytes");
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;

  json header;
  try {
    header = json::parse(map->data + 8, map->data + data_start);
  } catch (const json::exception& e) {
    fail("header (bytes 8-" + std::to_string(data_start) + ") is not valid JSON: " + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("\"__metadata__\" is not a JSON object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("\"__metadata__\" value of \"" + m.key() + "\" is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail("tensor \"" + name + "\": " + what); };
    if (!v.is_object()) bad("header entry is not a JSON object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing string \"dtype\"");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing array \"shape\"");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      bad("missing \"data_offsets\" [begin, end]");
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    const size_t esize = dtype_size(e.dtype);
    if (esize == 0) bad("unknown dtype \"" + e.dtype + "\"");
    // The product of the non-zero dims must fit in int64 too, or torch's
    // stride arithmetic would overflow even for an empty tensor.
    uint64_t numel = 1, nonzero = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entry " + d.dump() + " is not a non-negative integer");
      const uint64_t n = d.get<uint64_t>();
      if (__builtin_mul_overflow(nonzero, n ? n : 1, &nonzero) || nonzero > (uint64_t{1} << 62)) {
        bad("shape " + v["shape"].dump() + " overflows");
      }
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    for (const json& o : v["data_offsets"]) {
      if (!o.is_number_unsigned()) bad("data_offsets " + v["data_offsets"].dump() + " are not non-negative integers");
    }
    const uint64_t b = v["data_offsets"][0].get<uint64_t>();
    const uint64_t en = v["data_offsets"][1].get<uint64_t>();
    if (b > en || en > data_size) {
      bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
          "] out of range: the data section holds " + std::to_string(data_size) +
          " bytes (file offset " + std::to_string(data_start) + " on)");
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(esize), &nbytes) || nbytes != en - b) {
      bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] hold " +
          std::to_string(en - b) + " bytes but " + e.dtype + " " + shape_str(e.shape) + " needs " +
          (nbytes ? std::to_string(nbytes) : std::string("too many")));
    }
    e.begin = data_start + b;
    e.end = data_start + en;
    entries_.push_back(std::move(e));
  }

  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  // Empty tensors occupy no bytes and cannot overlap anything. Keep the farthest
  // end seen so far so a long tensor cannot hide an overlap behind a short one.
  uint64_t far = data_start;
  std::string far_name;
  for (const auto& e : entries_) {
    if (e.begin != e.end && e.begin < far) {
      fail("tensor \"" + e.name + "\" (bytes " + std::to_string(e.begin) + "-" +
           std::to_string(e.end) + ") overlaps tensor \"" + far_name + "\"");
    }
    if (e.end > far) {
      far = e.end;
      far_name = e.name;
    }
  }
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::runtime_error(path_ + ": no tensor \"" + name + "\"");
  return entries_[it->second];
}

namespace {

// The torch type of a dtype troupe reads; throws naming the tensor for another.
torch::ScalarType float_type(const std::string& path, const SafetensorsEntry& e) {
  if (e.dtype == "F32") return torch::kFloat32;
  if (e.dtype == "F16") return torch::kFloat16;
  if (e.dtype == "BF16") return torch::kBFloat16;
  throw std::runtime_error(path + ": tensor \"" + e.name + "\" has dtype " + e.dtype +
                           "; troupe reads F32, F16 or BF16");
}

}  // namespace

torch::Tensor SafetensorsFile::copy(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const torch::ScalarType raw = float_type(path_, e);
  torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(raw).device(torch::kCPU));
  if (e.end > e.begin) {
    std::memcpy(t.data_ptr(), map_->data + e.begin, e.end - e.begin);
    // The copy is what the caller keeps: the mapped pages it came from leave
    // this process's memory (the page cache keeps them; a second read faults
    // them back in), so a model's file and its copy never count twice.
    drop_pages(map_->data + e.begin, map_->data + e.end);
  }
  return t;
}

torch::Tensor SafetensorsFile::to_float(const std::string& name) const {
  torch::Tensor t = copy(name);
  return t.scalar_type() == torch::kFloat32 ? t : t.to(torch::kFloat32);
}

torch::Tensor SafetensorsFile::map(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const torch::ScalarType raw = float_type(path_, e);
  const unsigned char* begin = map_->data + e.begin;
  const size_t size = raw == torch::kFloat32 ? sizeof(float) : sizeof(uint16_t);
  if (e.end == e.begin || reinterpret_cast<uintptr_t>(begin) % size != 0) return copy(name);
  const size_t bytes = e.end - e.begin;
  auto* ctx = new MappedBytes{map_, begin, begin + bytes};
  c10::DataPtr ptr(const_cast<unsigned char*>(begin), ctx, &free_mapped_bytes, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, std::move(ptr), /*allocator=*/nullptr,
                       /*resizable=*/false);
  return torch::empty({0}, raw).set_(storage, 0, e.shape, c10::contiguous_strides(e.shape));
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> data;
  data.reserve(tensors.size());
  json header = json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || name.empty()) {
      throw std::invalid_argument("write_safetensors: invalid tensor name \"" + name + "\"");
    }
    if (!seen.insert(name).second) {
      throw std::invalid_argument("write_safetensors: duplicate tensor name \"" + name + "\"");
    }
    if (!t.defined()) {
      throw std::invalid_argument("write_safetensors: tensor \"" + name + "\" is undefined");
    }
    const bool bf16 = t.scalar_type() == torch::kBFloat16;
    torch::Tensor c = t.detach().to(torch::kCPU, bf16 ? torch::kBFloat16 : torch::kFloat32).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", bf16 ? "BF16" : "F32"},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(c));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp + ": cannot create file");
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& c : data) {
      out.write(static_cast<const char*>(c.data_ptr()),
                static_cast<std::streamsize>(c.numel() * c.element_size()));
    }
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error(tmp + ": write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + ": " + err);
  }
}

}  // namespace troupe::model
