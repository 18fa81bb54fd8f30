/*
 * knn_engine.h -- the only bridge between PostgreSQL code (extension/) and
 * the engines (kernels/). Plain C ABI: no PostgreSQL and no CUDA headers.
 *
 * A join is described by a KnnProblem: two row-major matrices of one
 * element type (float32, float16 or bits) and k.
 * The result for query i lives in neighbors[i*k .. i*k+k-1] (target row
 * indices) and distances[...] (the operator's float8 value). Per query the
 * rows are ordered by (distance, target row index); NaN distances sort last,
 * as PostgreSQL sorts float8. Slots past the number of eligible targets hold
 * -1 and NaN. The caller orders targets by id, so "smaller row index" is
 * "smaller target id" and ties are broken by id.
 *
 * Jobs run on threads owned by the engine; the caller's thread only starts,
 * polls, cancels and finishes them, so PostgreSQL code never runs on an
 * engine thread.
 */
#ifndef KNN_ENGINE_H
#define KNN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The names and parsers of the enums below: knn_vocabulary.h. */

typedef enum KnnMetric
{
	KNN_METRIC_L2 = 0,			/* sqrt(sum (a-b)^2), pgvector <-> */
	KNN_METRIC_COSINE = 1,		/* 1 - a.b/(|a||b|), pgvector <=> */
	KNN_METRIC_IP = 2,			/* -(a.b), pgvector <#> */
	KNN_METRIC_L1 = 3,			/* sum |a-b|, pgvector <+> */
	KNN_METRIC_HAMMING = 4,		/* differing bits, pgvector <~> (bit rows only) */
	KNN_METRIC_JACCARD = 5		/* 1 - |a&b|/|a|b|, pgvector <%> (bit rows only) */
} KnnMetric;

/*
 * What one element of a row is. A row of dim elements takes
 *   FLOAT32: 4 * dim bytes (pgvector vector),
 *   FLOAT16: 2 * dim bytes, IEEE binary16 (pgvector halfvec),
 *   BIT:     (dim + 7) / 8 bytes, element i in bit 7 - i % 8 of byte i / 8,
 *            the bits past dim zero (PostgreSQL's bit(n) layout).
 * Distances are those of the operator on the element values: a float16
 * join is exactly the float32 join of the same values widened.
 */
typedef enum KnnElement
{
	KNN_ELEMENT_FLOAT32 = 0,
	KNN_ELEMENT_FLOAT16 = 1,
	KNN_ELEMENT_BIT = 2
} KnnElement;

typedef enum KnnMethod
{
	KNN_METHOD_AUTO = 0,
	KNN_METHOD_TI = 1,			/* clustered triangle-inequality filtering */
	KNN_METHOD_BRUTE = 2		/* every pair */
} KnnMethod;

typedef enum KnnDevice
{
	KNN_DEVICE_AUTO = 0,		/* GPU when one is usable, else CPU */
	KNN_DEVICE_CPU = 1,
	KNN_DEVICE_GPU = 2			/* GPU; the CPU engine with a notice if none */
} KnnDevice;

/*
 * Test-only fault injection (knn_gpu.fault_injection): makes an engine
 * entry throw a C++ exception at a chosen place, to prove that every entry
 * turns it into a status and a message and that the backend survives.
 */
typedef enum KnnFault
{
	KNN_FAULT_NONE = 0,
	KNN_FAULT_START = 1,		/* knn_job_start throws before the thread starts */
	KNN_FAULT_RUN = 2,			/* the engine throws std::runtime_error on its thread */
	KNN_FAULT_BAD_ALLOC = 3,	/* the engine throws std::bad_alloc on its thread */
	KNN_FAULT_FINISH = 4		/* knn_job_finish throws after the thread is joined */
} KnnFault;

typedef enum KnnStatus
{
	KNN_OK = 0,
	KNN_CANCELLED = 1,
	KNN_OUT_OF_MEMORY = 2,
	KNN_INVALID_ARGUMENT = 3,
	KNN_DEVICE_ERROR = 4,		/* a CUDA / cuBLAS call failed */
	KNN_NO_DEVICE = 5,			/* a GPU was required but none is usable */
	KNN_INTERNAL_ERROR = 6
} KnnStatus;

/* The most GPUs one join is split across (knn_gpu.devices' longest list). */
#define KNN_MAX_DEVICES 16

