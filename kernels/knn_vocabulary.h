/*
 * knn_vocabulary.h -- the one place where the engine's enums (knn_engine.h)
 * get their names: metrics, methods, devices, statuses and faults. Used by
 * the extension (settings, arguments, EXPLAIN, statistics), both engines,
 * the tests and the benchmark. Plain C ABI, defined in knn_vocabulary.cpp,
 * which is linked into knn_gpu.so, knn_gpu_cuda.so and every test and tool.
 */
#ifndef KNN_VOCABULARY_H
#define KNN_VOCABULARY_H

#include "knn_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A name and its value, for tables such as a GUC's options. */
typedef struct KnnName
{
	const char *name;
	int			value;
} KnnName;

/*
 * Tables of the accepted spellings, ending with {NULL, 0}. Parsing is
 * case-insensitive. knn_*_name() returns the first spelling of a value, or
 * "unknown" for a value outside the enum.
 */
extern const KnnName knn_metric_names[];	/* l2, cosine, ip, l1, hamming, jaccard */
extern const KnnName knn_method_names[];	/* auto, ti, brute */
extern const KnnName knn_device_names[];	/* auto, cpu, gpu */
extern const KnnName knn_fault_names[];		/* none, start, run, bad_alloc, finish */

const char *knn_metric_name(KnnMetric metric);
const char *knn_method_name(KnnMethod method);
const char *knn_device_name(KnnDevice device);
const char *knn_fault_name(KnnFault fault);
const char *knn_element_name(KnnElement element);	/* "float32", "float16", "bit" */
const char *knn_status_name(KnnStatus status);	/* "ok", "cancelled", ... */

/* Return 1 and set *out when name is a known spelling, else 0. */
int			knn_metric_parse(const char *name, KnnMetric *out);
int			knn_method_parse(const char *name, KnnMethod *out);
int			knn_device_parse(const char *name, KnnDevice *out);
int			knn_fault_parse(const char *name, KnnFault *out);

/*
 * A GPU list (knn_gpu.devices, KnnProblem.devices): "all" (any case, *n = 0)
 * or CUDA device ordinals 0 .. KNN_MAX_DEVICE_ORDINAL separated by commas,
 * e.g. "0,1" or "0, 0" (spaces allowed around each), at most
 * KNN_MAX_DEVICES of them. Returns 1 and sets devices[0 .. *n - 1], else 0
 * with the reason in errbuf.
 */
#define KNN_MAX_DEVICE_ORDINAL 255
int			knn_device_list_parse(const char *text, int32_t *devices, int32_t *n,
								  char *errbuf, size_t errlen);

/* "l2, cosine, ip, l1, hamming, jaccard" and the like, for error hints. */
const char *knn_metric_list(void);
const char *knn_method_list(void);

#ifdef __cplusplus
}
#endif

#endif							/* KNN_VOCABULARY_H */
