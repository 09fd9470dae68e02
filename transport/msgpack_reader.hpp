#pragma once
// A bounded pull reader over one msgpack buffer (the decoding half of the
// wire; msgpack-c's packer is the encoding half).
//
// Why not msgpack-c's unpack: it allocates an array's `count * sizeof(object)`
// as soon as it reads the header, before the elements are there, so a
// 5-byte frame claiming 2^32 elements asks for 64 GiB. This reader checks
// every claimed length against the bytes left (each element takes at least
// one byte), so nothing it returns can make a caller allocate more than the
// frame could fill. It never reads past the buffer, and it never recurses.
//
// Errors: a structural problem (truncated value, a claimed length past the
// end, the never-used byte 0xc1, nesting deeper than the limit) throws
// MsgpackError. A value of another kind than asked for is not structural:
// the read_* call returns false and consumes nothing, so the caller can say
// which field had the wrong type.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe::transport {

class MsgpackError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class MsgpackReader {
 public:
  enum class Kind { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt, kInvalid, kEnd };

  explicit MsgpackReader(std::string_view data) : data_(data) {}

  // Kind of the next value (kEnd at the end of the buffer; kInvalid for 0xc1).
  Kind peek() const;
  static const char* kind_name(Kind kind);  // "an integer", "a string", ... (for messages)

  // Each consumes one value and returns true, or returns false and consumes
  // nothing when the next value is of another kind.
  bool read_nil();
  bool read_bool(bool& out);
  bool read_uint(uint64_t& out);         // a non-negative integer (any msgpack int encoding)
  bool read_int(int64_t& out);           // an integer in int64 range (a uint64 above INT64_MAX is false)
  bool read_number(double& out);         // a float32, float64 or integer, as a double
  bool read_str(std::string_view& out);  // a view into the buffer
  bool read_array(uint32_t& count);      // header only; count <= bytes left
  bool read_map(uint32_t& count);        // header only; 2 * count <= bytes left

  // Consumes one whole value of any kind; containers may nest max_depth deep.
  void skip(int max_depth);

  size_t offset() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  bool at_end() const { return pos_ == data_.size(); }
  // A reader over the same buffer, positioned at `offset` (from offset()).
  MsgpackReader at(size_t offset) const;

 private:
  // Reads a big-endian unsigned integer of `n` bytes at pos_ + skip; throws when truncated.
  uint64_t be(size_t skip, size_t n) const;
  void need(size_t n) const;  // throws unless n bytes are left at pos_
  // Length and header size of a str/bin/ext/array/map at pos_ (header bytes
  // read, payload not checked).
  bool container_header(uint8_t tag, uint32_t& count, size_t& header, bool& is_map) const;

  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace troupe::transport
