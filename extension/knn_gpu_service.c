/*
 * knn_gpu_service.c -- the GPU service's process: a background worker
 * started on demand by the first backend that needs it
 * (RegisterDynamicBackgroundWorker; no shared_preload_libraries), which
 * loads the GPU module once, keeps one GPU runtime, and runs the backends'
 * k-NN joins that they send over pg_stat_tmp/knn_gpu_service.sock
 * (kernels/gpu_service.h). One service per server: it holds an exclusive
 * flock on pg_stat_tmp/knn_gpu_service.lock for its life, and a second
 * one started meanwhile leaves. It exits on SIGTERM, when the postmaster
 * dies (WaitLatch's WL_EXIT_ON_PM_DEATH), and when knn_gpu.gpu_service is
 * turned off; a backend whose join it was running reads the end of the
 * socket and ends the join with an error (under device = auto the CPU
 * engine answers, with a notice), and the next join starts a new service.
 *
 * The worker connects to no database; it initializes as a backend of none
 * (as the logical replication launcher does) so that pg_stat_activity
 * shows it (backend_type "knn_gpu service") and pg_terminate_backend
 * reaches it; pg_cancel_backend is ignored.
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "gpu_service.h"
#include "knn_gpu_service.h"
#include "knn_settings.h"

/* Relative to the data directory, every process's working directory. */
#define SERVICE_LOCK "pg_stat_tmp/knn_gpu_service.lock"
#define SERVICE_SOCKET "pg_stat_tmp/knn_gpu_service.sock"

/* A starting service retries its lock this long: a backend's look takes it for an instant. */
#define SERVICE_LOCK_TRIES 20
#define SERVICE_LOCK_RETRY_US 5000

/* The engine's looks (gpu_service_client.h): one owner of "running" and "listening". */
static bool
service_running(void)
{
	return knn_gpu_service_running(SERVICE_LOCK) != 0;
}

static bool
service_listening(void)
{
	return knn_gpu_service_listening(SERVICE_SOCKET, SERVICE_LOCK) != 0;
}

/* The worker this backend registered last (kept across transactions). */
static BackgroundWorkerHandle *registered = NULL;

/*
 * When this backend last found the worker table full (0: never). For a
 * short while after, no service is registered again and, where none runs,
 * device = auto goes to the CPU at once instead of waiting for one.
 */
static TimestampTz table_full_at = 0;
#define TABLE_FULL_MEMORY_MS 1000

static bool
table_recently_full(void)
{
	return table_full_at != 0 &&
		!TimestampDifferenceExceeds(table_full_at, GetCurrentTimestamp(), TABLE_FULL_MEMORY_MS);
}

/*
 * Registers the service's worker unless this backend's last one is still
 * starting or running. False when no worker slot is free
 * (max_worker_processes), said once per backend in the log: many backends
 * that find no service at once each register one (all but one leave at
 * once), so a full table is mostly theirs; the join then waits for the
 * service as if it had started it (device = auto: the CPU engine where
 * none comes).
 */
static bool
start_service(bool cpu_stand_in)
{
	BackgroundWorker worker;
	MemoryContext old;
	bool		ok;

	if (table_recently_full())
		return false;
	if (registered != NULL)
	{
		pid_t		pid;
		BgwHandleStatus status = GetBackgroundWorkerPid(registered, &pid);

		if (status == BGWH_NOT_YET_STARTED || status == BGWH_STARTED)
			return true;
		pfree(registered);
		registered = NULL;
	}
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "knn_gpu");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "knn_gpu_service_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "knn_gpu GPU service");
	snprintf(worker.bgw_type, BGW_MAXLEN, "knn_gpu service");
	worker.bgw_main_arg = Int32GetDatum(cpu_stand_in ? 1 : 0);
	worker.bgw_notify_pid = 0;
	old = MemoryContextSwitchTo(TopMemoryContext);
	ok = RegisterDynamicBackgroundWorker(&worker, &registered);
	MemoryContextSwitchTo(old);
	if (!ok)
	{
		static bool said = false;

		registered = NULL;
		table_full_at = GetCurrentTimestamp();
		ereport(said ? DEBUG1 : LOG,
				(errmsg("could not start the knn_gpu GPU service: no background worker slot free"),
				 errhint("Raise max_worker_processes.")));
		said = true;
	}
	return ok;
}

