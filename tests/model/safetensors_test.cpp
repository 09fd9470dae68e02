#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <torch/types.h>

#include "model/safetensors.hpp"
#include "test_utils.hpp"

namespace troupe::model {
namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// Writes a file: 8-byte length, `header`, then `data`.
std::string write_raw(const test::TempDir& dir, const std::string& header, const std::string& data,
                      const std::string& name = "t.safetensors") {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << le64(header.size()) << header << data;
  return path;
}

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// The text of the E that `f` throws, or "" when it does not throw (any other
// exception escapes and fails the test).
template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// The error text of opening `path`, or "" when it opens.
std::string open_error(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(Safetensors, RoundTripF32WithMetadata) {
  test::TempDir dir;
  const torch::Tensor a = torch::arange(24, torch::kFloat32).reshape({2, 3, 4}) * 0.5;
  const torch::Tensor b = torch::tensor({-1.5f, 2.25f});
  const torch::Tensor s = torch::tensor(3.0f);  // scalar
  const torch::Tensor e = torch::empty({0, 4});
  const torch::Tensor nc = torch::arange(6, torch::kFloat32).reshape({2, 3}).t();  // non-contiguous
  const torch::Tensor d = torch::arange(3, torch::kFloat64);
  write_safetensors(dir.file("m.safetensors"),
                    {{"a", a}, {"b", b}, {"s", s}, {"e", e}, {"nc", nc}, {"d", d}},
                    {{"format", "pt"}, {"who", "troupe"}});
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.safetensors.tmp")));

  SafetensorsFile f(dir.file("m.safetensors"));
  ASSERT_EQ(f.entries().size(), 6u);
  EXPECT_EQ(f.entries()[0].name, "a");  // data order
  EXPECT_EQ(f.entries()[0].begin % 8, 0u);  // header padded to 8
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("who"), "troupe");
  EXPECT_EQ(f.entry("a").dtype, "F32");
  EXPECT_EQ(f.entry("a").shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(torch::equal(f.to_float("a"), a));
  EXPECT_TRUE(torch::equal(f.to_float("b"), b));
  EXPECT_EQ(f.to_float("s").dim(), 0);
  EXPECT_EQ(f.to_float("s").item<float>(), 3.0f);
  EXPECT_EQ(f.to_float("e").sizes(), e.sizes());
  EXPECT_TRUE(torch::equal(f.to_float("nc"), nc));
  EXPECT_TRUE(torch::equal(f.to_float("d"), d.to(torch::kFloat32)));
  EXPECT_FALSE(f.contains("zzz"));
  const std::string missing = error_of<std::runtime_error>([&] { f.to_float("zzz"); });
  EXPECT_HAS(missing, dir.file("m.safetensors") + ": no tensor \"zzz\"");

  // The tensor owns its data: it outlives the file object.
  torch::Tensor kept;
  {
    SafetensorsFile g(dir.file("m.safetensors"));
    kept = g.to_float("a");
  }
  kept.add_(1);
  EXPECT_TRUE(torch::equal(kept, a + 1));
}

// to_float drops the mapped pages it copied from; reading a tensor again, or
// its neighbours sharing a page, faults them back in unchanged.
TEST(Safetensors, ReadingAgainAfterItsPagesWereDroppedGivesTheSame) {
  test::TempDir dir;
  const torch::Tensor big = torch::randn({3, 5001});  // spans several pages, starts and ends mid-page
  const torch::Tensor small = torch::tensor({7.0f, 8.0f, 9.0f});
  write_safetensors(dir.file("m.safetensors"), {{"small", small}, {"big", big}, {"tail", small * 2}});
  SafetensorsFile f(dir.file("m.safetensors"));
  for (int round = 0; round < 3; ++round) {
    EXPECT_TRUE(torch::equal(f.to_float("big"), big)) << round;
    EXPECT_TRUE(torch::equal(f.to_float("small"), small)) << round;
    EXPECT_TRUE(torch::equal(f.to_float("tail"), small * 2)) << round;
  }
}

// This process's resident pages of files, in KiB.
int64_t rss_file_kib() { return test::proc_kib("/proc/self/status", "RssFile"); }

// map() reads F32 bytes in place: the same values as to_float's copy, for
// any shape, and for views of it.
TEST(Safetensors, MapReadsWhatToFloatCopies) {
  test::TempDir dir;
  const torch::Tensor a = torch::randn({37, 129});
  const torch::Tensor b = torch::randn({5});
  write_safetensors(dir.file("m.safetensors"), {{"b", b}, {"a", a}});
  torch::Tensor mapped;
  {
    SafetensorsFile f(dir.file("m.safetensors"));
    mapped = f.map("a");
    EXPECT_TRUE(torch::equal(mapped, f.to_float("a")));
    EXPECT_TRUE(torch::equal(f.map("b"), b));
  }
  // It keeps the mapping alive past the file object; dropping its pages, or a
  // view's, changes nothing it reads.
  EXPECT_TRUE(torch::equal(mapped, a));
  release_mapped_pages(mapped.narrow(0, 3, 20));
  release_mapped_pages(mapped);
  EXPECT_TRUE(torch::equal(mapped, a));
  EXPECT_TRUE(torch::equal(mapped.t().contiguous(), a.t().contiguous()));
  // Not a mapped tensor: nothing happens to it.
  torch::Tensor heap = a.clone();
  release_mapped_pages(heap);
  release_mapped_pages(torch::Tensor());
  EXPECT_TRUE(torch::equal(heap, a));
}

// F32 data not aligned for floats (a header whose length leaves it at an odd
// offset) is copied instead (16-bit data: the test below).
TEST(Safetensors, MapCopiesWhatItCannotMap) {
  test::TempDir dir;
  const float v[3] = {1.5f, -2.0f, 0.25f};
  const std::string header = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";  // 8 + an odd length
  ASSERT_EQ(header.size() % 2, 1u);
  SafetensorsFile odd(write_raw(dir, header, bytes_of(v, 12)));
  const torch::Tensor x = odd.map("x");
  EXPECT_EQ(x.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(x, torch::tensor({1.5f, -2.0f, 0.25f})));
}

// map() keeps a 16-bit tensor in its dtype over the mapping; F32 reads as
// to_float's; the writer keeps bfloat16 tensors as BF16, so a round trip
// gives the same bits.
TEST(Safetensors, MapKeepsTheFilesDtypeAndTheWriterKeepsBfloat16) {
  test::TempDir dir;
  const torch::Tensor a = torch::randn({33, 65});
  const torch::Tensor bits = a.to(torch::kBFloat16), v = torch::randn({7});
  write_safetensors(dir.file("m.safetensors"), {{"v", v}, {"b", bits}, {"a", a}});
  torch::Tensor mapped;
  {
    SafetensorsFile f(dir.file("m.safetensors"));
    EXPECT_EQ(f.entry("b").dtype, "BF16");
    EXPECT_EQ(f.entry("a").dtype, "F32");
    EXPECT_EQ(f.entry("b").end - f.entry("b").begin, 33u * 65u * 2u);
    mapped = f.map("b");
    EXPECT_EQ(mapped.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(mapped, bits));
    EXPECT_TRUE(torch::equal(f.copy("b"), bits));
    EXPECT_TRUE(torch::equal(f.to_float("b"), bits.to(torch::kFloat32)));
    EXPECT_TRUE(torch::equal(f.map("a"), a));
    EXPECT_TRUE(torch::equal(f.map("v"), v));
  }
  release_mapped_pages(mapped);  // a mapped bfloat16 tensor: its pages go, its values stay
  EXPECT_TRUE(torch::equal(mapped, bits));
  // Half-precision bytes at an odd offset cannot be mapped: copied, still half.
  const uint16_t h[2] = {0x3C00, 0xC000};  // F16 1, -2
  const std::string header = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[1,5]}})";
  ASSERT_EQ((8 + header.size() + 1) % 2, 1u) << "the data at an odd offset";
  SafetensorsFile odd(write_raw(dir, header, std::string(1, '\0') + bytes_of(h, 4), "odd.safetensors"));
  const torch::Tensor t = odd.map("h");
  EXPECT_EQ(t.scalar_type(), torch::kFloat16);
  EXPECT_TRUE(torch::equal(t.to(torch::kFloat32), torch::tensor({1.0f, -2.0f})));
}

