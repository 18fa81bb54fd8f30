// ti_distinct.cpp -- grouping identical rows (ti_distinct.h).
//
// One pass in row order over an open-addressing hash table: a row either
// finds an earlier row with the same bits (its group) or starts a group, so
// groups come out numbered by their first row. Equal hashes are confirmed
// bit by bit; a collision only costs a probe. The hash starts from a secret
// seed (../hash_seed.h), so rows cannot be made to collide.
#include "ti_distinct.h"

#include <algorithm>
#include <cstring>

#include "../hash_seed.h"

namespace knn {
namespace cpu {
namespace {

constexpr int64_t kCancelPollRows = 1 << 16;

uint64_t hash_bits(const float *row, int dim, uint64_t seed) {
  uint64_t h = seed ^ static_cast<uint64_t>(dim);
  for (int j = 0; j < dim; j++) {
    uint32_t bits;
    std::memcpy(&bits, &row[j], sizeof(bits));
    h = (h ^ bits) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  return h;
}

// Lays out begin/rows from each row's group (rows ascend within a group
// because they are visited in order).
void fill_groups(const std::vector<int64_t> &group_of, int64_t n_groups,
                 DistinctRows *out) {
  const int64_t n = static_cast<int64_t>(group_of.size());
  out->n_distinct = n_groups;
  out->begin.assign(n_groups + 1, 0);
  for (int64_t i = 0; i < n; i++) out->begin[group_of[i] + 1]++;
  for (int64_t g = 0; g < n_groups; g++) out->begin[g + 1] += out->begin[g];
  std::vector<int64_t> fill(out->begin.begin(), out->begin.end() - 1);
  out->rows.resize(n);
  for (int64_t i = 0; i < n; i++) out->rows[fill[group_of[i]]++] = i;
}

}  // namespace

void every_row_distinct(const float *matrix, int64_t n, int dim,
                        DistinctRows *out) {
  out->dim = dim;
  out->n_distinct = n;
  out->begin.resize(n + 1);
  out->rows.resize(n);
  for (int64_t i = 0; i < n; i++) out->begin[i] = out->rows[i] = i;
  out->begin[n] = n;
  out->owned.reset();
  out->values = matrix;
}

bool find_distinct_rows(const float *matrix, int64_t n, int dim,
                        const int32_t *cancel, DistinctRows *out) {
  auto cancelled = [cancel] {
    return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
  };
  const size_t row_bytes = sizeof(float) * dim;
  int64_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  struct Slot {
    uint64_t hash;
    int64_t group;  // -1: empty
  };
  std::vector<Slot> table(slots, Slot{0, -1});
  std::vector<int64_t> group_of(n);
  std::vector<int64_t> first_row;  // of each group
  const uint64_t seed = hash_seed();
  for (int64_t i = 0; i < n; i++) {
    if (i % kCancelPollRows == 0 && cancelled()) return false;
    const float *row = matrix + i * dim;
    const uint64_t h = hash_bits(row, dim, seed);
    for (int64_t s = static_cast<int64_t>(h & (slots - 1));; s = (s + 1) & (slots - 1)) {
      Slot &slot = table[s];
      if (slot.group < 0) {
        slot = {h, static_cast<int64_t>(first_row.size())};
        first_row.push_back(i);
        group_of[i] = slot.group;
        break;
      }
      if (slot.hash == h &&
          std::memcmp(matrix + first_row[slot.group] * dim, row, row_bytes) == 0) {
        group_of[i] = slot.group;
        break;
      }
    }
  }
  const int64_t n_groups = static_cast<int64_t>(first_row.size());
  if (n_groups == n) {
    every_row_distinct(matrix, n, dim, out);
    return !cancelled();
  }
  out->dim = dim;
  fill_groups(group_of, n_groups, out);
  out->owned.reset(new float[static_cast<size_t>(n_groups) * dim]);
  for (int64_t g = 0; g < n_groups; g++)
    std::memcpy(out->owned.get() + g * dim, matrix + first_row[g] * dim, row_bytes);
  out->values = out->owned.get();
  return !cancelled();
}

}  // namespace cpu
}  // namespace knn
