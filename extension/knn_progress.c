/*
 * knn_progress.c -- per-backend progress files (knn_progress.h) and
 * knn_gpu_progress_rows(), which reads them.
 *
 * The record has a change counter at both ends: a reader that sees two
 * different values read it while it was being rewritten, and reads again.
 */
#include "postgres.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "knn_progress.h"
#include "knn_role_visibility.h"

#define KNN_PROGRESS_DIR "pg_stat_tmp"
#define KNN_PROGRESS_PREFIX "knn_gpu_progress."
#define KNN_PROGRESS_MAGIC 0x4b4e5031	/* "KNP1" */
/* Least time between two writes that only count rows. */
#define KNN_PROGRESS_INTERVAL_MS 100
/* Rows counted between two looks at the clock. */
#define KNN_PROGRESS_CLOCK_ROWS 256

typedef struct KnnProgressRecord
{
	uint32		magic;
	uint32		changes;		/* bumped at each write */
	int32		pid;
	int32		phase;			/* KnnProgressPhase; IDLE: no join */
	int32		k;
	char		source[24];
	TimestampTz backend_start;
	TimestampTz query_start;	/* the statement's, as pg_stat_activity's */
	TimestampTz join_start;
	TimestampTz phase_start;
	int64		queries_read;
	int64		targets_read;
	int64		n_queries;		/* -1 until known */
	int64		n_targets;
	int64		rows_total;
	int64		rows_returned;
	int64		distance_computations;	/* -1 until the engine has finished */
	uint32		changes_again;	/* == changes when the record is whole */
} KnnProgressRecord;

static KnnProgressRecord current;
static int	progress_fd = -1;
static char progress_path[MAXPGPATH];
static TimestampTz last_write;
static int	rows_since_clock;

/*
 * Joins begun while this backend's row was a running join of the same
 * statement (a knn_join inside another's query text, a KNN Join node
 * there): the row stays the outermost join's, and theirs are not shown.
 */
static int	nested_joins;

/*
 * What each open subtransaction began with: its abort restores it, since a
 * join that an ERROR ends (a KNN Join node, a stream) may not reach its
 * end (a caught ERROR would otherwise leave a running row, or a nested
 * count, for the rest of the statement).
 */
typedef struct SubtransactionState
{
	SubTransactionId subxact;
	int			nested_joins;
	uint64		running;		/* the running row's join (running_join), or 0 */
} SubtransactionState;

static SubtransactionState *subtransactions;
static int	n_subtransactions;
static int	subtransactions_room;

/* Numbers the joins that own the row (begun, not nested): which one runs. */
static uint64 joins_begun;
static uint64 running_join;

static const char *const phase_names[] = {
	"idle", "reading queries", "reading targets", "sorting", "engine running", "returning rows"
};

static void
remove_file_at_exit(int code, Datum arg)
{
	if (progress_fd >= 0)
	{
		close(progress_fd);
		progress_fd = -1;
		unlink(progress_path);
	}
}

/* Writes the record; progress is best effort, so a failure is only logged. */
static void
write_record(void)
{
	current.changes++;
	current.changes_again = current.changes;
	last_write = GetCurrentTimestamp();
	rows_since_clock = 0;
	if (progress_fd < 0)
		return;
	if (pwrite(progress_fd, &current, sizeof(current), 0) != sizeof(current))
		ereport(DEBUG1,
				(errcode_for_file_access(),
				 errmsg("could not write \"%s\": %m", progress_path)));
}

static void
open_file(void)
{
	if (progress_fd >= 0 || DataDir == NULL)
		return;
	snprintf(progress_path, sizeof(progress_path), "%s/%s/%s%d", DataDir, KNN_PROGRESS_DIR,
			 KNN_PROGRESS_PREFIX, MyProcPid);
	/*
	 * A shared lock for the backend's life tells readers the file is in use;
	 * a reader that removed a dead backend's file of this name while we
	 * opened it leaves our descriptor on the removed file: open again.
	 */
	for (int attempt = 0; attempt < 10; attempt++)
	{
		struct stat opened;
		struct stat named;

		progress_fd = open(progress_path, O_RDWR | O_CREAT | O_CLOEXEC, S_IRUSR | S_IWUSR);
		if (progress_fd < 0)
			break;
		if (flock(progress_fd, LOCK_SH) == 0 && fstat(progress_fd, &opened) == 0 &&
			stat(progress_path, &named) == 0 &&
			opened.st_dev == named.st_dev && opened.st_ino == named.st_ino)
		{
			on_proc_exit(remove_file_at_exit, (Datum) 0);
			return;
		}
		close(progress_fd);
		progress_fd = -1;
	}
	ereport(DEBUG1,
			(errcode_for_file_access(),
			 errmsg("could not open \"%s\": %m", progress_path)));
}

/*
 * Removes a dead backend's file, unless a live backend holds it: one that
 * reused the pid and opened the file since (it holds a shared lock).
 */