// What map() is for: a matrix read through it is resident while it is
// read and leaves memory when released or freed; the heap never holds it.
TEST(Safetensors, MappedPagesLeaveMemoryWhenReleasedOrFreed) {
  test::TempDir dir;
  const torch::Tensor big = torch::randn({4096, 4096});  // 64 MiB
  write_safetensors(dir.file("m.safetensors"), {{"w", big}});
  SafetensorsFile f(dir.file("m.safetensors"));
  const double want = big.sum().item<double>();
  const int64_t before = rss_file_kib();
  ASSERT_GT(before, 0);
  {
    const torch::Tensor w = f.map("w");
    EXPECT_EQ(w.sum().item<double>(), want);  // every page read
    EXPECT_GT(rss_file_kib() - before, 56 << 10);
    release_mapped_pages(w.narrow(0, 0, 2048));  // the first half
    const int64_t half = rss_file_kib() - before;
    EXPECT_GT(half, 24 << 10);
    EXPECT_LT(half, 40 << 10);
    release_mapped_pages(w);
    EXPECT_LT(rss_file_kib() - before, 8 << 10);
    EXPECT_EQ(w.sum().item<double>(), want);  // read again: the same
    EXPECT_GT(rss_file_kib() - before, 56 << 10);
  }  // freed: its pages go
  EXPECT_LT(rss_file_kib() - before, 8 << 10);
}