/* How long a device = gpu join waits for a service to start listening. */
#define SERVICE_START_WAIT_MS 30000
#define SERVICE_POLL_MS 5

/*
 * device = gpu: waits here, on the backend's thread, until a service
 * listens, answering interrupts, and starts one again whenever none holds
 * the lock (a dying service may still hold it when the join began, and a
 * service started meanwhile then leaves). It leaves early when the
 * server's probe record says there is no GPU (a service found none and
 * left: the join then runs as without the service, on the CPU with the
 * usual notice), and with an ERROR when no service runs and none can be
 * started (no background worker slot) for SERVICE_NO_SLOT_WAIT_MS: another
 * backend's service may still come meanwhile. Past the wait the engine
 * says what it finds.
 */
#define SERVICE_NO_SLOT_WAIT_MS 2000

static void
await_service(bool cpu_stand_in)
{
	int			no_slot_ms = 0;

	for (int waited = 0; waited < SERVICE_START_WAIT_MS && !service_listening();
		 waited += SERVICE_POLL_MS)
	{
		if (!cpu_stand_in && knn_engine_gpu_ruled_out())
			return;
		if (service_running())
			no_slot_ms = 0;
		else if (start_service(cpu_stand_in))
			no_slot_ms = 0;
		else if ((no_slot_ms += SERVICE_POLL_MS) >= SERVICE_NO_SLOT_WAIT_MS)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("no knn_gpu GPU service runs, and none could be started: no background worker slot free"),
					 errhint("Raise max_worker_processes, or use knn_gpu.device = auto.")));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 SERVICE_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

void
knn_gpu_service_prepare(KnnProblem *problem)
{
	int32		mode = KNN_GPU_SERVICE_OFF;

	if (knn_gpu_fault_injection == KNN_GPU_FAULT_SERVICE_CPU)
	{
		problem->fault = KNN_FAULT_NONE;
		mode = KNN_GPU_SERVICE_CPU_STAND_IN;
	}
	else if (knn_gpu_service && problem->device != KNN_DEVICE_CPU &&
			 !(problem->device == KNN_DEVICE_AUTO && knn_engine_gpu_ruled_out()))
		mode = KNN_GPU_SERVICE_ON;
	/* Range and per-group joins stay in the backend: no service for them. */
	if (problem->range != KNN_RANGE_NONE || problem->query_groups != NULL ||
		problem->target_groups != NULL)
		mode = KNN_GPU_SERVICE_OFF;
	if (mode != KNN_GPU_SERVICE_OFF && !service_running() &&
		!start_service(mode == KNN_GPU_SERVICE_CPU_STAND_IN) &&
		problem->device == KNN_DEVICE_AUTO)
	{
		/* No service, and none can be started now: the CPU, without waiting for one. */
		problem->device = KNN_DEVICE_CPU;
		mode = KNN_GPU_SERVICE_OFF;
	}
	if (mode != KNN_GPU_SERVICE_OFF && problem->device == KNN_DEVICE_GPU)
		await_service(mode == KNN_GPU_SERVICE_CPU_STAND_IN);
	knn_engine_set_gpu_service(SERVICE_SOCKET, SERVICE_LOCK, mode);
}

bool
knn_gpu_service_rows_wanted(void)
{
	return knn_gpu_fault_injection == KNN_GPU_FAULT_SERVICE_CPU ||
		(knn_gpu_service && knn_gpu_device != KNN_DEVICE_CPU);
}

/* ---- the service's process ---- */

#define STAND_IN_IDLE_MS 60000

static volatile sig_atomic_t terminate_requested = false;
static KnnGpuServiceHandle *service = NULL;

static void
handle_sigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	terminate_requested = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