typedef struct KnnProblem
{
	KnnElement	element;		/* of both matrices; see KnnElement */
	const void *queries;		/* n_queries rows of dim elements, row-major */
	int64_t		n_queries;
	const void *targets;		/* n_targets rows of dim elements, row-major */
	int64_t		n_targets;
	int32_t		dim;			/* elements (bits for KNN_ELEMENT_BIT) per row */
	int32_t		k;				/* >= 1 */
	KnnMetric	metric;
	KnnMethod	method;
	KnnDevice	device;

	/*
	 * Self-match exclusion: when both are non-NULL, a pair whose keys are
	 * equal is never returned (the all-kNN graph of one table).
	 */
	const int64_t *query_keys;
	const int64_t *target_keys;

	int32_t		n_threads;		/* CPU threads; 0 = all cores, at most KNN_MAX_THREADS */
	int64_t		gpu_memory_limit;	/* bytes the GPU engine may use; 0 = what is free */
	KnnFault	fault;			/* KNN_FAULT_NONE except in tests */

	/*
	 * Per-group joins: when both are non-NULL (n_queries and n_targets
	 * entries), a query is joined only with the targets of an equal group
	 * id; a query whose group has no target gets only empty slots. The
	 * job layer runs each group as its own problem (group_split.h).
	 */
	const int64_t *query_groups;
	const int64_t *target_groups;

	/*
	 * Admission (KnnAdmission): with KNN_ADMISSION_GPU a job that is about
	 * to run on the GPU first asks its caller for a slot and waits,
	 * cancellably, until knn_job_admit() (see below); 0 = never asks.
	 */
	int32_t		admission;

	/*
	 * Range joins (KnnRange): with KNN_RANGE_BELOW (distance < max_distance)
	 * or KNN_RANGE_AT_MOST (<=) the job returns every pair within the
	 * radius, compared as PostgreSQL compares float8 (NaN above every
	 * number and equal to itself), and k is a cap per query: 0 = every pair,
	 * n > 0 = the first n. Pairs come ordered by query row, then (distance,
	 * target row), through knn_job_take_pairs(); knn_job_start's neighbors
	 * and distances are then unused (NULL). Keys and groups apply as above.
	 * KNN_RANGE_NONE (0, a zeroed problem): the k-nearest join above.
	 */
	double		max_distance;
	int32_t		range;			/* KnnRange */

	/*
	 * The GPUs of a GPU join (knn_gpu.devices). n_devices = 0: every GPU
	 * the process sees, the join split across them where it is large enough
	 * to gain (else the first GPU alone). n_devices > 0: the CUDA device
	 * ordinals devices[0 .. n_devices - 1], the join split across all of
	 * them. The split gives each GPU a range of query rows (every target on
	 * each), so results are exactly those of one GPU. An ordinal may be
	 * listed twice: a test mode that runs two engines (streams, handles,
	 * memory shares) on one GPU. Joins that are not split (range and
	 * group joins of their own kernels) run on the first GPU.
	 */
	int32_t		n_devices;		/* 0 .. KNN_MAX_DEVICES */
	int32_t		devices[KNN_MAX_DEVICES];	/* each >= 0 */
} KnnProblem;

typedef enum KnnRange
{
	KNN_RANGE_NONE = 0,
	KNN_RANGE_BELOW = 1,		/* distance < max_distance */
	KNN_RANGE_AT_MOST = 2		/* distance <= max_distance */
} KnnRange;

/* The most CPU threads an engine uses (knn_gpu.threads' upper bound). */
#define KNN_MAX_THREADS 256

/* One GPU's share of a join (KnnStats.device_work). */
typedef struct KnnDeviceWork
{
	int32_t		device;			/* CUDA device ordinal */
	int64_t		queries;		/* query rows it joined */
	double		seconds;		/* from its start to its last result */
} KnnDeviceWork;

/* What a finished job did, for EXPLAIN ANALYZE and knn_gpu_last_stats(). */
typedef struct KnnStats
{
	KnnDevice	device;			/* the engine that ran: KNN_DEVICE_CPU or _GPU */
	KnnMethod	method;			/* the method that ran: KNN_METHOD_TI or _BRUTE */
	char		device_name[128];	/* "cpu (2 threads)" or the GPU's name */
	char		variant[128];	/* free text, e.g. "full-filter/registers" */
	int64_t		query_clusters;
	int64_t		target_clusters;
	int64_t		distance_computations;	/* exact distances evaluated */
	int64_t		pairs;			/* |Q| * |T| */
	int32_t		threads_per_query;
	double		seconds_transfer;
	double		seconds_cluster;
	double		seconds_filter;
	double		seconds_select;
	double		seconds_total;

	/*
	 * The GPU engines that ran, in the order of the query rows they took
	 * (0 on the CPU engine; 1 for a join on one GPU). For a split join the
	 * phase times above are the slowest engine's, the counts the sums.
	 */
	int32_t		n_devices;
	KnnDeviceWork device_work[KNN_MAX_DEVICES];

	/*
	 * Seconds the job waited for a GPU context permit
	 * (knn_engine_set_gpu_contexts) before it ran; the caller's own wait
	 * for an admission slot is not included.
	 */
	double		seconds_queued;
} KnnStats;