TEST(Safetensors, WriterRejectsBadNames) {
  test::TempDir dir;
  const torch::Tensor t = torch::zeros({2});
  EXPECT_HAS(error_of<std::invalid_argument>([&] {
               write_safetensors(dir.file("x"), {{"a", t}, {"a", t}});
             }),
             "duplicate tensor name \"a\"");
  EXPECT_HAS(error_of<std::invalid_argument>([&] {
               write_safetensors(dir.file("x"), {{"__metadata__", t}});
             }),
             "invalid tensor name \"__metadata__\"");
  EXPECT_HAS(error_of<std::invalid_argument>([&] {
               write_safetensors(dir.file("x"), {{"u", torch::Tensor()}});
             }),
             "tensor \"u\" is undefined");
  EXPECT_HAS(error_of<std::runtime_error>([&] {
               write_safetensors(dir.file("no/such/dir/x"), {{"a", t}});
             }),
             "no/such/dir/x.tmp: cannot create file");
  EXPECT_FALSE(std::filesystem::exists(dir.file("x"))) << "a refused write leaves no file";
}

TEST(Safetensors, ReadsHandBuiltF16AndBF16) {
  test::TempDir dir;
  // F16: 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800, 65504 = 0x7BFF.
  const uint16_t h[4] = {0x3C00, 0xC000, 0x3800, 0x7BFF};
  // BF16: upper half of the fp32 bits. 1.0 = 0x3F80, -3.5 = 0xC060, 0.15625 = 0x3E20.
  const uint16_t bf[3] = {0x3F80, 0xC060, 0x3E20};
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("bf":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})";
  const std::string path = write_raw(dir, header, bytes_of(h, 8) + bytes_of(bf, 6));
  SafetensorsFile f(path);
  const torch::Tensor th = f.to_float("h");
  EXPECT_EQ(th.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(th, torch::tensor({1.0f, -2.0f, 0.5f, 65504.0f}).reshape({2, 2})));
  EXPECT_TRUE(torch::equal(f.to_float("bf"), torch::tensor({1.0f, -3.5f, 0.15625f})));
}

TEST(Safetensors, OtherDtypesOpenButDoNotConvert) {
  test::TempDir dir;
  const int64_t v[2] = {1, 2};
  const std::string path =
      write_raw(dir, R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", bytes_of(v, 16));
  SafetensorsFile f(path);
  try {
    f.to_float("ids");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()), "ids");
    EXPECT_HAS(std::string(e.what()), "I64");
  }
}

TEST(Safetensors, TooShortAndBadHeaderLength) {
  test::TempDir dir;
  std::ofstream(dir.file("empty"), std::ios::binary);
  EXPECT_HAS(open_error(dir.file("empty")), "too short");
  std::ofstream(dir.file("five"), std::ios::binary) << "12345";
  EXPECT_HAS(open_error(dir.file("five")), "too short");
  std::ofstream(dir.file("big"), std::ios::binary) << le64(1000) << "{}";
  std::string e = open_error(dir.file("big"));
  EXPECT_HAS(e, "header length 1000");
  EXPECT_HAS(e, "beyond");
  std::ofstream(dir.file("huge"), std::ios::binary) << le64(~uint64_t{0}) << "{}";
  EXPECT_HAS(open_error(dir.file("huge")), "beyond");
  EXPECT_HAS(open_error(dir.file("missing")), "cannot open");
  EXPECT_HAS(open_error(dir.path()), "not a regular file");
}

TEST(Safetensors, HeaderNotJson) {
  test::TempDir dir;
  std::string e = open_error(write_raw(dir, "{\"a\": ", ""));
  EXPECT_HAS(e, "not valid JSON");
  EXPECT_HAS(e, "bytes 8-14");
  EXPECT_HAS(open_error(write_raw(dir, "[1,2]", "")), "not a JSON object");
  EXPECT_HAS(open_error(write_raw(dir, std::string("{\"a\":\xff}", 7), "")), "not valid JSON");
  EXPECT_HAS(open_error(write_raw(dir, R"({"__metadata__":{"k":1}})", "")), "__metadata__");
}

