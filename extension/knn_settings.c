/*
 * knn_settings.c -- the knn_gpu.* settings. Their option names come from
 * the engine's vocabulary (knn_vocabulary.h), their limits from the engine
 * ABI, so that what a setting accepts is what the engine does.
 */
#include "postgres.h"

#include <limits.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "knn_settings.h"
#include "knn_vocabulary.h"

int			knn_gpu_device = KNN_DEVICE_AUTO;
int			knn_gpu_memory_limit_mb = 0;
int			knn_gpu_threads = 0;
bool		knn_gpu_enable_knn_join = true;
bool		knn_gpu_exact_over_index = false;
bool		knn_gpu_shard_prefetch = true;
bool		knn_gpu_shard_relay = true;
bool		knn_gpu_direct_return = true;
int			knn_gpu_max_result_memory_mb = 0;
int			knn_gpu_fault_injection = KNN_FAULT_NONE;
int			knn_gpu_max_gpu_jobs = 4;
int			knn_gpu_memory_budget_mb = 0;
int			knn_gpu_idle_release_s = 60;
int			knn_gpu_max_gpu_contexts = 16;
bool		knn_gpu_service = false;
int32		knn_gpu_n_devices = 0;
int32		knn_gpu_device_list[KNN_MAX_DEVICES];
static char *knn_gpu_devices_text = NULL;

/* The most admission slots (slot files): far more than any GPU runs at once. */
#define KNN_MAX_GPU_JOBS 1024
/* The most GPU context permits (files): far more contexts than a GPU holds. */
#define KNN_MAX_GPU_CONTEXTS 1024

/*
 * A GUC option table from a vocabulary table (allocated once, kept), plus
 * the extension-only options of extras (NULL-name terminated; may be NULL).
 */
static const struct config_enum_entry *
enum_options_plus(const KnnName *names, const KnnName *extras)
{
	struct config_enum_entry *options;
	int			n = 0;
	int			n_extra = 0;

	while (names[n].name != NULL)
		n++;
	while (extras != NULL && extras[n_extra].name != NULL)
		n_extra++;
	options = MemoryContextAllocZero(TopMemoryContext, sizeof(*options) * (n + n_extra + 1));
	for (int i = 0; i < n + n_extra; i++)
	{
		const KnnName *name = i < n ? &names[i] : &extras[i - n];

		options[i].name = name->name;
		options[i].val = name->value;
	}
	return options;
}

static const struct config_enum_entry *
enum_options(const KnnName *names)
{
	return enum_options_plus(names, NULL);
}

/* knn_gpu.fault_injection's extension-only values (knn_settings.h). */
static const KnnName extension_faults[] = {
	{"admit_cpu", KNN_GPU_FAULT_ADMIT_CPU},
	{"service_cpu", KNN_GPU_FAULT_SERVICE_CPU},
	{"ship_cancel_at_sync", KNN_GPU_FAULT_SHIP_CANCEL_AT_SYNC},
	{NULL, 0}
};

/* The engine keeps its own copy: its threads never read PostgreSQL's. */
static void
assign_gpu_idle_release(int newval, void *extra)
{
	knn_engine_set_gpu_idle_release((int64_t) newval * 1000);
}

/* knn_gpu.devices: the list as the engine takes it (KnnProblem.devices). */
typedef struct KnnDeviceList
{
	int32		n;
	int32		devices[KNN_MAX_DEVICES];
} KnnDeviceList;

static bool
check_gpu_devices(char **newval, void **extra, GucSource source)
{
	KnnDeviceList list;
	char		why[128];
	KnnDeviceList *kept;

	if (!knn_device_list_parse(*newval, list.devices, &list.n, why, sizeof(why)))
	{
		GUC_check_errdetail("%s.", why);
		return false;
	}
	kept = malloc(sizeof(KnnDeviceList));
	if (kept == NULL)
		return false;
	*kept = list;
	*extra = kept;
	return true;
}

