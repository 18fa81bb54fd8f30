/*
 * knn_run.c -- running one engine job from a backend.
 *
 * The job runs on engine threads. This (the backend's) thread waits for it
 * in short slices. Whatever interrupt arrives (cancel, statement_timeout,
 * termination, or any other), the job is stopped -- asked to cancel, then
 * waited for until the engine has released its threads and GPU memory --
 * before PostgreSQL handles the interrupt: an ERROR's longjmp (PG_CATCH
 * below), a FATAL's proc_exit (the exit callback), and postmaster death
 * (checked here) never leave an engine thread running on freed memory.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "utils/wait_event.h"

#include "knn_run.h"
#include "knn_settings.h"

/* How long the backend waits for the job between looks at its flags. */
#define KNN_POLL_MS 5

/* The job this backend is running, if any (for the exit callback). */
static KnnJob *running_job = NULL;
static bool exit_callback_registered = false;

/* Cancels the running job and waits for it; its outcome no longer matters. */
static void
stop_running_job(void)
{
	KnnJob	   *job = running_job;
	char		ignored[8];

	if (job == NULL)
		return;
	running_job = NULL;
	knn_job_cancel(job);
	(void) knn_job_finish(job, NULL, ignored, sizeof(ignored));
}

static void
stop_job_at_exit(int code, Datum arg)
{
	stop_running_job();
}

/* Waits for the job, answering interrupts; returns when it has finished. */
static void
wait_for_job(KnnJob *job)
{
	while (!knn_job_wait(job, KNN_POLL_MS))
	{
		if (!PostmasterIsAlive())
		{
			stop_running_job();
			ereport(FATAL,
					(errcode(ERRCODE_ADMIN_SHUTDOWN),
					 errmsg("terminating connection due to unexpected postmaster exit")));
		}
		if (InterruptPending)
		{
			/* A cancel or a termination would raise: stop the job first. */
			if (QueryCancelPending || ProcDiePending)
				stop_running_job();
			CHECK_FOR_INTERRUPTS();
			if (running_job == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_QUERY_CANCELED),
						 errmsg("canceling KNN join due to user request")));
		}
	}
}

static void
raise_for_status(KnnStatus status, const char *message)
{
	switch (status)
	{
		case KNN_OK:
			break;
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
		default:
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("internal error in KNN join: %s", message)));
			break;
	}
}

void
knn_run_problem(KnnProblem *problem, int64 *neighbors, double *distances, KnnStats *stats)
{
	char		message[1024] = "";
	KnnJob	   *job;
	KnnStatus	status;

	problem->device = (KnnDevice) knn_gpu_device;
	problem->gpu_memory_limit = (int64_t) knn_gpu_memory_limit_mb * 1024 * 1024;
	problem->n_threads = knn_gpu_threads;
	problem->fault = (KnnFault) knn_gpu_fault_injection;

	if (!exit_callback_registered)
	{
		before_shmem_exit(stop_job_at_exit, (Datum) 0);
		exit_callback_registered = true;
	}

	job = knn_job_start(problem, neighbors, distances, message, sizeof(message));
	if (job == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not start the KNN join: %s", message)));
	running_job = job;
	/* pg_stat_activity shows the wait: wait_event_type "Extension". */
	pgstat_report_wait_start(PG_WAIT_EXTENSION);
	PG_TRY();
	{
		wait_for_job(job);
	}
	PG_CATCH();
	{
		pgstat_report_wait_end();
		stop_running_job();
		PG_RE_THROW();
	}
	PG_END_TRY();
	pgstat_report_wait_end();

	running_job = NULL;
	status = knn_job_finish(job, stats, message, sizeof(message));
	raise_for_status(status, message);
	if (message[0] != '\0')
		ereport(NOTICE, (errmsg("%s", message)));
}
