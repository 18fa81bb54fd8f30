// ti_filter_level2.cu -- step 3 of the TI join (sections III-C and IV):
// the point filter that finds the k' nearest (value, row) of every distinct
// query.
//
// Work layout (thread-data remapping, IV-C1): the queries of a query
// cluster are cut into warp groups of at most 32, so the 32 lanes of a warp
// always serve queries of one cluster and walk the same candidate clusters
// in the same order. Lane i of the warp owns query i of its group.
//
// Walk of one candidate target cluster ct (one warp, all lanes in step):
//  * 2-landmark test, no distance needed: D(cq, ct) - D(q, cq) - R_t beyond
//    theta means no member of ct can be near q;
//  * x = D(q, ct) exactly, then the cluster-level 1-landmark tests
//    (x - R_t and nearest(ct) - x beyond theta);
//  * the warp jumps to the first member whose distance to the centre is at
//    most max over lanes of (x + theta + margin) (members are sorted by
//    descending distance, figure 4), then visits members one by one. Each
//    lane tests |x - D(t, ct)| against its theta; members all lanes pass
//    over are skipped, and the walk ends when every lane has reached a
//    member closer to the centre than x - theta - margin (the paper's break).
//    Rows of up to 8 floats come a chunk of 32 members at a time, lane j
//    loading member j's row (TargetChunk), and go to the lanes by shuffle:
//    the walk is a chain of dependent steps, and a load per member made
//    each step wait for memory.
//  * a lane that passes computes D(q, t) exactly and offers (value, row) to
//    its list; a better list tightens theta (full filter, Algorithm 2).
// Every prune compares a bound with theta + margin strictly (rounding
// margin of ../rounding_margin.h, evaluated with the current theta and
// the largest member distance R_t, which only widens it), so a target whose
// computed distance equals the k'-th is always computed: ties by row are
// decided by entry_before, never by a bound.
//
// Variants (IV-B, IV-D):
//  * full filter with the list in registers, shared or global memory;
//  * inside-query parallelism: P warps share a warp group, warp s walks
//    candidates s, s+P, ...; each lane keeps its own list, the lanes of one
//    query share theta through atomicMin on its float bits in shared memory
//    (non-negative floats order like their bits), and warp 0 merges the P
//    sorted lists at the end (stored to a global array, or, with
//    Level2Config::shared_merge, read from the block's shared memory);
//  * partial filter: theta stays the level-1 bound; pass 1 counts the
//    passing members, pass 2 computes and stores their values, a selection
//    kernel keeps the k' smallest.
#include <cub/cub.cuh>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ti_common.cuh"
#include "ti_distance.cuh"
#include "ti_topk.cuh"

namespace knn {
namespace cuda {
namespace ti {
namespace {

enum Mode { kFull = 0, kPartial = 1 };
constexpr int kMaxParts = 8;
constexpr int kMaxBlock = 256;

struct Level2Args {
  ClusterView q;          // queries, in position order
  const int4 *groups;     // (query cluster, first position, count, 0)
  const int32_t *n_groups;
  const float *upper_bound;
  const uint64_t *cand;
  const int32_t *cand_count;
  int64_t cand_stride;
  int32_t cand_first;     // the query cluster of cand's row 0
  ClusterView t;          // targets, in position order
  const int32_t *trows;   // the target set's rows of each duplicate group
  int stride;
  int kprime;
  int parts;
  int groups_per_block;
  int list_in_shared;
  int resume;             // seed the lists from result_value/result_row
  int lazy;               // ... only where an entry beats the k'-th (Level2Config::lazy_lists)
  int shared_merge;       // P > 1: the P lists merged from shared memory
  Margin margin;
  // results by distinct query
  float *result_value;
  int32_t *result_row;
  // where set, each stored list's k'-th entry too (Level2Config::last_value)
  float *last_value;
  int32_t *last_row;
  int tiled;              // lists by position in tiles (Level2Config::tiled_lists)
  // inside-query parallelism: one list per (query slot, part)
  float *part_value;
  int32_t *part_row;
  // global-memory lists, one per thread of the grid
  float *global_value;
  int32_t *global_row;
  int64_t global_stride;
  // partial filter
  int write;              // 0: count pass, 1: write pass
  int32_t *cand_total;    // per query position
  const int64_t *cand_offset;
  float *cand_value;
  int32_t *cand_pos;
  unsigned long long *counter;
  const int32_t *stop;    // Level2Config::stop
};

// Where query `d` at position `qpos` keeps entry 0 of its list, and the
// step between its entries.
__device__ __forceinline__ int64_t list_at(const Level2Args &a, int64_t d, int64_t qpos) {
  return a.tiled ? (qpos / kWarp) * kWarp * a.kprime + qpos % kWarp : d * a.kprime;
}
__device__ __forceinline__ int64_t list_step(const Level2Args &a) { return a.tiled ? kWarp : 1; }

__device__ __forceinline__ float widen(Margin m, float magnitude) {
  return m.rel * magnitude + m.abs;
}

// First index i in [lo, hi) with d[i] <= thr for d non-increasing, else hi.
// Warp-uniform arguments; each round samples 32 points and shrinks the
// range 32 times.
__device__ __forceinline__ int warp_first_leq(const float *d, int lo, int hi, float thr) {
  const int lane = threadIdx.x % kWarp;
  while (hi - lo > kWarp) {
    int step = (hi - lo + kWarp - 1) / kWarp;
    int idx = lo + lane * step;
    bool ok = idx < hi && d[idx] <= thr;
    unsigned mask = __ballot_sync(kFullMask, ok);
    if (mask == 0) {
      lo = lo + ((hi - 1 - lo) / step) * step + 1;  // past the last sample
    } else {
      int f = __ffs(mask) - 1;
      int fidx = lo + f * step;
      lo = f == 0 ? lo : lo + (f - 1) * step + 1;
      hi = fidx;  // fidx satisfies the predicate: the answer is <= fidx
      if (lo >= hi) return hi;
    }
  }
  int idx = lo + lane;
  bool ok = idx < hi && d[idx] <= thr;
  unsigned mask = __ballot_sync(kFullMask, ok);
  return mask ? lo + __ffs(mask) - 1 : hi;
}

constexpr float kInf = __builtin_huge_valf();

// The widest padded stride whose target rows the full filter fetches a
// chunk at a time (TargetChunk): twice DPAD registers more per thread.
constexpr int kRowsAheadMaxStride = 8;

// One member of a target chunk, as taken by every lane of the warp.
template <int DPAD>
struct TargetMember {
  float x[DPAD];
  int32_t mult = 0, first_row = 0;
};
template <>
struct TargetMember<0> {};

// A chunk of 32 consecutive target members, lane j holding member p + j:
// its row, multiplicity and first original row, loaded together
// (coalesced) when the walk enters the chunk.
template <int DPAD>
struct TargetChunk {
  float x[DPAD];
  int32_t mult = 0, first_row = 0;

