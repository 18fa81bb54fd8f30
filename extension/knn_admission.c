/*
 * knn_admission.c -- admission slots and the probe record's name.
 *
 * Slots: knn_gpu.max_gpu_jobs files pg_stat_tmp/knn_gpu_slot.<i>; a
 * backend holds a slot while it holds an exclusive flock(2) on one of them.
 * The kernel drops the lock when the descriptor is closed, so a backend
 * that crashes or is killed never leaks a slot, and no shared memory (no
 * shared_preload_libraries) is needed. The descriptor is opened O_CLOEXEC,
 * so a program the backend starts (archive_command, COPY PROGRAM) does not
 * inherit the lock. pg_stat_tmp is the directory PostgreSQL keeps for such
 * transient files (pg_stat_statements' query texts); base backups skip it.
 *
 * Waiting for a slot (polling, cancel, the wait event) is knn_run.c's.
 *
 * GPU context permits (knn_gpu.max_gpu_contexts) are files of the same
 * directory, pg_stat_tmp/knn_gpu_context.<i>, locked the same way but by
 * the engine itself (kernels/gpu_context_permit.h): a backend holds one
 * from before it creates its GPU context until it releases it.
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "miscadmin.h"
#include "storage/fd.h"

#include "knn_admission.h"
#include "knn_engine.h"
#include "knn_settings.h"

#define KNN_TRANSIENT_DIR "pg_stat_tmp"

static int	held_fd = -1;
static int	held_slot = -1;

void
knn_admission_setup_probe_record(void)
{
	char		pid_path[MAXPGPATH];
	char		record_path[MAXPGPATH];
	char		key[128];
	char		buf[512];
	char	   *line3;
	char	   *end;
	long		pid;
	long		started;
	ssize_t		n;
	int			fd;

	if (DataDir == NULL)
		return;
	/*
	 * The server run: the postmaster's pid and start time, lines 1 and 3 of
	 * postmaster.pid, written before any library is loaded and rewritten at
	 * every start. Read the same way in the postmaster (preload) and in
	 * backends, so every process of one run agrees.
	 */
	snprintf(pid_path, sizeof(pid_path), "%s/postmaster.pid", DataDir);
	fd = open(pid_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	pid = strtol(buf, &end, 10);
	if (end == buf || *end != '\n' || pid == 0)
		return;
	line3 = strchr(end + 1, '\n');	/* end of line 2, the data directory */
	if (line3 == NULL)
		return;
	started = strtol(line3 + 1, &end, 10);
	if (end == line3 + 1 || *end != '\n' || started <= 0)
		return;
	snprintf(key, sizeof(key), "postmaster %ld started %ld", pid, started);
	snprintf(record_path, sizeof(record_path), "%s/%s/knn_gpu_probe", DataDir, KNN_TRANSIENT_DIR);
	knn_engine_set_probe_record(record_path, key);
}

void
knn_admission_push_gpu_contexts(void)
{
	static char dir[MAXPGPATH] = "";

	if (dir[0] == '\0' && DataDir != NULL)
	{
		struct stat st;

		snprintf(dir, sizeof(dir), "%s/%s", DataDir, KNN_TRANSIENT_DIR);
		/* initdb makes pg_stat_tmp; should it be gone, make it again. */
		if (stat(dir, &st) != 0 && errno == ENOENT)
			(void) MakePGDirectory(dir);
	}
	knn_engine_set_gpu_contexts(dir, knn_gpu_max_gpu_contexts);
}

/* Takes slot i when free: true and held_fd set; false when taken. */
static bool
try_slot(int i)
{
	char		path[MAXPGPATH];
	struct stat st;
	int			fd;
	int			save_errno;

	snprintf(path, sizeof(path), "%s/knn_gpu_slot.%d", KNN_TRANSIENT_DIR, i);
	/* Counted among the backend's descriptors, as PostgreSQL asks. */
	if (!AcquireExternalFD())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("could not open GPU slot file \"%s\": too many open files", path)));
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, S_IRUSR | S_IWUSR);
	if (fd < 0 && errno == ENOENT)
	{
		/* initdb makes pg_stat_tmp; should it be gone, make it again. */
		(void) MakePGDirectory(KNN_TRANSIENT_DIR);
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, S_IRUSR | S_IWUSR);
	}
	if (fd < 0)
	{
		save_errno = errno;
		ReleaseExternalFD();
		errno = save_errno;
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not open GPU slot file \"%s\": %m", path)));
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		close(fd);
		ReleaseExternalFD();
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("GPU slot file \"%s\" is not a regular file", path)));
	}
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
	{
		held_fd = fd;
		held_slot = i;
		return true;
	}
	save_errno = errno;
	close(fd);
	ReleaseExternalFD();
	if (save_errno == EWOULDBLOCK || save_errno == EINTR)
		return false;
	errno = save_errno;
	ereport(ERROR,
			(errcode_for_file_access(),
			 errmsg("could not lock GPU slot file \"%s\": %m", path)));
	return false;				/* not reached */
}

bool
knn_admission_try_acquire(void)
{
	if (held_fd >= 0)
		return true;
	for (int i = 0; i < knn_gpu_max_gpu_jobs; i++)
		if (try_slot(i))
			return true;
	return false;
}

void
knn_admission_release(void)
{
	if (held_fd < 0)
		return;
	/* close drops the flock: the slot is free for the next backend. */
	(void) close(held_fd);
	ReleaseExternalFD();
	held_fd = -1;
	held_slot = -1;
}

int
knn_admission_slot(void)
{
	return held_slot;
}

int64
knn_admission_memory_limit(void)
{
	int64		own = (int64) knn_gpu_memory_limit_mb * 1024 * 1024;
	int64		share;

	if (knn_gpu_memory_budget_mb <= 0)
		return own;
	share = (int64) knn_gpu_memory_budget_mb * 1024 * 1024 / Max(1, knn_gpu_max_gpu_jobs);
	if (own <= 0)
		return share;
	return Min(own, share);
}
