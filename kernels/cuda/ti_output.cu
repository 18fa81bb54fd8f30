// ti_output.cu -- from the k' nearest (value, row) of each distinct query to
// the k results of each query row.
//
// Every row of a duplicate group shares its group's list. With self-match
// exclusion a row drops the entries whose target key equals its own key;
// the list has k' = k + (largest number of targets sharing one key)
// entries, so at least k remain whenever k targets are eligible. Slots past
// the eligible count get row -1 and distance NaN, as knn_engine.h says.
#include <cmath>

#include "ti_common.cuh"
#include "ti_distance.cuh"
#include "ti_expand.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

// Query rows first .. first + count - 1, or listed[0 .. count - 1] where a
// list is given; output row c for the c-th of them.
template <int METRIC>
__global__ void expand_kernel(int64_t first, const int32_t *listed, int64_t count,
                              const int32_t *group_of_row, int k, int kprime,
                              const float *result_value, const int32_t *result_row,
                              const int64_t *query_keys, const int64_t *target_keys,
                              int64_t *out_rows, double *out_distances) {
  int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= count) return;
  const int64_t i = listed != nullptr ? (int64_t)listed[c] : first + c;
  const int64_t g = group_of_row[i];
  const float *v = result_value + g * kprime;
  const int32_t *r = result_row + g * kprime;
  const bool exclude = query_keys != nullptr && target_keys != nullptr;
  expand_list<METRIC>(v, r, k, kprime, exclude ? target_keys : nullptr,
                      exclude ? query_keys[i] : 0, out_rows + c * k, out_distances + c * k);
}

}  // namespace

namespace {

KnnStatus launch_expand(const DistinctSet &queries, KnnMetric metric, int64_t first,
                        const int32_t *listed, int64_t count, int k, int kprime,
                        const float *result_value, const int32_t *result_row,
                        const int64_t *query_keys, const int64_t *target_keys,
                        int64_t *out_rows, double *out_distances, DeviceContext &ctx) {
  const unsigned grid = grid_for(count, 128);
  if (metric == KNN_METRIC_L1)
    expand_kernel<KNN_METRIC_L1><<<grid, 128, 0, ctx.stream>>>(
        first, listed, count, queries.group_of_row.get(), k, kprime, result_value, result_row,
        query_keys, target_keys, out_rows, out_distances);
  else
    expand_kernel<KNN_METRIC_L2><<<grid, 128, 0, ctx.stream>>>(
        first, listed, count, queries.group_of_row.get(), k, kprime, result_value, result_row,
        query_keys, target_keys, out_rows, out_distances);
  CUDA_CHECK_LAUNCH(ctx, "expand_kernel");
  return KNN_OK;
}

}  // namespace

KnnStatus expand_results(const DistinctSet &queries, KnnMetric metric, int64_t first,
                         int64_t count, int k, int kprime, const float *result_value,
                         const int32_t *result_row, const int64_t *query_keys,
                         const int64_t *target_keys, int64_t *out_rows, double *out_distances,
                         DeviceContext &ctx) {
  return launch_expand(queries, metric, first, nullptr, count, k, kprime, result_value,
                       result_row, query_keys, target_keys, out_rows, out_distances, ctx);
}

KnnStatus expand_listed_results(const DistinctSet &queries, KnnMetric metric,
                                const int32_t *listed, int64_t count, int k, int kprime,
                                const float *result_value, const int32_t *result_row,
                                const int64_t *query_keys, const int64_t *target_keys,
                                int64_t *out_rows, double *out_distances, DeviceContext &ctx) {
  return launch_expand(queries, metric, 0, listed, count, k, kprime, result_value, result_row,
                       query_keys, target_keys, out_rows, out_distances, ctx);
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