  __device__ __forceinline__ void load(const ClusterView &t, int p, bool in, int stride) {
    const int lane = threadIdx.x % kWarp;
    if (in) {
      const float4 *row = reinterpret_cast<const float4 *>(t.x + (int64_t)(p + lane) * stride);
#pragma unroll
      for (int i = 0; i < DPAD / 4; i++) {
        const float4 f = row[i];
        x[4 * i] = f.x;
        x[4 * i + 1] = f.y;
        x[4 * i + 2] = f.z;
        x[4 * i + 3] = f.w;
      }
      mult = t.mult[p + lane];
      first_row = t.first_row[p + lane];
    } else {
#pragma unroll
      for (int i = 0; i < DPAD; i++) x[i] = 0.0f;
    }
  }

  // Member p + j into `m`, on every lane (the whole warp calls it).
  __device__ __forceinline__ void take(int j, TargetMember<DPAD> &m) const {
#pragma unroll
    for (int i = 0; i < DPAD; i++) m.x[i] = __shfl_sync(kFullMask, x[i], j);
    m.mult = __shfl_sync(kFullMask, mult, j);
    m.first_row = __shfl_sync(kFullMask, first_row, j);
  }
};
template <>
struct TargetChunk<0> {};

// LAZY (out-of-core carried lists, Level2Config::lazy_lists) is a template
// parameter so that the other kernels keep their registers.
template <int METRIC, int DPAD, class List, int MODE, bool LAZY>
__global__ void __launch_bounds__(kMaxBlock) level2_kernel(Level2Args a) {
  extern __shared__ __align__(16) unsigned char smem[];
  // A cancelled join's blocks end before they begin: one read of the word
  // per block, and the whole block ends, so that its barriers stay matched.
  if (a.stop != nullptr &&
      __syncthreads_or(threadIdx.x == 0 &&
                       *reinterpret_cast<const volatile int32_t *>(a.stop) != 0))
    return;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int P = a.parts;
  const int gi = warp / P;
  const int part = warp % P;
  const int64_t g = (int64_t)blockIdx.x * a.groups_per_block + gi;
  const bool has_group = g < *a.n_groups;
  int4 grp = make_int4(0, 0, 0, 0);
  if (has_group) grp = a.groups[g];
  const int cq = grp.x;
  const bool active = has_group && lane < grp.z;
  const int qpos = grp.y + lane;

  QueryRow<DPAD> q;
  if (active)
    q.load(a.q.x + (int64_t)qpos * a.stride, a.stride);
  else
    q.clear();
  const float dqc = active ? a.q.dist[qpos] : 0.0f;
  const float ub = has_group ? a.upper_bound[cq] : 0.0f;

  // Shared theta of the P lanes that serve one query.
  int *theta_shared = reinterpret_cast<int *>(smem) + gi * kWarp + lane;
  float theta_own = ub;

  List list;
  // Out-of-core join with each list's k'-th entry on the device (lazy): the
  // carried list, possibly in mapped host memory, is read only when this
  // visit offers an entry before that k'-th entry, and written back only
  // then. Until it is read, entries are taken only before it (seed_last),
  // so the lists of all parts hold only entries that beat the carried ones.
  constexpr bool lazy = MODE == kFull && LAZY;
  constexpr bool kRowsAhead = MODE == kFull && DPAD > 0 && DPAD <= kRowsAheadMaxStride;
  float seed_last_v = kInf;
  int32_t seed_last_r = kNoRow;
  bool seeds_pending = false;  // part 0 of a lazy list: carried entries not read yet
  auto load_seeds = [&]() {
    const int64_t d = a.q.member[qpos];
    const float *seed_v = a.result_value + list_at(a, d, qpos);
    const int32_t *seed_r = a.result_row + list_at(a, d, qpos);
    const int64_t step = list_step(a);
    // Read kSeedBatch entries ahead of using them: the lists may be in
    // mapped host memory, where each load waits for the bus.
    constexpr int kSeedBatch = 8;
    bool more = true;
    for (int i0 = 0; i0 < a.kprime && more; i0 += kSeedBatch) {
      float sv[kSeedBatch];
      int32_t sr[kSeedBatch];
#pragma unroll
      for (int j = 0; j < kSeedBatch; j++) {
        const bool in = i0 + j < a.kprime;
        sv[j] = in ? seed_v[(i0 + j) * step] : kInf;
        sr[j] = in ? seed_r[(i0 + j) * step] : kNoRow;
      }
#pragma unroll
      for (int j = 0; j < kSeedBatch; j++) {
        more = more && sr[j] != kNoRow;
        if (more && entry_before(sv[j], sr[j], list.last_value(), list.last_row()))
          list.insert(sv[j], sr[j]);
      }
    }
  };
  if constexpr (MODE == kFull) {
    float *lv = nullptr;
    int32_t *lr = nullptr;
    int64_t ls = 0;
    if (a.list_in_shared) {
      // after the theta words: values then rows, [slot][thread]
      float *base = reinterpret_cast<float *>(smem) + a.groups_per_block * kWarp;
      lv = base + threadIdx.x;
      lr = reinterpret_cast<int32_t *>(base + (int64_t)blockDim.x * a.kprime) + threadIdx.x;
      ls = blockDim.x;
    } else if (a.global_value != nullptr) {
      int64_t slot = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
      lv = a.global_value + slot;
      lr = a.global_row + slot;
      ls = a.global_stride;
    }
    list.init(a.kprime, lv, lr, ls);
    // Out-of-core join: the list goes on from the target parts done so far,
    // and its k'-th entry bounds theta from the start. Part 0 alone takes
    // the seeds, so the merge of the P lists below sees each entry once.
    if (lazy && active) {
      const int64_t d = a.q.member[qpos];
      seed_last_v = a.last_value[d];
      seed_last_r = a.last_row[d];
      if (seed_last_v != kInf) theta_own = fminf(theta_own, MetricOps<METRIC>::ti(seed_last_v));
      seeds_pending = part == 0;
    } else if (a.resume && active && part == 0) {
      load_seeds();
      const float last = list.last_value();
      if (last != kInf) theta_own = fminf(theta_own, MetricOps<METRIC>::ti(last));
    }
  }
  if (MODE == kFull && P > 1) {
    if (part == 0) *theta_shared = __float_as_int(theta_own);
    __syncthreads();
  }
  unsigned long long distances = 0;
  int32_t found = 0;
  int64_t out_base = 0;
  if (MODE == kPartial && a.write && active) out_base = a.cand_offset[qpos];

  auto current_theta = [&]() -> float {
    if (MODE == kFull && P > 1)
      return fminf(theta_own, __int_as_float(*(volatile int *)theta_shared));
    return theta_own;
  };

  if (has_group) {
    const int ncand = a.cand_count[cq];
    const uint64_t *cand = a.cand + (int64_t)(cq - a.cand_first) * a.cand_stride;
    for (int i = part; i < ncand; i += P) {
      const uint64_t key = cand[i];
      const int ct = (int)(uint32_t)key;
      const float dcc = __uint_as_float((uint32_t)(key >> 32));
      const float rt = a.t.radius[ct];
      float theta = current_theta();
      bool need = active && !(dcc - dqc - rt > theta + widen(a.margin, dcc + dqc + rt + theta));
      if (!__any_sync(kFullMask, need)) continue;
      float x = 0.0f, sigma = 0.0f;
      if (need) {
        x = MetricOps<METRIC>::ti(
            q.template value_to<METRIC>(a.t.centers + (int64_t)ct * a.stride));
        distances++;
        sigma = widen(a.margin, x + rt + theta);
        need = !(x - rt > theta + sigma) && !(a.t.nearest[ct] - x > theta + sigma);
      }
      if (!__any_sync(kFullMask, need)) continue;
      float thr = need ? x + theta + sigma : 0.0f;
      thr = __uint_as_float(__reduce_max_sync(kFullMask, __float_as_uint(thr)));
      const int hi = a.t.begin[ct + 1];
      int p = warp_first_leq(a.t.dist, a.t.begin[ct], hi, thr);
      bool stop = false;
      for (; p < hi && !stop; p += kWarp) {
        const int np = min(kWarp, hi - p);
        const float e_lane = lane < np ? a.t.dist[p + lane] : 0.0f;
        // Narrow rows: lane j fetches member p + j's row, multiplicity and
        // first row with the chunk, so that the walk below takes them by
        // shuffle instead of waiting for a load at each member.
        TargetChunk<kRowsAhead ? DPAD : 0> chunk;
        if constexpr (kRowsAhead) chunk.load(a.t, p, lane < np, a.stride);
        theta = current_theta();
        for (int j = 0; j < np; j++) {
          const float e = __shfl_sync(kFullMask, e_lane, j);
          const bool done = !need || (x - e > theta + sigma);
          if (__all_sync(kFullMask, done)) {
            stop = true;
            break;
          }
          const bool cand = !(done || e - x > theta + sigma);
          const int pos = p + j;
          float v = kInf;
          TargetMember<kRowsAhead ? DPAD : 0> member;
          if constexpr (kRowsAhead) {
            if (__any_sync(kFullMask, cand)) chunk.take(j, member);
          }
          auto target_value = [&]() {
            if constexpr (kRowsAhead)
              return MetricOps<METRIC>::value(q.v, member.x, DPAD);
            else
              return q.template value_to<METRIC>(a.t.x + (int64_t)pos * a.stride);
          };
          if constexpr (lazy) {
            if (cand) {
              v = target_value();
              distances++;
            }
            // The warp reads its carried lists together (coalesced over the
            // bus) once an entry could go before one of their k'-th.
            if (__any_sync(kFullMask, seeds_pending && cand && v <= seed_last_v) &&
                seeds_pending) {
              load_seeds();
              seeds_pending = false;
            }
          }
          if (!cand) continue;
          if constexpr (MODE == kFull) {
            if (!lazy) {
              v = target_value();
              distances++;
            }
            if (v <= list.last_value() && (!lazy || v <= seed_last_v)) {
              int mult, row;
              if constexpr (kRowsAhead) {
                mult = member.mult;
                row = member.first_row;
              } else {
                mult = a.t.mult[pos];
                row = a.t.first_row[pos];
              }
              for (int r = 0;;) {
                if (!entry_before(v, row, list.last_value(), list.last_row())) break;
                if (lazy && !entry_before(v, row, seed_last_v, seed_last_r)) break;
                list.insert(v, row);
                if (++r >= mult) break;
                row = a.trows[a.t.rows_begin[pos] + r];
              }
              const float last = list.last_value();
              if (last != kInf) {
                const float t = MetricOps<METRIC>::ti(last);
                if (t < theta_own) {
                  theta_own = t;
                  if (P > 1) atomicMin(theta_shared, __float_as_int(t));
                }
              }
              theta = current_theta();
            }
          } else {
            if (a.write) {
              const float v = q.template value_to<METRIC>(a.t.x + (int64_t)pos * a.stride);
              distances++;
              a.cand_value[out_base + found] = v;
              a.cand_pos[out_base + found] = pos;
            }
            found++;
          }
        }
      }
    }
  }

  // distance counter: one atomic per warp
  for (int off = kWarp / 2; off > 0; off /= 2)
    distances += __shfl_down_sync(kFullMask, distances, off);
  if (lane == 0 && distances != 0) atomicAdd(a.counter, distances);

  if constexpr (MODE == kPartial) {
    if (!a.write && active) a.cand_total[qpos] = found;
  } else {
    if (P == 1) {
      // A lazy list is written back where its warp read it.
      if (active && !(lazy && seeds_pending)) {
        const int64_t d = a.q.member[qpos];
        const int64_t at = list_at(a, d, qpos);
        list.store(a.kprime, a.result_value + at, a.result_row + at, list_step(a));
        if (a.last_value != nullptr) {
          a.last_value[d] = list.last_value();
          a.last_row[d] = list.last_row();
        }
      }
    } else {
      // Entry i of the list of part s: pv[s * part_step + i * entry_step].
      float *pv;
      int32_t *pr;
      int64_t part_step, entry_step;
      if (a.shared_merge) {
        // [entry][thread] in shared memory: the lists themselves where they
        // live there, else a region after the theta words they are stored
        // to. The P warps of warp group gi are warps gi * P .. gi * P + P - 1.
        float *mv = reinterpret_cast<float *>(smem) + a.groups_per_block * kWarp;
        int32_t *mr = reinterpret_cast<int32_t *>(mv + (int64_t)blockDim.x * a.kprime);
        if (!a.list_in_shared && active)
          list.store(a.kprime, mv + threadIdx.x, mr + threadIdx.x, blockDim.x);
        const int first = gi * P * kWarp + lane;
        pv = mv + first;
        pr = mr + first;
        part_step = kWarp;
        entry_step = blockDim.x;
      } else {
        const int64_t slot = g * kWarp + lane;
        if (active)
          list.store(a.kprime, a.part_value + (slot * P + part) * a.kprime,
                     a.part_row + (slot * P + part) * a.kprime, 1);
        pv = a.part_value + slot * P * a.kprime;
        pr = a.part_row + slot * P * a.kprime;
        part_step = a.kprime;
        entry_step = 1;
      }
      __syncthreads();
      // Lazy lists: where no part of the warp's queries added an entry,
      // they stay as they are, unread. Where part 0 did not read its
      // carried list, its (empty) list is replaced by the carried one
      // before the merge.
      bool merge = part == 0 && active;
      if (lazy && part == 0) {  // warp-uniform: the warp merges together, coalesced
        bool added = false;
        for (int s = 0; s < P && active && !added; s++) added = pr[s * part_step] != kNoRow;
        merge = active && __any_sync(kFullMask, added);
        if (merge && seeds_pending) {
          const int64_t d = a.q.member[qpos];
          const float *seed_v = a.result_value + list_at(a, d, qpos);
          const int32_t *seed_r = a.result_row + list_at(a, d, qpos);
          const int64_t step = list_step(a);
          constexpr int kSeedBatch = 8;
          for (int i0 = 0; i0 < a.kprime; i0 += kSeedBatch) {
            float sv[kSeedBatch];
            int32_t sr[kSeedBatch];
#pragma unroll
            for (int j = 0; j < kSeedBatch; j++) {
              const bool in = i0 + j < a.kprime;
              sv[j] = in ? seed_v[(i0 + j) * step] : kInf;
              sr[j] = in ? seed_r[(i0 + j) * step] : kNoRow;
            }
#pragma unroll
            for (int j = 0; j < kSeedBatch; j++)
              if (i0 + j < a.kprime) {
                pv[(i0 + j) * entry_step] = sv[j];
                pr[(i0 + j) * entry_step] = sr[j];
              }
          }
        }
      }
      if (merge) {
        const int64_t d = a.q.member[qpos];
        float *out_v = a.result_value + list_at(a, d, qpos);
        int32_t *out_r = a.result_row + list_at(a, d, qpos);
        const int64_t step = list_step(a);
        int cursor[kMaxParts];
        for (int s = 0; s < P; s++) cursor[s] = 0;
        for (int i = 0; i < a.kprime; i++) {
          int best = -1;
          float bv = kInf;
          int32_t br = kNoRow;
          for (int s = 0; s < P; s++) {
            if (cursor[s] >= a.kprime) continue;
            float v = pv[s * part_step + cursor[s] * entry_step];
            int32_t r = pr[s * part_step + cursor[s] * entry_step];
            if (best < 0 || entry_before(v, r, bv, br)) {
              best = s;
              bv = v;
              br = r;
            }
          }
          out_v[i * step] = bv;
          out_r[i * step] = br;
          cursor[best]++;
          if (i == a.kprime - 1 && a.last_value != nullptr) {
            a.last_value[d] = bv;
            a.last_row[d] = br;
          }
        }
      }
    }
  }
}

// Partial filter, last step: the k' smallest (value, row) of each query's
// stored candidates (one thread per query position, list in global memory).
__global__ void partial_select_kernel(int64_t nq, const int32_t *qmember, const int32_t *total,
                                      const int64_t *offset, const float *cand_value,
                                      const int32_t *cand_pos, const int32_t *tfirst_row,
                                      const int32_t *tmult, const int32_t *trows_begin,
                                      const int32_t *trows, int kprime, float *list_value,
                                      int32_t *list_row, float *result_value,
                                      int32_t *result_row) {
  int64_t qpos = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (qpos >= nq) return;
  StridedList list;
  list.init(kprime, list_value + qpos, list_row + qpos, nq);
  const int64_t begin = offset[qpos], end = begin + total[qpos];
  for (int64_t c = begin; c < end; c++) {
    const float v = cand_value[c];
    if (!(v <= list.last_value())) continue;
    const int pos = cand_pos[c];
    const int mult = tmult[pos];
    int32_t row = tfirst_row[pos];
    for (int r = 0;;) {
      if (!entry_before(v, row, list.last_value(), list.last_row())) break;
      list.insert(v, row);
      if (++r >= mult) break;
      row = trows[trows_begin[pos] + r];
    }
  }
  const int64_t d = qmember[qpos];
  list.store(kprime, result_value + d * kprime, result_row + d * kprime, 1);
}

// Warp groups: ceil(size / 32) per query cluster; none for a cluster
// without candidates where `cand_count` is given (resumed lists: its
// queries' lists stay as they are).
__device__ __forceinline__ int cluster_groups(int c, const int32_t *begin,
                                              const int32_t *cand_count) {
  if (cand_count != nullptr && cand_count[c] == 0) return 0;
  return (begin[c + 1] - begin[c] + kWarp - 1) / kWarp;
}

// Entry i of the warp-group table is query cluster order[i] (order null:
// cluster i).
__global__ void group_counts_kernel(int m, const int32_t *begin, const int32_t *cand_count,
                                    const int32_t *order, int32_t *count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i > m) return;
  count[i] = i < m ? cluster_groups(order != nullptr ? order[i] : i, begin, cand_count) : 0;
}

__global__ void group_table_kernel(int m, const int32_t *begin, const int32_t *cand_count,
                                   const int32_t *order, const int32_t *first_group,
                                   int4 *groups, int32_t *n_groups) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  const int c = order != nullptr ? order[i] : i;
  int b = begin[c], size = begin[c + 1] - b;
  int g0 = first_group[i];
  const int n = cluster_groups(c, begin, cand_count);
  for (int w = 0; w < n; w++)
    groups[g0 + w] = make_int4(c, b + w * kWarp, min(kWarp, size - w * kWarp), 0);
  if (i == m - 1) *n_groups = g0 + n;
}

__global__ void iota_kernel(int m, int32_t *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < m) out[i] = i;
}

// ---- kernel selection ----

typedef void (*Level2Kernel)(Level2Args);

template <int METRIC, int DPAD, int MODE, bool LAZY>
Level2Kernel pick_list(ListPlace place) {
  if constexpr (MODE == kFull) {
    switch (place) {
      case ListPlace::Registers16: return level2_kernel<METRIC, DPAD, RegisterList<16>, MODE, LAZY>;
      case ListPlace::Registers32: return level2_kernel<METRIC, DPAD, RegisterList<32>, MODE, LAZY>;
      default: return level2_kernel<METRIC, DPAD, StridedList, MODE, LAZY>;
    }
  } else {
    return level2_kernel<METRIC, DPAD, StridedList, MODE, false>;
  }
}

template <int METRIC, int MODE, bool LAZY>
Level2Kernel pick_stride(int stride, ListPlace place) {
  return with_register_stride(
      stride, [&](auto d) { return pick_list<METRIC, decltype(d)::value, MODE, LAZY>(place); });
}

template <int METRIC>
Level2Kernel pick_metric(int stride, ListPlace place, int mode, bool lazy) {
  if (mode != kFull) return pick_stride<METRIC, kPartial, false>(stride, place);
  return lazy ? pick_stride<METRIC, kFull, true>(stride, place)
              : pick_stride<METRIC, kFull, false>(stride, place);
}

// lazy: the kernel of Level2Config::lazy_lists (full filter only).
Level2Kernel pick_kernel(KnnMetric metric, int stride, ListPlace place, int mode,
                         bool lazy = false) {
  if (metric == KNN_METRIC_L1) return pick_metric<KNN_METRIC_L1>(stride, place, mode, lazy);
  return pick_metric<KNN_METRIC_L2>(stride, place, mode, lazy);
}

struct LaunchShape {
  int parts;
  int groups_per_block;
  int threads;
  size_t smem;
};

LaunchShape launch_shape(int parts, bool list_in_shared, int kprime, bool shared_merge = false) {
  LaunchShape s;
  s.parts = parts;
  s.groups_per_block = std::max(1, 4 / parts);
  s.threads = kWarp * parts * s.groups_per_block;
  s.smem = (size_t)s.groups_per_block * kWarp * sizeof(int);
  // Lists in shared memory, or (shared merge) a region to merge them in.
  if (list_in_shared || (shared_merge && parts > 1))
    s.smem += (size_t)s.threads * kprime * (sizeof(float) + sizeof(int32_t));
  return s;
}

KnnStatus launch(DeviceContext &ctx, Level2Kernel kernel, unsigned grid, const LaunchShape &shape,
                 Level2Args &args) {
  if (shape.smem > 48 * 1024)
    CUDA_CHECK(ctx, cudaFuncSetAttribute((const void *)kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)shape.smem));
  void *params[] = {&args};
  CUDA_CHECK(ctx, cudaLaunchKernel((const void *)kernel, dim3(grid), dim3(shape.threads), params,
                                   shape.smem, ctx.stream));
  return KNN_OK;
}

