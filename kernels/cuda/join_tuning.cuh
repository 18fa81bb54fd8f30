// join_tuning.cuh -- the choices a GPU join makes for itself. The product
// always runs with the defaults (knn_cuda_run); the engine tests force the
// other variants through the module's test entry (knn_cuda_testing.h) to
// prove that each of them is exact too.
#pragma once

#include <cstdint>

namespace knn {
namespace cuda {
namespace ti {

enum class FilterKind { Adaptive, Full, Partial };
enum class ListKind { Adaptive, Registers, Shared, Global };

// Knobs of the TI join. The defaults are the adaptive scheme of section
// IV-D of the Sweet KNN paper, with two constants set from measurements.
struct TiOptions {
  FilterKind filter = FilterKind::Adaptive;
  ListKind list = ListKind::Adaptive;
  int threads_per_query = 0;           // 0: adaptive (IV-D3)
  double landmark_factor = 3.0;        // clusters per set = factor * sqrt(n)
  int landmark_candidate_sets = 10;    // best spread of this many random sets
  // r of IV-D3. The paper's 0.25 leaves one thread per query on every
  // benchmark set here; r = 1 gives a few warps per query where that pays
  // and still one where it does not.
  double cache_conflict_factor = 1.0;
  // Partial filter when k / dim exceeds this (the paper: 8). The full
  // filter was faster in every case measured, so the adaptive scheme never
  // picks the partial one; FilterKind::Partial still can.
  double partial_filter_ratio = __builtin_huge_val();
  bool dedup = true;                   // merge bitwise-identical rows
  int gemm_assign_min_stride = 48;     // cuBLAS assignment from this stride (L2)
  // Under AUTO (ti_join.cu sets it): hand the join to brute force when the
  // level-1 filter keeps more than this share of the (query cluster, target
  // cluster) pairs; 0: never.
  double level1_give_up = 0;
  // The out-of-core join's test hooks (knn_cuda_testing.h: ti_order_probe,
  // ti_pinning_hook); null in the product.
  int32_t *order_probe = nullptr;
  int32_t *pinning_hook = nullptr;
  // A split self-join's test probe and hook (knn_cuda_testing.h:
  // ti_shared_probe, ti_upload_slice_fail).
  int32_t *shared_probe = nullptr;
  int upload_slice_fail = 0;
  // Query clusters level 1 ran over, added up (ti_level1_probe).
  int32_t *level1_probe = nullptr;
  // Split self-join hooks (ti_level1_fail, ti_shared_pool_late).
  int level1_fail = 0;
  int shared_pool_late = 0;
};

}  // namespace ti

// Brute force: the GEMM filter to use where one is used (brute_plan.cu).
enum class BruteFilter { kAuto, kSgemm, kDgemm, kHalf };

struct JoinTuning {
  // Brute force: filter L2 with the SGEMM bound even on GPUs where the
  // DGEMM one is used (brute_plan.cu, fast_fp64).
  bool sgemm_filter = false;
  // Brute force: force a GEMM filter (kDgemm: L2 only; kHalf: any metric
  // but L1, any dimension above 0, even where auto would not pick it).
  BruteFilter brute_filter = BruteFilter::kAuto;
  // Brute force, fp16 filter: run the next tile's GEMM on a second stream
  // while the current tile is selected (two tiles). Off by default until
  // measured on the device.
  bool pipeline_tiles = false;
  // Brute force, fp16 filter: the GEMM writes fp16 tiles (half the memory
  // traffic of fp32 ones, a slightly wider bound: half_bound.cuh) where the
  // GEMM is short enough for them; false: fp32 tiles.
  bool half_tiles = true;
  // Brute force: k beyond the lists (up to kLargeKMax) on the fp16 filter
  // (large_k_select.cu) where it is picked; false: the full sort, as before.
  bool large_k = true;
  // Brute force: tiny joins take small_join.cu's one-round-trip path where
  // it applies; false: always the general path (brute_force.cu).
  bool small_join = true;
  ti::TiOptions ti;
};

}  // namespace cuda
}  // namespace knn
