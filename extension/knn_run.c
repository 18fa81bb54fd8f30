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
 *
 * Admission: a job that is about to run on the GPU asks for one of the
 * server's knn_gpu.max_gpu_jobs slots (knn_admission.c) and waits; this
 * thread then waits for a slot in the same way (5 ms polls, any interrupt
 * stops the job first), hands the join its share of the GPU memory budget,
 * and gives the slot back once the engine has finished, on every path.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "portability/instr_time.h"
#include "storage/latch.h"
#include "utils/ps_status.h"
#include "utils/wait_event.h"

#include "knn_admission.h"
#include "knn_gpu_service.h"
#include "knn_run.h"
#include "knn_settings.h"

/* How long the backend waits for the job between looks at its flags. */
#define KNN_POLL_MS 5

/*
 * The wait events: both show as wait_event_type "Extension" in PG15 (which
 * names no extension events); the ids tell them apart for tools that read
 * the raw value, and the process title says "waiting for a GPU slot".
 */
#define KNN_WAIT_ENGINE PG_WAIT_EXTENSION
#define KNN_WAIT_GPU_SLOT (PG_WAIT_EXTENSION | 1)

/* What the last call's admission did (knn_run_last_admission). */
static KnnAdmissionRecord last_admission;

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
	knn_admission_release();
}

static void
exit_for_postmaster_death(void)
{
	stop_running_job();
	ereport(FATAL,
			(errcode(ERRCODE_ADMIN_SHUTDOWN),
			 errmsg("terminating connection due to unexpected postmaster exit")));
}

/* Answers pending interrupts, stopping the job before anything raises. */
static void
answer_interrupts(void)
{
	if (!InterruptPending)
		return;
	/* A cancel or a termination would raise: stop the job first. */
	if (QueryCancelPending || ProcDiePending)
		stop_running_job();
	CHECK_FOR_INTERRUPTS();
	if (running_job == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("canceling KNN join due to user request")));
}

/*
 * The job asked for a GPU slot: takes one, waiting while all are taken
 * (woken by any interrupt through the latch, else every KNN_POLL_MS), then
 * admits the job with its share of the memory budget.
 */
static void
admit_job(KnnJob *job)
{
	instr_time	start;
	instr_time	now;

	INSTR_TIME_SET_CURRENT(start);
	if (!knn_admission_try_acquire())
	{
		const char *volatile old_title = NULL;
		char	   *volatile title = NULL;
		int			len = 0;

		last_admission.queued = true;
		if (update_process_title)
		{
			old_title = get_ps_display(&len);
			title = psprintf("%.*s waiting for a GPU slot", len, old_title);
			old_title = pnstrdup(old_title, len);
			set_ps_display(title);
		}
		/* An error in the wait (a cancel caught by PL/pgSQL) restores it too. */
		PG_TRY();
		{
			do
			{
				int			rc;

				/* WaitLatch reports the event and clears it again on return. */
				rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH,
							   KNN_POLL_MS, KNN_WAIT_GPU_SLOT);
				pgstat_report_wait_start(KNN_WAIT_GPU_SLOT);
				if (rc & WL_LATCH_SET)
					ResetLatch(MyLatch);
				if (rc & WL_POSTMASTER_DEATH)
					exit_for_postmaster_death();
				answer_interrupts();
			} while (!knn_admission_try_acquire());
		}
		PG_FINALLY();
		{
			if (title != NULL)
				set_ps_display(old_title);
		}
		PG_END_TRY();
		if (title != NULL)
		{
			pfree(title);
			pfree((char *) old_title);
		}
		pgstat_report_wait_start(KNN_WAIT_ENGINE);
	}
	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	last_admission.admitted = true;
	last_admission.slot = knn_admission_slot();
	last_admission.max_gpu_jobs = knn_gpu_max_gpu_jobs;
	last_admission.seconds_queued = INSTR_TIME_GET_DOUBLE(now);
	last_admission.gpu_memory_limit = knn_admission_memory_limit();
	knn_job_admit(job, last_admission.gpu_memory_limit);
}

/* Waits for the job, answering interrupts; returns when it has finished. */
static void
wait_for_job(KnnJob *job)
{
	while (!knn_job_wait(job, KNN_POLL_MS))
	{
		if (!PostmasterIsAlive())
			exit_for_postmaster_death();
		answer_interrupts();
		if (!last_admission.admitted && knn_job_wants_slot(job))
			admit_job(job);
	}
}