// The warp groups of the query clusters (thread-data remapping): ceil(size
// / 32) per cluster, each (cluster, first position, count, 0).
// Freed (stream-ordered, after the launches that read them) and given back
// to the budget when level 2 returns.
struct WarpGroups {
  DeviceBuffer<int32_t> count, first, n_groups, order;
  DeviceBuffer<int4> groups;
  DeviceBuffer<unsigned char> scan_temp, sort_temp;
  int64_t max_groups = 0;
  MemoryBudget *mem = nullptr;

  WarpGroups() = default;
  WarpGroups(const WarpGroups &) = delete;
  WarpGroups &operator=(const WarpGroups &) = delete;
  ~WarpGroups() {
    if (mem == nullptr) return;
    mem->release(count);
    mem->release(first);
    mem->release(n_groups);
    mem->release(order);
    mem->release(groups);
    mem->release(scan_temp);
    mem->release(sort_temp);
  }
};

// Warp groups of the query clusters with most candidate clusters first
// (KNN_TI_GROUP_ORDER=cluster: in cluster order, for A/B benchmarks). A
// warp's work grows with its cluster's candidates, and blocks start
// roughly in table order: the longest first leave the shortest for the
// end of the launch, where fewer warps are left to fill the GPU.
bool groups_by_work() {
  const char *forced = std::getenv("KNN_TI_GROUP_ORDER");
  return forced == nullptr || std::strcmp(forced, "cluster") != 0;
}