/* Every exit path (an ERROR, postmaster death) stops the engine's threads first. */
static void
close_service_at_exit(int code, Datum arg)
{
	if (service != NULL)
	{
		knn_gpu_service_close(service);
		service = NULL;
	}
}

void
knn_gpu_service_main(Datum arg)
{
	const bool	cpu_stand_in = DatumGetInt32(arg) != 0;
	char		description[384];
	char		why[512];
	int64		answered = 0;
	TimestampTz last_job_at;
	int			lock_fd;
	int			tries;

	pqsignal(SIGTERM, handle_sigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/*
	 * pg_cancel_backend() cancels a statement, and the service runs none of
	 * its own: a cancel would end it, and every join it runs with it. Joins
	 * are cancelled from their backends.
	 */
	pqsignal(SIGINT, SIG_IGN);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	/* The descriptor stays open, locked, until the process exits. */
	lock_fd = open(SERVICE_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lock_fd < 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not open \"%s\": %m", SERVICE_LOCK)));
	for (tries = 0; flock(lock_fd, LOCK_EX | LOCK_NB) != 0; tries++)
	{
		if (errno != EWOULDBLOCK || tries >= SERVICE_LOCK_TRIES)
			proc_exit(0);		/* another service runs */
		pg_usleep(SERVICE_LOCK_RETRY_US);
	}

	on_proc_exit(close_service_at_exit, (Datum) 0);
	service = knn_gpu_service_open(SERVICE_SOCKET, cpu_stand_in ? 1 : 0,
								   description, sizeof(description), why, sizeof(why));
	if (service == NULL)
	{
		ereport(LOG, (errmsg("knn_gpu GPU service not started: %s", why)));
		proc_exit(0);
	}
	ereport(LOG,
			(errmsg("knn_gpu GPU service listening on %s: %s%s", SERVICE_SOCKET, description,
					cpu_stand_in ? " (CPU stand-in for tests)" : "")));

	last_job_at = GetCurrentTimestamp();
	while (!terminate_requested)
	{

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		/* Barriers (DROP DATABASE waits for every backend to absorb one). */
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);	/* gpu_idle_release reaches the engine */
		}
		if (!knn_gpu_service && !cpu_stand_in)
			break;
		/*
		 * A CPU stand-in was started by a session's fault injection, not by
		 * the server's setting, which it cannot see turned off: it leaves
		 * once no job has ended for STAND_IN_IDLE_MS instead.
		 */
		if (knn_gpu_service_jobs_answered(service) != answered)
		{
			answered = knn_gpu_service_jobs_answered(service);
			last_job_at = GetCurrentTimestamp();
		}
		else if (cpu_stand_in &&
				 TimestampDifferenceExceeds(last_job_at, GetCurrentTimestamp(), STAND_IN_IDLE_MS))
			break;
	}
	ereport(LOG,
			(errmsg("knn_gpu GPU service stopping after %lld joins",
					(long long) knn_gpu_service_jobs_answered(service))));
	knn_gpu_service_close(service);
	service = NULL;
	proc_exit(0);
}

/*
 * Test hooks of the shared row buffer (sql/knn_gpu_service.sql declares
 * them; not part of the extension's SQL API, so only a superuser can):
 * segments live in this backend, jobs it sent in the buffer, and making
 * every later growth of a segment fail.
 */
PG_FUNCTION_INFO_V1(knn_gpu_service_test_rows_live);
Datum
knn_gpu_service_test_rows_live(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(knn_shared_rows_live());
}

PG_FUNCTION_INFO_V1(knn_gpu_service_test_rows_jobs);
Datum
knn_gpu_service_test_rows_jobs(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(knn_shared_rows_jobs());
}

PG_FUNCTION_INFO_V1(knn_gpu_service_test_rows_fail_growth);
Datum
knn_gpu_service_test_rows_fail_growth(PG_FUNCTION_ARGS)
{
	knn_shared_rows_fail_growth(PG_GETARG_BOOL(0) ? 1 : 0);
	PG_RETURN_VOID();
}
