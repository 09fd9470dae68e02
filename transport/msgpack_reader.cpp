#include "transport/msgpack_reader.hpp"

#include <cstring>

namespace troupe::transport {
namespace {

// skip() keeps one counter per open container, in a fixed array.
constexpr int kMaxSkipDepth = 64;

uint8_t byte_at(std::string_view d, size_t i) { return static_cast<uint8_t>(d[i]); }

}  // namespace

void MsgpackReader::need(size_t n) const {
  if (n > remaining())
    throw MsgpackError("truncated: a value needs " + std::to_string(n) + " bytes at offset " +
                       std::to_string(pos_) + ", " + std::to_string(remaining()) + " left");
}

uint64_t MsgpackReader::be(size_t skip, size_t n) const {
  need(skip + n);
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | byte_at(data_, pos_ + skip + i);
  return v;
}

MsgpackReader::Kind MsgpackReader::peek() const {
  if (at_end()) return Kind::kEnd;
  const uint8_t t = byte_at(data_, pos_);
  if (t <= 0x7f || t >= 0xe0) return Kind::kInt;
  if (t <= 0x8f) return Kind::kMap;
  if (t <= 0x9f) return Kind::kArray;
  if (t <= 0xbf) return Kind::kStr;
  switch (t) {
    case 0xc0:
      return Kind::kNil;
    case 0xc1:
      return Kind::kInvalid;
    case 0xc2:
    case 0xc3:
      return Kind::kBool;
    case 0xc4:
    case 0xc5:
    case 0xc6:
      return Kind::kBin;
    case 0xca:
    case 0xcb:
      return Kind::kFloat;
    case 0xd9:
    case 0xda:
    case 0xdb:
      return Kind::kStr;
    case 0xdc:
    case 0xdd:
      return Kind::kArray;
    case 0xde:
    case 0xdf:
      return Kind::kMap;
    default:
      break;
  }
  if ((t >= 0xcc && t <= 0xd3)) return Kind::kInt;
  return Kind::kExt;  // 0xc7-0xc9, 0xd4-0xd8
}

const char* MsgpackReader::kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNil:
      return "nil";
    case Kind::kBool:
      return "a boolean";
    case Kind::kInt:
      return "an integer";
    case Kind::kFloat:
      return "a float";
    case Kind::kStr:
      return "a string";
    case Kind::kBin:
      return "binary data";
    case Kind::kArray:
      return "an array";
    case Kind::kMap:
      return "a map";
    case Kind::kExt:
      return "an extension value";
    case Kind::kInvalid:
      return "the invalid byte 0xc1";
    case Kind::kEnd:
      return "the end of the frame";
  }
  return "?";
}

bool MsgpackReader::read_nil() {
  if (peek() != Kind::kNil) return false;
  ++pos_;
  return true;
}

bool MsgpackReader::read_bool(bool& out) {
  if (peek() != Kind::kBool) return false;
  out = byte_at(data_, pos_) == 0xc3;
  ++pos_;
  return true;
}

bool MsgpackReader::read_int(int64_t& out) {
  if (peek() != Kind::kInt) return false;
  const uint8_t t = byte_at(data_, pos_);
  if (t <= 0x7f) {
    out = t;
    pos_ += 1;
    return true;
  }
  if (t >= 0xe0) {
    out = static_cast<int8_t>(t);
    pos_ += 1;
    return true;
  }
  if (t >= 0xcc && t <= 0xcf) {  // uint 8/16/32/64
    const size_t n = size_t{1} << (t - 0xcc);
    const uint64_t v = be(1, n);
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    out = static_cast<int64_t>(v);
    pos_ += 1 + n;
    return true;
  }
  const size_t n = size_t{1} << (t - 0xd0);  // int 8/16/32/64
  const uint64_t v = be(1, n);
  const int shift = static_cast<int>(64 - 8 * n);
  // Sign-extend the n-byte two's complement value.
  out = static_cast<int64_t>(v << shift) >> shift;
  pos_ += 1 + n;
  return true;
}

bool MsgpackReader::read_uint(uint64_t& out) {
  if (peek() != Kind::kInt) return false;
  const uint8_t t = byte_at(data_, pos_);
  if (t >= 0xcc && t <= 0xcf) {
    const size_t n = size_t{1} << (t - 0xcc);
    out = be(1, n);
    pos_ += 1 + n;
    return true;
  }
  const size_t start = pos_;
  int64_t v = 0;
  if (!read_int(v)) return false;
  if (v < 0) {
    pos_ = start;
    return false;
  }
  out = static_cast<uint64_t>(v);
  return true;
}

bool MsgpackReader::read_number(double& out) {
  const Kind k = peek();
  if (k == Kind::kInt) {
    uint64_t u = 0;
    int64_t i = 0;
    if (read_int(i)) {
      out = static_cast<double>(i);
      return true;
    }
    if (!read_uint(u)) return false;
    out = static_cast<double>(u);
    return true;
  }
  if (k != Kind::kFloat) return false;
  if (byte_at(data_, pos_) == 0xca) {
    const uint32_t bits = static_cast<uint32_t>(be(1, 4));
    float f;
    std::memcpy(&f, &bits, sizeof f);
    out = f;
    pos_ += 5;
  } else {
    const uint64_t bits = be(1, 8);
    std::memcpy(&out, &bits, sizeof out);
    pos_ += 9;
  }
  return true;
}

