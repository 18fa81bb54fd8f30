// output_prefault_test.cpp -- the result arrays' pages made present beside
// the engine's writes (output_prefault.h). CPU only.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "output_prefault.h"

namespace {

using knn::OutputPrefault;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A fresh anonymous mapping: no page is present until it is written.
struct Fresh {
  explicit Fresh(size_t bytes) : size(bytes) {
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base = p == MAP_FAILED ? nullptr : static_cast<unsigned char *>(p);
  }
  ~Fresh() {
    if (base != nullptr) munmap(base, size);
  }
  // Pages of [at, at + bytes) present now (mincore).
  size_t present(size_t at, size_t bytes) const {
    std::vector<unsigned char> v((bytes + kPage - 1) / kPage);
    if (mincore(base + at, bytes, v.data()) != 0) return 0;
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  }
  unsigned char *base = nullptr;
  size_t size;
};

bool kernel_populates() {
  Fresh probe(kPage);
  return probe.base != nullptr && madvise(probe.base, kPage, 23 /* MADV_POPULATE_WRITE */) == 0;
}

TEST(OutputPrefault, PopulatesFreshPagesAndKeepsEveryByteWritten) {
  if (!kernel_populates()) {
    GTEST_SKIP() << "this kernel lacks MADV_POPULATE_WRITE";
  }
  // Two arrays as a join's: ids and distances, 40 MB each, the second one
  // starting in the middle of a page.
  const size_t bytes = size_t{40} << 20;
  Fresh map(2 * bytes + 2 * kPage);
  ASSERT_NE(map.base, nullptr);
  auto *ids = reinterpret_cast<int64_t *>(map.base);
  auto *dists = reinterpret_cast<double *>(map.base + bytes + kPage + kPage / 2);
  const size_t slots = bytes / 8;
  ASSERT_LT(map.present(0, map.size), map.size / kPage / 10);
  ids[0] = 11;  // written before, while and after the pages are populated
  dists[slots - 1] = 0.5;
  size_t present = 0;
  {
    OutputPrefault prefault(ids, bytes, dists, bytes, 3);
    EXPECT_EQ(prefault.threads(), 3);
    for (size_t i = 1; i < slots; i += 4099) {
      ids[i] = static_cast<int64_t>(i);
      dists[i - 1] = static_cast<double>(i) / 7;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((present = map.present(0, map.size)) < 2 * bytes / kPage - 2 &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Every whole page inside the arrays (all but the second one's first and last).
  EXPECT_GE(present, 2 * bytes / kPage - 2);
  EXPECT_EQ(ids[0], 11);
  EXPECT_EQ(dists[slots - 1], 0.5);
  for (size_t i = 1; i < slots; i++) {
    const int64_t id_expected = (i - 1) % 4099 == 0 ? static_cast<int64_t>(i) : 0;
    ASSERT_EQ(ids[i], id_expected) << i;
  }
  for (size_t i = 0; i + 1 < slots; i++) {
    const double expected = i % 4099 == 0 ? static_cast<double>(i + 1) / 7 : 0.0;
    ASSERT_EQ(dists[i], expected) << i;
  }
}

TEST(OutputPrefault, SmallResultsStartNoThread) {
  std::vector<int64_t> ids(1000);
  std::vector<double> dists(1000);
  const OutputPrefault prefault(ids.data(), ids.size() * 8, dists.data(), dists.size() * 8, 4);
  EXPECT_EQ(prefault.threads(), 0);
  const OutputPrefault none(nullptr, OutputPrefault::kMinBytes, nullptr, 0, 4);
  EXPECT_EQ(none.threads(), 0);
}

TEST(OutputPrefault, StopsWhenDestroyedBeforeItEnds) {
  // 1 GB of address space, barely populated: the destructor asks the
  // threads to stop after their current 2 MB step and joins them.
  const size_t bytes = size_t{512} << 20;
  Fresh map(2 * bytes);
  ASSERT_NE(map.base, nullptr);
  { const OutputPrefault prefault(map.base, bytes, map.base + bytes, bytes, 2); }
  if (kernel_populates()) {
    EXPECT_LT(map.present(0, map.size), map.size / kPage);
  }
}

}  // namespace
