// ti_gathered_targets.cuh -- the out-of-core TI join's gathered target
// parts (GatheredTargets, ti_gathered_targets.cu).
#pragma once

#include <cstdint>
#include <vector>

#include "ti_common.cuh"
#include "ti_parts.cuh"

namespace knn {
namespace cuda {
namespace ti {

// Every cluster of the cached target parts, numbered across parts (global
// cluster g is cluster g - first_cluster(p) of part p). Once a query part
// has met its nearest target part, the clusters it still needs in the
// other parts are spread over many of them, the far ones holding few:
// select() finds them with level 1's group test, and gather() copies them,
// wherever they lie, into one target part on the device (the device reads
// the parts' mapped pinned blocks), which level 1 and level 2 then filter
// as any part. A far part no longer costs a pair of its own: its copy,
// launches and a read-back.
class GatheredTargets {
 public:
  // The clusters' centres, radii and sizes on the device (mem: the join's
  // own memory), where every part is cached in a mapped block and they
  // take no more than `room` bytes; *usable says whether they were. The
  // parts' copies into their blocks are waited for first.
  KnnStatus build(const TargetParts &parts, int n_parts, int stride, size_t room,
                  MemoryBudget &mem, DeviceContext &ctx, bool *usable);

  int32_t clusters() const { return first_.empty() ? 0 : first_.back(); }
  int32_t first_cluster(int part) const { return first_[part]; }
  int32_t end_cluster(int part) const { return first_[part + 1]; }
  float max_abs(int part) const { return parts_[part].max_abs; }
  // A gathered part holds no more clusters than the part with the most
  // (level 1's pair matrix), and takes no more device memory than the
  // largest part (bytes(): its arrays, as gather() allocates them): it fits
  // where any part fits.
  int32_t max_clusters() const { return max_clusters_; }
  size_t max_bytes() const { return max_bytes_; }
  size_t bytes(int32_t g) const;  // what cluster g adds to a part
  // Rows gathered so far by copies of their own and by the block (trace).
  int64_t rows_copied() const { return rows_copied_; }
  int64_t rows_by_block() const { return rows_by_block_; }

  // (*needed)[g]: 1 where some query cluster's group test (level 1's, with
  // the query cluster's carried bound as its upper bound) keeps cluster g.
  // Read back to the host (the stream is waited for). Exact: a cluster it
  // drops has no member within any query's carried k'-th entry
  // (ti_filter_level1.cu).
  KnnStatus select(const ClusterSet &queries, const float *carried, KnnMetric metric,
                   Margin margin, std::vector<uint8_t> *needed, DeviceContext &ctx);

  // The clusters `chosen` (global numbers; at least one, at most
  // max_clusters(), with at most max_bytes() together) as one target part
  // in `out`, from mem: same arrays as a part's, original rows.
  KnnStatus gather(const std::vector<int32_t> &chosen, TargetPart &out, MemoryBudget &mem,
                   DeviceContext &ctx);

 private:
  int stride_ = 0;
  std::vector<TargetParts::CachedArrays> parts_;
  std::vector<int32_t> first_;   // parts + 1
  std::vector<int32_t> part_of_; // by cluster
  std::vector<int32_t> size_;    // by cluster
  std::vector<int64_t> rows_;    // by cluster
  int32_t max_clusters_ = 0;
  size_t max_bytes_ = 0;
  int64_t rows_copied_ = 0, rows_by_block_ = 0;
  DeviceBuffer<float> centers_, radius_;
  DeviceBuffer<int32_t> device_size_;
  DeviceBuffer<uint8_t> needed_;
  DeviceBuffer<TargetParts::CachedArrays> table_;
};

}  // namespace ti
}  // namespace cuda
}  // namespace knn