KnnStatus build_warp_groups(const ClusterSet &queries, const int32_t *cand_count,
                            const int32_t *work, WarpGroups &g, MemoryBudget &mem,
                            DeviceContext &ctx) {
  const int mq = queries.m;
  g.mem = &mem;
  g.max_groups = queries.n / kWarp + mq + 1;
  KNN_TRY(mem.allocate(ctx, g.count, mq + 1, "warp groups"));
  KNN_TRY(mem.allocate(ctx, g.first, mq + 1, "warp groups"));
  KNN_TRY(mem.allocate(ctx, g.n_groups, 1, "warp groups"));
  KNN_TRY(mem.allocate(ctx, g.groups, g.max_groups, "warp groups"));
  const int32_t *order = nullptr;
  if (work != nullptr && mq > 1 && groups_by_work()) {
    DeviceBuffer<int32_t> ids, sorted_work;
    KNN_TRY(mem.allocate(ctx, ids, mq, "warp groups"));
    KNN_TRY(mem.allocate(ctx, sorted_work, mq, "warp groups"));
    KNN_TRY(mem.allocate(ctx, g.order, mq, "warp groups"));
    iota_kernel<<<grid_for(mq, 128), 128, 0, ctx.stream>>>(mq, ids.get());
    CUDA_CHECK_LAUNCH(ctx, "iota_kernel");
    KNN_TRY(run_cub(ctx, mem, g.sort_temp, "warp groups", [&](void *temp, size_t &bytes) {
      return cub::DeviceRadixSort::SortPairsDescending(temp, bytes, work, sorted_work.get(),
                                                       ids.get(), g.order.get(), mq, 0,
                                                       32, ctx.stream);
    }));
    mem.release(ids);
    mem.release(sorted_work);
    order = g.order.get();
  }
  group_counts_kernel<<<grid_for(mq + 1, 128), 128, 0, ctx.stream>>>(
      mq, queries.begin.get(), cand_count, order, g.count.get());
  CUDA_CHECK_LAUNCH(ctx, "group_counts_kernel");
  KNN_TRY(run_cub(ctx, mem, g.scan_temp, "warp groups", [&](void *temp, size_t &bytes) {
    return cub::DeviceScan::ExclusiveSum(temp, bytes, g.count.get(), g.first.get(), mq + 1,
                                         ctx.stream);
  }));
  group_table_kernel<<<grid_for(mq, 128), 128, 0, ctx.stream>>>(
      mq, queries.begin.get(), cand_count, order, g.first.get(), g.groups.get(),
      g.n_groups.get());
  CUDA_CHECK_LAUNCH(ctx, "group_table_kernel");
  return KNN_OK;
}