TEST(Safetensors, BadEntriesNameTheTensor) {
  test::TempDir dir;
  const std::string data(16, '\0');
  struct Case {
    const char* header;
    const char* part;
  } cases[] = {
      {R"({"w":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", "unknown dtype \"F33\""},
      {R"({"w":{"shape":[4],"data_offsets":[0,16]}})", "dtype"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", "shape"},
      {R"({"w":{"dtype":"F32","shape":[4]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "shape entry -4"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,16]}})", "shape entry"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,-16]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}})", "out of range"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[12,4]}})", "out of range"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[18446744073709551615,16]}})",
       "out of range"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", "needs 12"},
      {R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,16]}})", "needs 8"},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,16]}})",
       "overflows"},
      {R"({"w":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})",
       "overflows"},
      {R"({"w":7})", "not a JSON object"},
  };
  for (const auto& c : cases) {
    const std::string e = open_error(write_raw(dir, c.header, data));
    EXPECT_HAS(e, "\"w\"");
    EXPECT_HAS(e, c.part);
  }
}

TEST(Safetensors, OverlappingTensors) {
  test::TempDir dir;
  const std::string data(32, '\0');
  std::string e = open_error(write_raw(
      dir,
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      data));
  EXPECT_HAS(e, "overlaps");
  EXPECT_HAS(e, "\"a\"");
  EXPECT_HAS(e, "\"b\"");
  // A long tensor hiding an overlap behind a short one.
  e = open_error(write_raw(
      dir,
      R"({"long":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},"s1":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("s2":{"dtype":"F32","shape":[1],"data_offsets":[20,24]}})",
      data));
  EXPECT_HAS(e, "overlaps");
  // Empty tensors overlap nothing.
  EXPECT_EQ(open_error(write_raw(
                dir,
                R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                data)),
            "");
}

TEST(Safetensors, TruncatedFileFromWriter) {
  test::TempDir dir;
  write_safetensors(dir.file("m.safetensors"), {{"w", torch::ones({64})}});
  const auto size = std::filesystem::file_size(dir.file("m.safetensors"));
  std::filesystem::resize_file(dir.file("m.safetensors"), size - 4);
  const std::string e = open_error(dir.file("m.safetensors"));
  EXPECT_HAS(e, "\"w\"");
  EXPECT_HAS(e, "out of range");
  std::filesystem::resize_file(dir.file("m.safetensors"), 20);
  EXPECT_HAS(open_error(dir.file("m.safetensors")), "beyond");
}

// Random corruptions of a valid file: each either opens, with every tensor
// inside the file and readable (or refused for its dtype by name), or is
// refused with a runtime_error that names the file and one of the defects the
// reader checks. Both outcomes occur (the fuzz reaches past the header).
TEST(Safetensors, FuzzedFilesOpenConsistentlyOrNameTheirDefect) {
  test::TempDir dir;
  write_safetensors(dir.file("ok"), {{"a", torch::ones({3, 4})}, {"b", torch::zeros({5})}},
                    {{"k", "v"}});
  std::ifstream in(dir.file("ok"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = dir.file("bad");
  const char* defects[] = {"file too short",   "header length",
                           "header (bytes 8-", "header is not a JSON object",
                           "\"__metadata__\"", "tensor \""};
  uint64_t x = 88172645463325252ULL;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int opened = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < flips; ++k) bad[next() % bad.size()] = static_cast<char>(next());
    if (i % 5 == 0) bad.resize(next() % bad.size());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    SCOPED_TRACE("corruption " + std::to_string(i));
    std::unique_ptr<SafetensorsFile> f;
    const std::string e = error_of<std::runtime_error>([&] { f = std::make_unique<SafetensorsFile>(path); });
    if (!f) {
      ++refused;
      ASSERT_EQ(e.rfind(path + ": ", 0), 0u) << e;
      const std::string what = e.substr(path.size() + 2);
      EXPECT_TRUE(std::any_of(std::begin(defects), std::end(defects), [&](const char* d) {
        return what.rfind(d, 0) == 0;
      })) << e;
      continue;
    }
    ++opened;
    for (const auto& en : f->entries()) {
      EXPECT_LE(en.begin, en.end) << en.name;
      EXPECT_LE(en.end, bad.size()) << en.name;
      int64_t numel = 1;
      for (int64_t d : en.shape) numel *= d;
      torch::Tensor t;
      const std::string te = error_of<std::runtime_error>([&] { t = f->to_float(en.name); });
      if (t.defined()) {
        EXPECT_EQ(t.numel(), numel) << en.name;
        EXPECT_EQ(t.scalar_type(), torch::kFloat32);
      } else {
        EXPECT_HAS(te, "tensor \"" + en.name + "\" has dtype " + en.dtype);
      }
    }
  }
  EXPECT_GT(opened, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace troupe::model