static void
assign_gpu_devices(const char *newval, void *extra)
{
	const KnnDeviceList *list = (const KnnDeviceList *) extra;

	knn_gpu_n_devices = list->n;
	memcpy(knn_gpu_device_list, list->devices, sizeof(knn_gpu_device_list));
}

/*
 * Before exit() tears down the CUDA runtime, the engine's background
 * threads (GPU warm-up, idle release) must have stopped.
 */
static void
engine_shutdown_at_exit(int code, Datum arg)
{
	knn_engine_shutdown();
}

void
knn_settings_define(void)
{
	DefineCustomEnumVariable("knn_gpu.device",
							 "Which engine runs KNN joins: auto, gpu or cpu.",
							 "auto uses the GPU when one is usable and the CPU engine otherwise; "
							 "gpu does the same but says so with a NOTICE when no GPU is usable.",
							 &knn_gpu_device, KNN_DEVICE_AUTO, enum_options(knn_device_names),
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("knn_gpu.devices",
							   "GPUs a KNN join is split across: all, or a list such as 0,1.",
							   "all uses every GPU the server sees for joins large enough to gain; "
							   "a list splits every GPU join across the GPUs it names "
							   "(a GPU named twice runs two engines on it: a test mode).",
							   &knn_gpu_devices_text, "all",
							   PGC_USERSET, GUC_LIST_INPUT,
							   check_gpu_devices, assign_gpu_devices, NULL);
	DefineCustomIntVariable("knn_gpu.gpu_memory_limit",
							"Most GPU memory one KNN join may use on each GPU (0 = what is free).",
							"Larger joins are processed in chunks.",
							&knn_gpu_memory_limit_mb, 0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomIntVariable("knn_gpu.threads",
							"CPU threads the CPU engine uses (0 = all cores).",
							"More than the server's cores are taken as all cores.",
							&knn_gpu_threads, 0, 0, KNN_MAX_THREADS,
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
	DefineCustomBoolVariable("knn_gpu.direct_return",
							 "Returns knn_join's rows straight from the engine's result, without a tuplestore.",
							 "Off: through the Function Scan's tuplestore (work_mem, spilling to disk).",
							 &knn_gpu_direct_return, true,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	/*
	 * Superuser (or GRANT SET): k is the caller's, and k x rows can ask for
	 * far more memory than the server has.
	 */
	DefineCustomIntVariable("knn_gpu.max_result_memory",
							"Most memory a KNN join's result arrays may take at once (0: a quarter of the server's physical memory).",
							"knn_join runs larger joins in batches of queries, returning their "
							"rows through the tuplestore; the KNN Join node ends them with an error.",
							&knn_gpu_max_result_memory_mb, 0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MB, NULL, NULL, NULL);
	DefineCustomBoolVariable("knn_gpu.shard_prefetch",
							 "A sharded knn_join's shards read their targets while the coordinator reads its queries.",
							 NULL,
							 &knn_gpu_shard_prefetch, true,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("knn_gpu.shard_relay",
							 "A sharded self-join sends the shards' rows on to the other shards as they came.",
							 "Off: the coordinator decodes them and encodes them again (shards of an older knn_gpu are served so).",
							 &knn_gpu_shard_relay, true,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomEnumVariable("knn_gpu.fault_injection",
							 "Test only: makes an engine entry throw (start, run, bad_alloc, finish), "
							 "or CPU joins take GPU admission slots (admit_cpu), "
							 "or k-NN joins run in the GPU service on its CPU engine (service_cpu).",
							 "Proves that engine failures become errors and the backend survives.",
							 &knn_gpu_fault_injection, KNN_FAULT_NONE,
							 enum_options_plus(knn_fault_names, extension_faults),
							 PGC_SUSET, GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL, NULL, NULL, NULL);

	/*
	 * Cluster-wide, so set in postgresql.conf (reload): a per-session value
	 * would let a session ignore the limit that the others keep.
	 */
	DefineCustomIntVariable("knn_gpu.max_gpu_jobs",
							"How many KNN joins may run on the GPU at once, across the server.",
							"A GPU join that finds them all running waits (wait event Extension).",
							&knn_gpu_max_gpu_jobs, 4, 1, KNN_MAX_GPU_JOBS,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("knn_gpu.gpu_memory_budget",
							"GPU memory all running KNN joins may use together (0 = no budget).",
							"Each admitted join may use gpu_memory_budget / max_gpu_jobs "
							"(or gpu_memory_limit, when smaller); larger joins are chunked.",
							&knn_gpu_memory_budget_mb, 0, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MB, NULL, NULL, NULL);

	/*
	 * Reload, like the two above: how long an idle backend may hold GPU
	 * memory is the administrator's decision for all sessions.
	 */
	DefineCustomIntVariable("knn_gpu.gpu_idle_release",
							"Idle time after which a backend gives back its GPU context and memory (0 = never).",
							"The context, memory pool reserve, pinned staging memory and cuBLAS handle "
							"are released; the next GPU join creates them again.",
							&knn_gpu_idle_release_s, 60, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, assign_gpu_idle_release, NULL);
	DefineCustomIntVariable("knn_gpu.max_gpu_contexts",
							"How many server processes may hold a GPU context at once (0 = no limit).",
							"Each holds one (some hundreds of MB of GPU memory) from its first GPU join "
							"until knn_gpu.gpu_idle_release gives it back. Where none is free, "
							"device = auto runs the join on the CPU engine; device = gpu waits for one.",
							&knn_gpu_max_gpu_contexts, 16, 0, KNN_MAX_GPU_CONTEXTS,
							PGC_SIGHUP, 0, NULL, NULL, NULL);

	/*
	 * Reload, like max_gpu_jobs: whether one process owns the GPU for all
	 * sessions is a decision for the whole server (knn_gpu_service.c).
	 */
	DefineCustomBoolVariable("knn_gpu.gpu_service",
							 "Runs the sessions' GPU k-NN joins in one GPU service process.",
							 "The service (a background worker, started on demand) holds the "
							 "server's only GPU context; backends then create none. Range and "
							 "per-group joins still run in the backend.",
							 &knn_gpu_service, false,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);

	/*
	 * A backend runs _PG_init itself unless the library is preloaded; a
	 * preloaded library's exit callbacks are dropped in each child, and
	 * the engine then stops its threads from an atexit handler of its own.
	 */
	if (!process_shared_preload_libraries_in_progress)
		on_proc_exit(engine_shutdown_at_exit, (Datum) 0);
	MarkGUCPrefixReserved("knn_gpu");
}

int64
knn_result_memory_bytes(void)
{
	/* a quarter of the physical memory, found once: sysconf is a system call, and this is asked per row */
	static int64 quarter = 0;

	if (knn_gpu_max_result_memory_mb > 0)
		return (int64) knn_gpu_max_result_memory_mb * 1024 * 1024;
	if (quarter == 0)
	{
		long		pages = sysconf(_SC_PHYS_PAGES);
		long		page_bytes = sysconf(_SC_PAGESIZE);

		quarter = pages <= 0 || page_bytes <= 0 ? (int64) 1024 * 1024 * 1024 :	/* unknown: 1 GB */
			(int64) pages * page_bytes / 4;
	}
	return quarter;
}

int64
knn_result_rows_per_run(int32 slots)
{
	int64		bytes = knn_result_memory_bytes();
	int64		per_row = (int64) Max(slots, 1) * (sizeof(int64) + sizeof(double));

	return Max(1, bytes / per_row);
}

int32
knn_threads_for_job(void)
{
	/* the server's cores, found once (as knn_result_memory_bytes' memory) */
	static int32 cores = 0;

	if (cores == 0)
	{
		long		online = sysconf(_SC_NPROCESSORS_ONLN);

		cores = online > 0 ? (int32) Min(online, KNN_MAX_THREADS) : KNN_MAX_THREADS;
	}
	return Min(knn_gpu_threads, cores);
}