// The partial filter (theta fixed at the level-1 bound): pass 1 counts the
// members that pass, pass 2 stores their values, a selection keeps the k'
// smallest. *done is false when the candidates do not fit the budget (then
// nothing is written and the full filter must run instead).
KnnStatus run_partial(const ClusterSet &queries, const ClusterSet &targets,
                      const DistinctSet &target_set, KnnMetric metric, ListPlace place,
                      int64_t max_groups, Level2Args a, bool *done, MemoryBudget &mem,
                      DeviceContext &ctx) {
  const int64_t nq = queries.n;
  const int kprime = a.kprime;
  const LaunchShape shape = launch_shape(1, false, kprime);
  a.parts = 1;
  a.groups_per_block = shape.groups_per_block;
  DeviceBuffer<int32_t> total;
  DeviceBuffer<int64_t> offset;
  KNN_TRY(mem.allocate(ctx, total, nq + 1, "partial filter counts"));
  KNN_TRY(mem.allocate(ctx, offset, nq + 1, "partial filter counts"));
  CUDA_CHECK(ctx, cudaMemsetAsync(total.get(), 0, (nq + 1) * sizeof(int32_t), ctx.stream));
  a.write = 0;
  a.cand_total = total.get();
  const unsigned grid = grid_for(max_groups, shape.groups_per_block);
  const Level2Kernel kernel = pick_kernel(metric, queries.stride, place, kPartial);
  KNN_TRY(launch(ctx, kernel, grid, shape, a));
  DeviceBuffer<unsigned char> off_temp;
  KNN_TRY(run_cub(ctx, mem, off_temp, "partial filter counts", [&](void *temp, size_t &bytes) {
    return cub::DeviceScan::ExclusiveSum(temp, bytes, total.get(), offset.get(), nq + 1,
                                         ctx.stream);
  }));
  int64_t stored = 0;
  CUDA_CHECK(ctx, cudaMemcpyAsync(&stored, offset.get() + nq, sizeof stored,
                                  cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx.stream));
  KNN_TRY(ctx.cancel_point());
  const size_t need = (size_t)stored * (sizeof(float) + sizeof(int32_t)) +
                      (size_t)nq * kprime * (sizeof(float) + sizeof(int32_t));
  *done = mem.budget() == 0 || mem.used() + need <= mem.budget();
  if (!*done) return KNN_OK;
  DeviceBuffer<float> cand_value, list_value;
  DeviceBuffer<int32_t> cand_pos, list_row;
  KNN_TRY(mem.allocate(ctx, cand_value, std::max<int64_t>(stored, 1), "partial candidates"));
  KNN_TRY(mem.allocate(ctx, cand_pos, std::max<int64_t>(stored, 1), "partial candidates"));
  a.write = 1;
  a.cand_offset = offset.get();
  a.cand_value = cand_value.get();
  a.cand_pos = cand_pos.get();
  KNN_TRY(launch(ctx, kernel, grid, shape, a));
  KNN_TRY(ctx.cancel_point());
  KNN_TRY(mem.allocate(ctx, list_value, (size_t)nq * kprime, "partial selection"));
  KNN_TRY(mem.allocate(ctx, list_row, (size_t)nq * kprime, "partial selection"));
  partial_select_kernel<<<grid_for(nq, 128), 128, 0, ctx.stream>>>(
      nq, queries.member.get(), total.get(), offset.get(), cand_value.get(), cand_pos.get(),
      targets.first_row.get(), targets.mult.get(), targets.rows_begin.get(),
      target_set.rows.get(), kprime, list_value.get(), list_row.get(), a.result_value,
      a.result_row);
  CUDA_CHECK_LAUNCH(ctx, "partial_select_kernel");
  return KNN_OK;
}