typedef struct KnnJob KnnJob;

/*
 * Starts a join on engine threads. neighbors and distances are caller-owned
 * arrays of n_queries * k entries that must stay valid until
 * knn_job_finish(). Returns NULL only when even the job could not be
 * allocated (then errbuf says why).
 */
KnnJob	   *knn_job_start(const KnnProblem *problem, int64_t *neighbors,
						  double *distances, char *errbuf, size_t errlen);

/* Waits up to timeout_ms; returns 1 when the job has finished, else 0. */
int			knn_job_wait(KnnJob *job, int timeout_ms);

/* Asks the job to stop; it ends with KNN_CANCELLED soon after. */
void		knn_job_cancel(KnnJob *job);

/*
 * Waits for the job, frees it and returns its status. On failure errbuf
 * holds a one-line message; on success a non-empty errbuf is a notice for
 * the user (the GPU was wanted but the CPU engine ran, and why). stats may
 * be NULL.
 */
KnnStatus	knn_job_finish(KnnJob *job, KnnStats *stats, char *errbuf, size_t errlen);

/*
 * Where the GPU engine module (knn_gpu_cuda.so) lives; set once by the
 * extension. The module is loaded on first use; when it or the GPU is
 * missing, KNN_DEVICE_AUTO falls back to the CPU engine.
 */
void		knn_engine_set_module_dir(const char *dir);

/*
 * One line describing the engine KNN_DEVICE_AUTO would use, e.g.
 * "gpu: NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or
 * "cpu: 2 threads (no GPU: <reason>)". Returns 1 if a GPU is usable.
 */
int			knn_engine_describe(char *buf, size_t len);

/*
 * The CPU engine's line alone, without looking for a GPU, e.g.
 * "cpu: 2 threads, BLAS: OpenBLAS 0.3.21 (libopenblas.so.0)".
 */
void		knn_engine_describe_cpu(char *buf, size_t len);

/*
 * Admission to the GPU (knn_gpu.max_gpu_jobs). A job started with
 * problem->admission != KNN_ADMISSION_NONE that chooses the GPU (or, with
 * KNN_ADMISSION_ALL, a test-only mode, any float engine) stops before the
 * engine runs and waits: knn_job_wants_slot() then returns 1 (and
 * knn_job_wait() returns early), and the caller, once it holds a slot,
 * calls knn_job_admit() with the GPU memory the join may use (bytes, 0 =
 * keep problem->gpu_memory_limit). A job cancelled while it waits ends with
 * KNN_CANCELLED. A job asks at most once.
 */
typedef enum KnnAdmission
{
	KNN_ADMISSION_NONE = 0,
	KNN_ADMISSION_GPU = 1,		/* GPU joins ask */
	KNN_ADMISSION_ALL = 2		/* tests: CPU float joins ask too */
} KnnAdmission;

int			knn_job_wants_slot(KnnJob *job);
void		knn_job_admit(KnnJob *job, int64_t gpu_memory_limit);

/*
 * The server-wide record of the GPU probe. path: a file the engine may
 * create and replace (written atomically with rename); server_key: one line
 * naming this server run (e.g. the postmaster's pid and start time). The
 * first process that loads the GPU module writes what its probe found; a
 * later process whose record says "no usable GPU", for the same server run
 * and the same module file, does not load the module under
 * KNN_DEVICE_AUTO (KNN_DEVICE_GPU still loads it and probes again, and
 * rewrites the record). A missing, foreign or damaged record means "probe".
 * Not set (the default): every process probes.
 */
void		knn_engine_set_probe_record(const char *path, const char *server_key);

/*
 * GPU memory of an idle process (knn_gpu.gpu_idle_release): once no join
 * has used the GPU for idle_ms, the GPU module gives back its context,
 * memory pool reserve, pinned staging memory and cuBLAS handle; the next
 * GPU join creates them again. 0 = keep them (the default). Takes effect
 * from the next GPU join (or background warm-up) on.
 */
void		knn_engine_set_gpu_idle_release(int64_t idle_ms);