static void
remove_dead_file(const char *path)
{
	int			fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		(void) unlink(path);
	close(fd);
}

/* The row goes idle (an ERROR's abort: see subtransactions). */
static void
end_running_row(void)
{
	nested_joins = 0;
	if (current.phase == KNN_PROGRESS_IDLE)
		return;
	current.phase = KNN_PROGRESS_IDLE;
	write_record();
}

static void
progress_subtransaction_event(SubXactEvent event, SubTransactionId subxact,
							  SubTransactionId parent, void *arg)
{
	if (event == SUBXACT_EVENT_START_SUB)
	{
		if (n_subtransactions == subtransactions_room)
		{
			int			room = Max(16, 2 * subtransactions_room);

			subtransactions = subtransactions == NULL ?
				MemoryContextAlloc(TopMemoryContext, room * sizeof(SubtransactionState)) :
				repalloc(subtransactions, room * sizeof(SubtransactionState));
			subtransactions_room = room;
		}
		subtransactions[n_subtransactions].subxact = subxact;
		subtransactions[n_subtransactions].nested_joins = nested_joins;
		subtransactions[n_subtransactions].running =
			current.phase != KNN_PROGRESS_IDLE ? running_join : 0;
		n_subtransactions++;
		return;
	}
	if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB)
		return;
	/* innermost first: the ones above it are gone with it */
	for (int i = n_subtransactions - 1; i >= 0; i--)
	{
		if (subtransactions[i].subxact != subxact)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			/* a row begun (or taken over) inside it goes with it */
			if (current.phase != KNN_PROGRESS_IDLE &&
				running_join != subtransactions[i].running)
				end_running_row();
			nested_joins = subtransactions[i].nested_joins;
		}
		n_subtransactions = i;
		return;
	}
	/*
	 * Not recorded: it began before this library was loaded (or its entry
	 * could not be made), so no join ran when it began.
	 */
	if (event == SUBXACT_EVENT_ABORT_SUB)
		end_running_row();
}

static void
progress_transaction_event(XactEvent event, void *arg)
{
	if (event != XACT_EVENT_ABORT && event != XACT_EVENT_COMMIT &&
		event != XACT_EVENT_PREPARE)
		return;
	n_subtransactions = 0;
	end_running_row();
}

void
knn_progress_init(void)
{
	RegisterXactCallback(progress_transaction_event, NULL);
	RegisterSubXactCallback(progress_subtransaction_event, NULL);
}

void
knn_progress_begin(const char *source, int32 k)
{
	TimestampTz now;

	/*
	 * Nested in the running join of this statement; a running row of an
	 * earlier statement is stale (its join ended in an ERROR, as did any
	 * nested in it) and is replaced.
	 */
	if (current.phase != KNN_PROGRESS_IDLE &&
		current.query_start == GetCurrentStatementStartTimestamp())
	{
		nested_joins++;
		return;
	}
	nested_joins = 0;
	running_join = ++joins_begun;
	now = GetCurrentTimestamp();
	open_file();
	current.magic = KNN_PROGRESS_MAGIC;
	current.pid = MyProcPid;
	current.k = k;
	strlcpy(current.source, source, sizeof(current.source));
	current.backend_start = MyStartTimestamp;
	current.query_start = GetCurrentStatementStartTimestamp();
	current.join_start = now;
	current.phase_start = now;
	current.phase = KNN_PROGRESS_READING_QUERIES;
	current.queries_read = 0;
	current.targets_read = 0;
	current.n_queries = -1;
	current.n_targets = -1;
	current.rows_total = -1;
	current.rows_returned = 0;
	current.distance_computations = -1;
	write_record();
}

void
knn_progress_k(int32 k)
{
	if (current.phase == KNN_PROGRESS_IDLE || nested_joins > 0 || current.k == k)
		return;
	current.k = k;
	write_record();
}

void
knn_progress_phase(KnnProgressPhase phase)
{
	if (current.phase == KNN_PROGRESS_IDLE || nested_joins > 0 || current.phase == (int32) phase)
		return;
	current.phase = phase;
	current.phase_start = GetCurrentTimestamp();
	write_record();
}

void
knn_progress_rows(int64 n)
{
	if (nested_joins > 0)
		return;
	switch (current.phase)
	{
		case KNN_PROGRESS_READING_QUERIES:
			current.queries_read += n;
			break;
		case KNN_PROGRESS_READING_TARGETS:
			current.targets_read += n;
			break;
		case KNN_PROGRESS_RETURNING:
			current.rows_returned += n;
			break;
		default:
			return;
	}
	rows_since_clock += n;
	if (rows_since_clock >= KNN_PROGRESS_CLOCK_ROWS)
	{
		rows_since_clock = 0;
		if (TimestampDifferenceExceeds(last_write, GetCurrentTimestamp(),
									   KNN_PROGRESS_INTERVAL_MS))
			write_record();
	}
}