// The full filter (Algorithm 2) with the lists where config says, or in
// global memory where they do not fit; *config becomes what ran.
KnnStatus run_full(const ClusterSet &queries, KnnMetric metric, int64_t max_groups,
                   Level2Config *config, Level2Args a, MemoryBudget &mem, DeviceContext &ctx) {
  const int kprime = config->kprime;
  config->parts = std::max(1, std::min(config->parts, kMaxParts));
  if (config->place == ListPlace::Shared) {
    const LaunchShape s = launch_shape(config->parts, true, kprime);
    if (s.smem > ctx.prop.sharedMemPerBlockOptin) config->place = ListPlace::Global;
  }
  if ((config->place == ListPlace::Registers16 && kprime > 16) ||
      (config->place == ListPlace::Registers32 && kprime > 32))
    config->place = ListPlace::Global;
  const bool in_shared = config->place == ListPlace::Shared;
  if (config->shared_merge &&
      launch_shape(config->parts, in_shared, kprime, true).smem > ctx.prop.sharedMemPerBlockOptin)
    config->shared_merge = false;
  const bool shared_merge = config->shared_merge && config->parts > 1;
  const LaunchShape shape = launch_shape(config->parts, in_shared, kprime, shared_merge);
  a.parts = config->parts;
  a.groups_per_block = shape.groups_per_block;
  a.list_in_shared = in_shared ? 1 : 0;
  a.shared_merge = shared_merge ? 1 : 0;
  const unsigned grid = grid_for(max_groups, shape.groups_per_block);
  DeviceBuffer<float> global_value, part_value;
  DeviceBuffer<int32_t> global_row, part_row;
  if (config->place == ListPlace::Global) {
    const int64_t slots = (int64_t)grid * shape.threads;
    KNN_TRY(mem.allocate(ctx, global_value, (size_t)slots * kprime, "global top-k lists"));
    KNN_TRY(mem.allocate(ctx, global_row, (size_t)slots * kprime, "global top-k lists"));
    a.global_value = global_value.get();
    a.global_row = global_row.get();
    a.global_stride = slots;
  }
  if (config->parts > 1 && !shared_merge) {
    const size_t entries = (size_t)max_groups * kWarp * config->parts * kprime;
    KNN_TRY(mem.allocate(ctx, part_value, entries, "inside-query lists"));
    KNN_TRY(mem.allocate(ctx, part_row, entries, "inside-query lists"));
    a.part_value = part_value.get();
    a.part_row = part_row.get();
  }
  return launch(ctx, pick_kernel(metric, queries.stride, config->place, kFull, a.lazy != 0),
                grid, shape, a);
}

}  // namespace

