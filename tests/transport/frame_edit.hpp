#pragma once
// Test helpers that write frames decode() must refuse: a valid frame with one
// top-level key replaced, removed or added (through msgpack-c's own object
// model, so the edit is independent of the code under test).
#include <functional>
#include <string>

#include <msgpack.hpp>

namespace troupe::transport::test {

using Packer = msgpack::packer<msgpack::sbuffer>;
using ValueWriter = std::function<void(Packer&)>;

// The start of a hand-written frame: a map of 3 + `fields` keys and the
// "p", "v" and "t" keys; the caller packs the `fields` other keys.
inline void pack_header(Packer& pk, const std::string& type, uint32_t fields, int version = 1) {
  pk.pack_map(3 + fields);
  pk.pack(std::string("p"));
  pk.pack(std::string("troupe"));
  pk.pack(std::string("v"));
  pk.pack(version);
  pk.pack(std::string("t"));
  pk.pack(type);
}

// `frame` with the value of `key` written by `write` (added when absent), or
// removed when `write` is empty.
inline std::string edit_field(const std::string& frame, const std::string& key, const ValueWriter& write) {
  msgpack::object_handle oh = msgpack::unpack(frame.data(), frame.size());
  const msgpack::object& map = oh.get();
  msgpack::sbuffer buf;
  Packer pk(buf);
  bool present = false;
  for (uint32_t i = 0; i < map.via.map.size; ++i)
    if (map.via.map.ptr[i].key.as<std::string>() == key) present = true;
  pk.pack_map(map.via.map.size + (present ? 0 : 1) - (present && !write ? 1 : 0));
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (kv.key.as<std::string>() == key) {
      if (!write) continue;
      pk.pack(kv.key);
      write(pk);
    } else {
      pk.pack(kv.key);
      pk.pack(kv.val);
    }
  }
  if (!present && write) {
    pk.pack(key);
    write(pk);
  }
  return std::string(buf.data(), buf.size());
}

inline std::string without_field(const std::string& frame, const std::string& key) {
  return edit_field(frame, key, nullptr);
}

// The top-level keys of a frame, in order.
inline std::vector<std::string> frame_keys(const std::string& frame) {
  msgpack::object_handle oh = msgpack::unpack(frame.data(), frame.size());
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < oh.get().via.map.size; ++i)
    keys.push_back(oh.get().via.map.ptr[i].key.as<std::string>());
  return keys;
}

// The kind of a frame's value under `key` ("str" or other), to pick a wrong one.
inline bool field_is_string(const std::string& frame, const std::string& key) {
  msgpack::object_handle oh = msgpack::unpack(frame.data(), frame.size());
  for (uint32_t i = 0; i < oh.get().via.map.size; ++i)
    if (oh.get().via.map.ptr[i].key.as<std::string>() == key)
      return oh.get().via.map.ptr[i].val.type == msgpack::type::STR;
  return false;
}

}  // namespace troupe::transport::test
