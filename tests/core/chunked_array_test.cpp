// ChunkedArray: indexing across chunks, value-initialised growth, and
// elements that stay where they are while the array grows.
#include "core/chunked_array.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace troupe::core {
namespace {

struct Item {
  int32_t a = 7;
  int64_t b = -1;
};

TEST(ChunkedArray, GrowsAcrossChunksWithoutMovingElements) {
  ChunkedArray<Item, 4> v;
  EXPECT_TRUE(v.empty());
  std::vector<const Item*> where;
  for (int32_t i = 0; i < 11; ++i) {
    Item& x = v.emplace_back();
    EXPECT_EQ(x.a, 7) << "value-initialised";
    EXPECT_EQ(x.b, -1);
    x.a = i;
    x.b = 100 + i;
    where.push_back(&x);
  }
  ASSERT_EQ(v.size(), 11u);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].a, static_cast<int32_t>(i));
    EXPECT_EQ(v[i].b, 100 + static_cast<int64_t>(i));
    EXPECT_EQ(&v[i], where[i]) << "an element moved as the array grew";
  }
  const ChunkedArray<Item, 4>& c = v;
  EXPECT_EQ(c[10].a, 10);
}

}  // namespace
}  // namespace troupe::core