int level2_threads_per_query(const DeviceContext &ctx, KnnMetric metric, int stride,
                             ListPlace place, int kprime, int64_t distinct_queries, double r) {
  Level2Kernel kernel = pick_kernel(metric, stride, place, kFull);
  LaunchShape shape = launch_shape(1, place == ListPlace::Shared, kprime);
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)kernel, shape.threads,
                                                    shape.smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  double max_concurrent = (double)blocks * shape.threads * ctx.prop.multiProcessorCount;
  double ratio = r * max_concurrent / (double)std::max<int64_t>(1, distinct_queries);
  if (ratio < 1.5) return 1;
  return (int)std::min<double>(kMaxParts, std::floor(ratio + 0.5));
}

KnnStatus level2_filter(const ClusterSet &queries, const ClusterSet &targets,
                        const DistinctSet &target_set, const Level1Result &level1,
                        KnnMetric metric, const Level2Config &requested, Margin margin,
                        float *result_value, int32_t *result_row,
                        unsigned long long *distance_counter, Level2Config *used,
                        MemoryBudget &mem, DeviceContext &ctx) {
  // Resumed lists: a query cluster without candidates keeps its queries'
  // lists as they are, so it gets no warps (no seeding, merge or store).
  WarpGroups groups;
  KNN_TRY(build_warp_groups(queries, requested.resume ? level1.cand_count.get() : nullptr,
                            level1.cand_count.get(), groups, mem, ctx));

  Level2Args a{};
  a.q = queries.view();
  a.groups = groups.groups.get();
  a.n_groups = groups.n_groups.get();
  a.upper_bound = level1.upper_bound.get();
  a.cand = level1.candidates.get();
  a.cand_count = level1.cand_count.get();
  a.cand_stride = level1.cand_stride;
  a.cand_first = level1.cand_first;
  a.t = targets.view();
  a.trows = target_set.rows.get();
  a.stride = queries.stride;
  a.kprime = requested.kprime;
  a.margin = margin;
  a.result_value = result_value;
  a.result_row = result_row;
  a.last_value = requested.last_value;
  a.last_row = requested.last_row;
  a.tiled = requested.tiled_lists ? 1 : 0;
  a.counter = distance_counter;
  a.stop = requested.stop;
  KNN_TRY(ctx.cancel_point());

  a.resume = requested.resume ? 1 : 0;
  a.lazy = requested.resume && requested.lazy_lists && requested.last_value != nullptr ? 1 : 0;
  Level2Config config = requested;
  // The partial filter cannot resume, and its selection stores lists by
  // distinct query, untiled and without their k'-th entries: the full
  // filter wherever any of these is asked for.
  if (config.resume || config.tiled_lists || config.last_value != nullptr) config.partial = false;
  if (config.partial) {
    config.parts = 1;  // also for the full filter, should the partial one not fit
    bool done = false;
    // Never stopped: a stopped count or write pass would leave candidates
    // unwritten that the selection indexes (the partial filter runs in
    // memory, where no stop word is given anyway).
    Level2Args counted = a;
    counted.stop = nullptr;
    KNN_TRY(run_partial(queries, targets, target_set, metric, config.place, groups.max_groups,
                        counted, &done, mem, ctx));
    if (done) {
      *used = config;
      return KNN_OK;
    }
    config.partial = false;  // the candidates do not fit: full filter instead
  }
  KNN_TRY(run_full(queries, metric, groups.max_groups, &config, a, mem, ctx));
  *used = config;
  return KNN_OK;
}

}  // namespace ti
}  // namespace cuda
}  // namespace knn
