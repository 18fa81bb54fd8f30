// group_split.cpp -- per-group joins in the job layer (group_split.h).
//
// Partitioning is a counting sort over dense group numbers (an
// open-addressing table from the caller's int64 group ids), linear and
// stable, so every group's rows stay in ascending row (= id) order and the
// engines' tie order by row is still the order by id. Each group's rows
// are gathered into contiguous buffers, reused from group to group.

#include "group_split.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "entry_guard.h"
#include "group_subproblem.h"
#include "hash_seed.h"
#include "result_padding.h"
#include "stats_sum.h"
#include "stopwatch.h"

namespace knn {

namespace {

// Rows between two looks at the cancel flag.
constexpr int64_t kSlice = int64_t{1} << 16;

bool cancelled(const int32_t *cancel) {
  return cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0;
}

// Dense numbers 0, 1, ... of int64 group ids in order of first insertion:
// linear probing in a power-of-two table kept at most half full (a lookup
// is a multiplication and a probe or two; std::unordered_map's division
// and chains cost several times that, over a million rows).
class DenseGroups {
 public:
  DenseGroups() { resize(16); }

  // The number of id, given the next one when it is new.
  int64_t add(int64_t id) {
    size_t s = slot(id);
    while (number_[s] >= 0) {
      if (id_[s] == id) return number_[s];
      s = (s + 1) & (id_.size() - 1);
    }
    if (2 * (count_ + 1) > static_cast<int64_t>(id_.size())) {
      resize(2 * id_.size());
      return add(id);
    }
    id_[s] = id;
    number_[s] = count_;
    return count_++;
  }

  // The number of id, or -1 when it was never added.
  int64_t find(int64_t id) const {
    for (size_t s = slot(id); number_[s] >= 0; s = (s + 1) & (id_.size() - 1))
      if (id_[s] == id) return number_[s];
    return -1;
  }

  int64_t size() const { return count_; }

 private:
  // From the secret seed (hash_seed.h): ids cannot be chosen to collide.
  size_t slot(int64_t id) const {
    return static_cast<size_t>(((static_cast<uint64_t>(id) ^ seed_) * 0x9E3779B97F4A7C15ull) >>
                               shift_);
  }

  void resize(size_t slots) {
    std::vector<int64_t> ids = std::move(id_), numbers = std::move(number_);
    id_.assign(slots, 0);
    number_.assign(slots, -1);
    shift_ = 64;
    for (size_t n = slots; n > 1; n >>= 1) shift_--;
    for (size_t s = 0; s < ids.size(); s++) {
      if (numbers[s] < 0) continue;
      size_t t = slot(ids[s]);
      while (number_[t] >= 0) t = (t + 1) & (slots - 1);
      id_[t] = ids[s];
      number_[t] = numbers[s];
    }
  }