const KnnAdmissionRecord *
knn_run_last_admission(void)
{
	return &last_admission;
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
			/* the CPU engine's are the server's memory (entry_guard.h names it) */
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("KNN join ran out of memory: %s", message),
					 strncmp(message, "CPU engine:", 11) == 0 ?
					 errhint("Join fewer query rows at once, or lower knn_gpu.max_result_memory (knn_join then runs in batches of queries).") :
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

/*
 * What every job takes from the settings: the device, memory limit,
 * threads and test fault; admission as given (a test mode makes CPU joins
 * ask for slots too). No slot is carried over from the previous join.
 */
static void
prepare_job(KnnProblem *problem, KnnAdmission admission)
{
	knn_admission_release();
	knn_admission_push_gpu_contexts();
	memset(&last_admission, 0, sizeof(last_admission));
	last_admission.slot = -1;

	problem->device = (KnnDevice) knn_gpu_device;
	problem->gpu_memory_limit = (int64_t) knn_gpu_memory_limit_mb * 1024 * 1024;
	problem->n_threads = knn_threads_for_job();
	problem->n_devices = knn_gpu_n_devices;
	memcpy(problem->devices, knn_gpu_device_list, sizeof(problem->devices));
	problem->admission = admission;
	problem->fault = (KnnFault) knn_gpu_fault_injection;
	if (knn_gpu_fault_injection == KNN_GPU_FAULT_ADMIT_CPU)
	{
		problem->fault = KNN_FAULT_NONE;
		if (admission != KNN_ADMISSION_NONE)
			problem->admission = KNN_ADMISSION_ALL;
	}
	/* The GPU service: this job's route, and the service started if needed. */
	knn_gpu_service_prepare(problem);

	if (!exit_callback_registered)
	{
		before_shmem_exit(stop_job_at_exit, (Datum) 0);
		exit_callback_registered = true;
	}
}

/* Starts the job (what: "join" or "range join"); ERROR when not even that worked. */
static KnnJob *
start_job(const KnnProblem *problem, int64 *neighbors, double *distances, const char *what)
{
	char		message[1024] = "";
	KnnJob	   *job = knn_job_start(problem, neighbors, distances, message, sizeof(message));

	if (job == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not start the KNN %s: %s", what, message)));
	running_job = job;
	return job;
}

/* Frees the finished job; ERROR for its failure, NOTICE for its notice. */
static void
finish_job(KnnJob *job, KnnStats *stats)
{
	char		message[1024] = "";
	KnnStatus	status;

	running_job = NULL;
	status = knn_job_finish(job, stats, message, sizeof(message));
	/* The engine has let go of the GPU: the next join may have it. */
	knn_admission_release();
	raise_for_status(status, message);
	if (message[0] != '\0')
		ereport(NOTICE, (errmsg("%s", message)));
}

void
knn_run_problem(KnnProblem *problem, int64 *neighbors, double *distances, KnnStats *stats)
{
	KnnJob	   *job;

	prepare_job(problem, KNN_ADMISSION_GPU);
	job = start_job(problem, neighbors, distances, "join");
	/* pg_stat_activity shows the wait: wait_event_type "Extension". */
	pgstat_report_wait_start(KNN_WAIT_ENGINE);
	PG_TRY();
	{
		wait_for_job(job);
	}
	PG_CATCH();
	{
		pgstat_report_wait_end();
		stop_running_job();
		knn_admission_release();
		PG_RE_THROW();
	}
	PG_END_TRY();
	pgstat_report_wait_end();
	finish_job(job, stats);
}

/* Pairs taken from a range job at a time. */
#define KNN_PAIR_BATCH 8192

void
knn_run_range_problem(KnnProblem *problem, KnnPairSink sink, void *sink_arg, KnnStats *stats)
{
	KnnJob	   *job;
	int64	   *query_rows = palloc(KNN_PAIR_BATCH * sizeof(int64));
	int64	   *target_rows = palloc(KNN_PAIR_BATCH * sizeof(int64));
	double	   *distances = palloc(KNN_PAIR_BATCH * sizeof(double));

	/* A range job on the GPU takes a slot and its share of the budget too. */
	prepare_job(problem, KNN_ADMISSION_GPU);
	job = start_job(problem, NULL, NULL, "range join");
	pgstat_report_wait_start(KNN_WAIT_ENGINE);
	PG_TRY();
	{
		for (;;)
		{
			int64		n = knn_job_take_pairs(job, query_rows, target_rows, distances,
											   KNN_PAIR_BATCH, KNN_POLL_MS);

			if (n < 0)
				break;
			if (n > 0)
			{
				pgstat_report_wait_end();
				sink(sink_arg, query_rows, target_rows, distances, n);
				pgstat_report_wait_start(KNN_WAIT_ENGINE);
			}
			if (!PostmasterIsAlive())
				exit_for_postmaster_death();
			answer_interrupts();
			if (!last_admission.admitted && knn_job_wants_slot(job))
				admit_job(job);
		}
	}
	PG_CATCH();
	{
		pgstat_report_wait_end();
		stop_running_job();
		knn_admission_release();
		PG_RE_THROW();
	}
	PG_END_TRY();
	pgstat_report_wait_end();
	pfree(query_rows);
	pfree(target_rows);
	pfree(distances);
	finish_job(job, stats);
}