void
knn_progress_totals(int64 n_queries, int64 n_targets, int64 result_rows)
{
	if (current.phase == KNN_PROGRESS_IDLE || nested_joins > 0)
		return;
	current.n_queries = n_queries;
	current.n_targets = n_targets;
	current.rows_total = result_rows;
	write_record();
}

void
knn_progress_work(int64 distance_computations)
{
	if (current.phase == KNN_PROGRESS_IDLE || nested_joins > 0)
		return;
	current.distance_computations = distance_computations;
}

void
knn_progress_end(void)
{
	if (nested_joins > 0)
	{
		nested_joins--;
		return;
	}
	if (current.phase == KNN_PROGRESS_IDLE)
		return;
	current.phase = KNN_PROGRESS_IDLE;
	write_record();
}

/*
 * Whether no process has this pid: the backend that wrote the file is gone
 * without removing it (killed by SIGKILL, say).
 */
static bool
backend_gone(int32 pid)
{
	return kill(pid, 0) != 0 && errno == ESRCH;
}

/* Reads one file into *record; false if it is not a whole, live join's. */
static bool
read_record(const char *path, int32 pid, KnnProgressRecord *record)
{
	int			fd = open(path, O_RDONLY | O_CLOEXEC);
	bool		whole = false;

	if (fd < 0)
		return false;
	for (int attempt = 0; attempt < 10 && !whole; attempt++)
		whole = pread(fd, record, sizeof(*record), 0) == sizeof(*record) &&
			record->changes == record->changes_again;
	close(fd);
	/* A dead backend's file (it crashed) or another file of that name. */
	return whole && record->magic == KNN_PROGRESS_MAGIC && record->pid == pid &&
		record->phase > KNN_PROGRESS_IDLE && record->phase <= KNN_PROGRESS_RETURNING &&
		(kill(pid, 0) == 0 || errno == EPERM);
}

/*
 * May the caller see backend pid's join? As pg_stat_activity shows a
 * backend's query: by pg_stat_activity's role of it (knn_role_visibility.h).
 */
static bool
may_see_backend(int32 pid)
{
	int			n = pgstat_fetch_stat_numbackends();

	for (int i = 1; i <= n; i++)
	{
		LocalPgBackendStatus *local = pgstat_fetch_stat_local_beentry(i);

		if (local != NULL && local->backendStatus.st_procpid == pid)
			return knn_role_may_see_join_of(local->backendStatus.st_userid);
	}
	return false;
}

static Datum
count_or_null(int64 value, bool *isnull)
{
	*isnull = value < 0;
	return Int64GetDatum(value);
}

PG_FUNCTION_INFO_V1(knn_gpu_progress_rows);
Datum
knn_gpu_progress_rows(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char		dir_path[MAXPGPATH];
	DIR		   *dir;
	struct dirent *entry;

	InitMaterializedSRF(fcinfo, 0);
	snprintf(dir_path, sizeof(dir_path), "%s/%s", DataDir, KNN_PROGRESS_DIR);
	dir = AllocateDir(dir_path);
	while ((entry = ReadDir(dir, dir_path)) != NULL)
	{
		char		path[MAXPGPATH];
		KnnProgressRecord record;
		char	   *end;
		long		pid;
		Datum		values[15];
		bool		nulls[15] = {0};

		if (strncmp(entry->d_name, KNN_PROGRESS_PREFIX, strlen(KNN_PROGRESS_PREFIX)) != 0)
			continue;
		errno = 0;
		pid = strtol(entry->d_name + strlen(KNN_PROGRESS_PREFIX), &end, 10);
		if (*end != '\0' || errno != 0 || pid <= 0 || pid > PG_INT32_MAX)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir_path, entry->d_name);
		if (backend_gone((int32) pid))
		{
			/* nobody else removes it (a later backend of that pid reuses it) */
			remove_dead_file(path);
			continue;
		}
		if (!read_record(path, (int32) pid, &record) || !may_see_backend((int32) pid))
			continue;
		record.source[sizeof(record.source) - 1] = '\0';
		values[0] = Int32GetDatum(record.pid);
		values[1] = TimestampTzGetDatum(record.backend_start);
		values[2] = TimestampTzGetDatum(record.query_start);
		values[3] = CStringGetTextDatum(record.source);
		values[4] = CStringGetTextDatum(phase_names[record.phase]);
		values[5] = TimestampTzGetDatum(record.join_start);
		values[6] = TimestampTzGetDatum(record.phase_start);
		values[7] = Int32GetDatum(record.k);
		values[8] = Int64GetDatum(record.queries_read);
		values[9] = Int64GetDatum(record.targets_read);
		values[10] = count_or_null(record.n_queries, &nulls[10]);
		values[11] = count_or_null(record.n_targets, &nulls[11]);
		values[12] = count_or_null(record.distance_computations, &nulls[12]);
		values[13] = Int64GetDatum(record.rows_returned);
		values[14] = count_or_null(record.rows_total, &nulls[14]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	FreeDir(dir);
	return (Datum) 0;
}