bool MsgpackReader::read_str(std::string_view& out) {
  if (peek() != Kind::kStr) return false;
  const uint8_t t = byte_at(data_, pos_);
  size_t header = 1, len = 0;
  if (t <= 0xbf) {
    len = t & 0x1f;
  } else {
    const size_t n = size_t{1} << (t - 0xd9);  // str 8/16/32
    len = be(1, n);
    header = 1 + n;
  }
  need(header + len);
  out = data_.substr(pos_ + header, len);
  pos_ += header + len;
  return true;
}

bool MsgpackReader::container_header(uint8_t t, uint32_t& count, size_t& header, bool& is_map) const {
  if (t >= 0x80 && t <= 0x9f) {
    is_map = t <= 0x8f;
    count = t & 0x0f;
    header = 1;
  } else if (t == 0xdc || t == 0xde) {
    is_map = t == 0xde;
    count = static_cast<uint32_t>(be(1, 2));
    header = 3;
  } else if (t == 0xdd || t == 0xdf) {
    is_map = t == 0xdf;
    count = static_cast<uint32_t>(be(1, 4));
    header = 5;
  } else {
    return false;
  }
  // Every element takes at least one byte.
  const uint64_t min_bytes = uint64_t{count} * (is_map ? 2 : 1);
  if (min_bytes > remaining() - header)
    throw MsgpackError(std::string(is_map ? "a map" : "an array") + " at offset " + std::to_string(pos_) +
                       " claims " + std::to_string(count) + " elements but only " +
                       std::to_string(remaining() - header) + " bytes follow");
  return true;
}

bool MsgpackReader::read_array(uint32_t& count) {
  if (peek() != Kind::kArray) return false;
  size_t header = 0;
  bool is_map = false;
  container_header(byte_at(data_, pos_), count, header, is_map);
  pos_ += header;
  return true;
}

bool MsgpackReader::read_map(uint32_t& count) {
  if (peek() != Kind::kMap) return false;
  size_t header = 0;
  bool is_map = false;
  container_header(byte_at(data_, pos_), count, header, is_map);
  pos_ += header;
  return true;
}

void MsgpackReader::skip(int max_depth) {
  if (max_depth > kMaxSkipDepth) max_depth = kMaxSkipDepth;
  uint64_t pending[kMaxSkipDepth + 1];  // values left to skip in each open container
  int depth = 0;
  pending[0] = 1;
  for (;;) {
    while (depth >= 0 && pending[depth] == 0) --depth;
    if (depth < 0) return;
    --pending[depth];
    need(1);
    const uint8_t t = byte_at(data_, pos_);
    uint32_t count = 0;
    size_t header = 0;
    bool is_map = false;
    if (container_header(t, count, header, is_map)) {
      pos_ += header;
      if (count == 0) continue;
      if (depth + 1 > max_depth)
        throw MsgpackError("nesting deeper than " + std::to_string(max_depth) + " levels at offset " +
                           std::to_string(pos_ - header));
      pending[++depth] = uint64_t{count} * (is_map ? 2 : 1);
      continue;
    }
    size_t size = 0;  // whole value: header + payload
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
      size = 1;
    } else if (t >= 0xa0 && t <= 0xbf) {
      size = 1 + (t & 0x1f);
    } else if (t == 0xc4 || t == 0xd9) {
      size = 2 + be(1, 1);
    } else if (t == 0xc5 || t == 0xda) {
      size = 3 + be(1, 2);
    } else if (t == 0xc6 || t == 0xdb) {
      size = 5 + be(1, 4);
    } else if (t == 0xc7) {
      size = 3 + be(1, 1);
    } else if (t == 0xc8) {
      size = 4 + be(1, 2);
    } else if (t == 0xc9) {
      size = 6 + be(1, 4);
    } else if (t == 0xca) {
      size = 5;
    } else if (t == 0xcb) {
      size = 9;
    } else if (t >= 0xcc && t <= 0xcf) {
      size = 1 + (size_t{1} << (t - 0xcc));
    } else if (t >= 0xd0 && t <= 0xd3) {
      size = 1 + (size_t{1} << (t - 0xd0));
    } else if (t >= 0xd4 && t <= 0xd8) {
      size = 2 + (size_t{1} << (t - 0xd4));
    } else {  // 0xc1
      throw MsgpackError("the invalid byte 0xc1 at offset " + std::to_string(pos_));
    }
    need(size);
    pos_ += size;
  }
}

MsgpackReader MsgpackReader::at(size_t offset) const {
  MsgpackReader r(data_);
  r.pos_ = offset <= data_.size() ? offset : data_.size();
  return r;
}

}  // namespace troupe::transport
