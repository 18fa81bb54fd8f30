/*
 * knn_run.c -- running one engine job from a backend.
 *
 * The job runs on engine threads. This (the backend's) thread waits for it in
 * short slices, and when a cancel or statement_timeout arrives it asks the
 * job to stop, waits for the engine to release its threads and GPU memory,
 * and only then lets PostgreSQL raise the error -- no longjmp ever leaves
 * engine resources behind.
 */
#include "postgres.h"

#include "miscadmin.h"

#include "knn_gpu.h"

/* How long the backend sleeps between looks at its interrupt flags. */
#define KNN_POLL_MS 10

static const char *const metric_names[] = {"l2", "cosine", "ip", "l1"};

KnnMetric
knn_metric_from_name(const char *name)
{
	for (int i = 0; i < (int) lengthof(metric_names); i++)
		if (pg_strcasecmp(name, metric_names[i]) == 0)
			return (KnnMetric) i;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown metric \"%s\"", name),
			 errhint("Valid metrics are l2 (<->), cosine (<=>), ip (<#>, negative inner product) and l1 (<+>).")));
	return KNN_METRIC_L2;		/* not reached */
}

const char *
knn_metric_name(KnnMetric metric)
{
	return metric_names[metric];
}

KnnMethod
knn_method_from_name(const char *name)
{
	if (pg_strcasecmp(name, "auto") == 0)
		return KNN_METHOD_AUTO;
	if (pg_strcasecmp(name, "ti") == 0)
		return KNN_METHOD_TI;
	if (pg_strcasecmp(name, "brute") == 0)
		return KNN_METHOD_BRUTE;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown method \"%s\"", name),
			 errhint("Valid methods are auto, ti (triangle-inequality filtering) and brute.")));
	return KNN_METHOD_AUTO;		/* not reached */
}

static bool
cancel_requested(void)
{
	return QueryCancelPending || ProcDiePending;
}

void
knn_run_problem(KnnProblem *problem, int64 *neighbors, double *distances,
				KnnStats *stats)
{
	char		message[1024] = "";
	KnnJob	   *job;
	KnnStatus	status;
	bool		cancelled = false;

	problem->device = (KnnDevice) knn_gpu_device;
	problem->gpu_memory_limit = (int64_t) knn_gpu_memory_limit_mb * 1024 * 1024;
	problem->n_threads = knn_gpu_threads;

	job = knn_job_start(problem, neighbors, distances, message, sizeof(message));
	if (job == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not start the KNN join: %s", message)));

	while (!knn_job_wait(job, KNN_POLL_MS))
	{
		if (!cancelled && cancel_requested())
		{
			knn_job_cancel(job);
			cancelled = true;
		}
	}
	status = knn_job_finish(job, stats, message, sizeof(message));

	if (cancelled)
	{
		/* Raises the pending cancel / timeout / termination error. */
		CHECK_FOR_INTERRUPTS();
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("canceling KNN join due to user request")));
	}

	switch (status)
	{
		case KNN_OK:
			if (message[0] != '\0')
				ereport(NOTICE, (errmsg("%s", message)));
			knn_stats_remember(stats, problem);
			return;
		case KNN_CANCELLED:
			ereport(ERROR,
					(errcode(ERRCODE_QUERY_CANCELED),
					 errmsg("KNN join was cancelled: %s", message)));
			break;
		case KNN_OUT_OF_MEMORY:
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("KNN join ran out of memory: %s", message),
					 errhint("Lower knn_gpu.gpu_memory_limit, or set knn_gpu.device = cpu.")));
			break;
		case KNN_INVALID_ARGUMENT:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid KNN join: %s", message)));
			break;
		case KNN_DEVICE_ERROR:
		case KNN_NO_DEVICE:
			ereport(ERROR,
					(errcode(ERRCODE_EXTERNAL_ROUTINE_EXCEPTION),
					 errmsg("GPU error in KNN join: %s", message),
					 errhint("Set knn_gpu.device = cpu to use the CPU engine.")));
			break;
		case KNN_INTERNAL_ERROR:
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("internal error in KNN join: %s", message)));
			break;
	}
}
