/*
 * knn_gpu.c -- module entry: PG_MODULE_MAGIC, the GUCs, and the engine's
 * set-up when the library is loaded.
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "knn_gpu.h"
#include "knn_scan.h"

PG_MODULE_MAGIC;

int			knn_gpu_device = KNN_DEVICE_AUTO;
int			knn_gpu_memory_limit_mb = 0;
int			knn_gpu_threads = 0;
bool		knn_gpu_enable_knn_join = true;
bool		knn_gpu_exact_over_index = false;

static const struct config_enum_entry device_options[] = {
	{"auto", KNN_DEVICE_AUTO, false},
	{"gpu", KNN_DEVICE_GPU, false},
	{"cpu", KNN_DEVICE_CPU, false},
	{NULL, 0, false}
};

void		_PG_init(void);

void
_PG_init(void)
{
	DefineCustomEnumVariable("knn_gpu.device",
							 "Which engine runs KNN joins: auto, gpu or cpu.",
							 "auto uses the GPU when one is usable and the CPU engine otherwise; "
							 "gpu does the same but says so with a NOTICE when no GPU is usable.",
							 &knn_gpu_device, KNN_DEVICE_AUTO, device_options,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("knn_gpu.gpu_memory_limit",
							"Most GPU memory one KNN join may use (0 = what is free).",
							"Larger joins are processed in chunks.",
							&knn_gpu_memory_limit_mb, 0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomIntVariable("knn_gpu.threads",
							"CPU threads the CPU engine uses (0 = all cores).",
							NULL,
							&knn_gpu_threads, 0, 0, 4096,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("knn_gpu.enable_knn_join",
							 "Plans LATERAL top-k distance joins as one batched KNN Join node.",
							 NULL,
							 &knn_gpu_enable_knn_join, true,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("knn_gpu.exact_over_index",
							 "Uses the exact KNN Join node even where an approximate index (hnsw, ivfflat) would answer.",
							 NULL,
							 &knn_gpu_exact_over_index, false,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("knn_gpu");

	/* The GPU module (knn_gpu_cuda.so) is installed beside this library. */
	knn_engine_set_module_dir(pkglib_path);

	knn_scan_register();
}