/*
 * GPU contexts of the server's processes (knn_gpu.max_gpu_contexts): a
 * process takes one of max_contexts permits, files dir/knn_gpu_context.<i>
 * held with flock(2), before it creates its GPU runtime, and gives it back
 * when the GPU module has released the last of its runtimes (idle release)
 * or when it exits; one permit covers all its GPUs. A join whose process
 * holds no runtime and finds no permit free runs on the CPU engine under
 * KNN_DEVICE_AUTO (its statistics' device_name says so) and waits for one
 * under KNN_DEVICE_GPU (cancellably; KnnStats.seconds_queued). dir: an
 * existing directory; max_contexts 0 = no limit (the default). Takes
 * effect for a process's next runtime.
 */
void		knn_engine_set_gpu_contexts(const char *dir, int32_t max_contexts);

/*
 * At process exit (before exit() runs atexit handlers): waits for the
 * engine's background threads (the GPU runtime's warm-up, the idle
 * release timer) and stops them, so that none runs while the process
 * tears down the CUDA runtime.
 */
void		knn_engine_shutdown(void);

/*
 * The pairs of a range job (problem->range != KNN_RANGE_NONE), in order:
 * copies up to capacity of them into the caller's arrays and returns how
 * many, waiting up to timeout_ms while none is ready; returns -1 once the
 * job has finished and every pair has been taken (knn_job_finish then
 * says whether it ended well). The engine works ahead by a bounded number
 * of pairs and then waits for the caller, so a caller must take pairs
 * until -1 or cancel the job before knn_job_finish.
 */
int64_t		knn_job_take_pairs(KnnJob *job, int64_t *query_rows, int64_t *target_rows,
							   double *distances, int64_t capacity, int timeout_ms);

/*
 * The GPU service (knn_gpu.gpu_service; gpu_service.h): one process of the
 * server owns the GPU and runs the k-NN joins of every backend. With
 * KNN_GPU_SERVICE_ON a job that would run knn_cuda_run in this process
 * sends the join to the service listening at socket_path instead (range
 * and per-group joins stay in this process); AUTO treats a listening
 * service as a ready GPU, and while none listens yet runs the joins that
 * the CPU answers sooner on the CPU. KNN_GPU_SERVICE_CPU_STAND_IN (tests
 * only): the same, but the service runs the job on its CPU engine, so
 * that the service is tested without a GPU. lock_path: the file a running
 * service holds with flock(2); a join that waits for a service to listen
 * stops waiting once none has held it for a while. Takes effect from the
 * next job.
 */
typedef enum KnnGpuService
{
	KNN_GPU_SERVICE_OFF = 0,
	KNN_GPU_SERVICE_ON = 1,
	KNN_GPU_SERVICE_CPU_STAND_IN = 2
} KnnGpuService;

void		knn_engine_set_gpu_service(const char *socket_path, const char *lock_path,
									   int32_t mode);

/*
 * The shared row buffer (gpu_service_rows.h): storage for a matrix's rows
 * in this process's memfd that a GPU service job sends as it is, instead
 * of copying the rows into a memfd of its own. A problem whose rows lie in
 * it (any pointers into live segments) uses it by itself. create: a
 * segment of at least bytes, or NULL when none can be made (the caller
 * then uses memory of its own). grow: to at least bytes, keeping the
 * contents, with pages allocated for bytes (in 2 MB steps), no more; its
 * data pointer may change (only when another segment lies above it); 0
 * on failure (the segment as it was). free: NULL is a no-op;
 * no job may use the segment any more.
 */
typedef struct KnnSharedRows KnnSharedRows;

KnnSharedRows *knn_shared_rows_create(size_t bytes);
int			knn_shared_rows_grow(KnnSharedRows *rows, size_t bytes);
void	   *knn_shared_rows_data(const KnnSharedRows *rows);
void		knn_shared_rows_free(KnnSharedRows *rows);

/*
 * For tests: segments live in this process, jobs sent in the shared row
 * buffer so far, and (fail != 0) every later grow failing, as when memory
 * runs out.
 */
int64_t		knn_shared_rows_live(void);
int64_t		knn_shared_rows_jobs(void);
void		knn_shared_rows_fail_growth(int fail);

/*
 * 1 when the server's probe record (knn_engine_set_probe_record) says
 * that no GPU is usable, for this server run and module file; never loads
 * the module.
 */
int			knn_engine_gpu_ruled_out(void);

/*
 * Every entry above is safe to call from C: none lets a C++ exception out
 * and none returns without a status (or NULL) and a message.
 */

#ifdef __cplusplus
}
#endif

#endif							/* KNN_ENGINE_H */