  std::vector<int64_t> id_, number_;  // number_ -1: empty slot
  int shift_ = 64;
  int64_t count_ = 0;
  const uint64_t seed_ = hash_seed();
};

// Stable counting sort of rows by their dense group (-1: no group, dropped).
bool bucket_rows(const std::vector<int64_t> &group_of, int64_t n_groups, const int32_t *cancel,
                 std::vector<int64_t> *rows, std::vector<int64_t> *begin) {
  begin->assign(n_groups + 1, 0);
  for (int64_t g : group_of)
    if (g >= 0) (*begin)[g + 1]++;
  for (int64_t g = 0; g < n_groups; g++) (*begin)[g + 1] += (*begin)[g];
  std::vector<int64_t> next(begin->begin(), begin->end() - 1);
  rows->resize(static_cast<size_t>((*begin)[n_groups]));
  const int64_t n = static_cast<int64_t>(group_of.size());
  for (int64_t i = 0; i < n; i++) {
    if ((i & (kSlice - 1)) == 0 && cancelled(cancel)) return false;
    if (group_of[i] >= 0) (*rows)[next[group_of[i]]++] = i;
  }
  return true;
}

void add_stats(const KnnStats &group, bool first, KnnStats *sum) {
  if (first) {
    sum->device = group.device;
    sum->method = group.method;
    std::memcpy(sum->device_name, group.device_name, sizeof sum->device_name);
    std::memcpy(sum->variant, group.variant, sizeof sum->variant);
  }
  add_run_stats(group, sum);
}

}  // namespace

bool partition_groups(const KnnProblem &p, const int32_t *cancel, GroupPartition *out) {
  DenseGroups dense;
  std::vector<int64_t> target_group(static_cast<size_t>(p.n_targets));
  for (int64_t t = 0; t < p.n_targets; t++) {
    if ((t & (kSlice - 1)) == 0 && cancelled(cancel)) return false;
    target_group[t] = dense.add(p.target_groups[t]);
  }
  std::vector<int64_t> query_group(static_cast<size_t>(p.n_queries));
  for (int64_t q = 0; q < p.n_queries; q++) {
    if ((q & (kSlice - 1)) == 0 && cancelled(cancel)) return false;
    query_group[q] = dense.find(p.query_groups[q]);  // -1, no target: empty slots
  }
  const int64_t n_groups = dense.size();
  return bucket_rows(target_group, n_groups, cancel, &out->target_rows, &out->target_begin) &&
         bucket_rows(query_group, n_groups, cancel, &out->query_rows, &out->query_begin);
}

KnnStatus run_grouped(const KnnProblem &p, const GroupPartition &part, int64_t *neighbors,
                      double *distances, KnnStats *stats, const int32_t *cancel, char *message,
                      size_t message_len, const SubProblemRunner &run) {
  const Clock::time_point start = Clock::now();
  *stats = KnnStats{};
  stats->device = KNN_DEVICE_CPU;
  stats->method = p.method == KNN_METHOD_TI ? KNN_METHOD_TI : KNN_METHOD_BRUTE;
  copy_message(stats->device_name, sizeof stats->device_name, "none (no group has targets)");
  fill_padding(p.n_queries, p.k, neighbors, distances);

  GroupSubProblem group;
  std::vector<int64_t> sub_neighbors;
  std::vector<double> sub_distances;
  char notice[512] = "";
  int64_t groups_run = 0;

  for (int64_t g = 0; g < part.groups(); g++) {
    const int64_t *qrows = part.query_rows.data() + part.query_begin[g];
    const int64_t *trows = part.target_rows.data() + part.target_begin[g];
    const int64_t nq = part.query_begin[g + 1] - part.query_begin[g];
    const int64_t nt = part.target_begin[g + 1] - part.target_begin[g];
    if (nq == 0) continue;  // targets nobody asks for
    if (cancelled(cancel)) {
      copy_message(message, message_len, "cancelled");
      return KNN_CANCELLED;
    }
    if (!make_group_subproblem(p, qrows, nq, trows, nt, cancel, &group)) {
      copy_message(message, message_len, "cancelled");
      return KNN_CANCELLED;
    }
    const KnnProblem &sub = group.problem;
    sub_neighbors.resize(static_cast<size_t>(nq) * sub.k);
    sub_distances.resize(static_cast<size_t>(nq) * sub.k);
    KnnStats group_stats{};
    message[0] = '\0';
    const KnnStatus st = run(sub, sub_neighbors.data(), sub_distances.data(), &group_stats);
    if (st != KNN_OK) return st;  // message says why
    if (notice[0] == '\0') copy_message(notice, sizeof notice, message);
    add_stats(group_stats, groups_run == 0, stats);
    groups_run++;
    scatter_group_results(qrows, nq, trows, sub.k, p.k, sub_neighbors.data(), sub_distances.data(),
                          neighbors, distances);
  }
  stats->pairs = 0;
  for (int64_t g = 0; g < part.groups(); g++)
    stats->pairs += (part.query_begin[g + 1] - part.query_begin[g]) *
                    (part.target_begin[g + 1] - part.target_begin[g]);
  const size_t used = std::strlen(stats->variant);
  std::snprintf(stats->variant + used, sizeof stats->variant - used, "%sgroups: %lld",
                used > 0 ? ", " : "", static_cast<long long>(groups_run));
  stats->seconds_total = seconds_since(start);
  copy_message(message, message_len, notice);
  return KNN_OK;
}

}  // namespace knn
