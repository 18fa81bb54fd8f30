/*
 * knn_shard_remote.c -- one shard of a sharded knn_join (knn_shard_remote.h).
 *
 * Connections are postgres_fdw's own: GetConnection() of the user mapping
 * the foreign scan would use, so the shard runs with exactly the rights a
 * plain scan of the foreign table would have (postgres_fdw's password and
 * superuser checks included), inside postgres_fdw's remote transaction: the
 * temporary table is ON COMMIT DROP and created in that transaction (or its
 * savepoint), so an error anywhere rolls it away, and postgres_fdw's abort
 * callback cancels a query still running there. We only add what
 * postgres_fdw has no function for: sending without waiting (all shards
 * work at once) and COPY.
 *
 * The query rows go by binary COPY into a temporary table rather than as
 * an array or VALUES in the statement: COPY streams in slices (memory
 * bounded on both sides, whatever the query set), while one parameter or
 * statement text is a single allocation capped at 1 GB on the shard
 * (1,000,000 x 768 float32 queries are 3 GB), and the binary form needs
 * no float formatting or parsing. The rows are the engine's elements as
 * this server read them (vector for float32, halfvec for float16, varbit
 * for bits), so the shard joins exactly the values this server would.
 *
 * knn_gpu.so does not link libpq: a server that never shards never loads
 * it. The libpq calls go to the very libpq that postgres_fdw loaded
 * (dlopen RTLD_NOLOAD), so the PGconn is handled by one library.
 */
#include "postgres.h"

#include <dlfcn.h>

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "knn_shard_remote.h"
#include "knn_vocabulary.h"

#define POSTGRES_FDW_LIBRARY "$libdir/postgres_fdw"
#define LIBPQ_SONAME "libpq.so.5"

/* Rows per slice of the COPY stream (one buffer, sent to every shard in turn). */
#define SHIP_SLICE_BYTES (1024 * 1024)
/* How often the wait for the shards looks at the other sockets. */
#define COLLECT_POLL_MS 10

/*
 * libpq's stable ABI (libpq-fe.h of soname libpq.so.5), declared here
 * because PGXS puts only the server headers on the include path.
 */
typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;
#define PGRES_COMMAND_OK 1
#define PGRES_TUPLES_OK 2
#define PGRES_COPY_IN 4

static struct
{
	bool		loaded;
	/* postgres_fdw (contrib/postgres_fdw/postgres_fdw.h of PostgreSQL 15) */
	PGconn	   *(*GetConnection) (UserMapping *user, bool will_prep_stmt, void **state);
	PGresult   *(*pgfdw_exec_query) (PGconn *conn, const char *query, void *state);
	PGresult   *(*pgfdw_get_result) (PGconn *conn, const char *query);
	void		(*pgfdw_report_error) (int elevel, PGresult *res, PGconn *conn, bool clear,
									   const char *sql);
	void		(*ReleaseConnection) (PGconn *conn);
	PGFunction	handler;
	/* libpq */
	int			(*PQsendQuery) (PGconn *conn, const char *query);
	int			(*PQsendQueryParams) (PGconn *conn, const char *command, int nParams,
									  const Oid *paramTypes, const char *const *paramValues,
									  const int *paramLengths, const int *paramFormats,
									  int resultFormat);
	PGresult   *(*PQgetResult) (PGconn *conn);
	int			(*PQresultStatus) (const PGresult *res);
	int			(*PQntuples) (const PGresult *res);
	int			(*PQnfields) (const PGresult *res);
	int			(*PQfformat) (const PGresult *res, int field);
	char	   *(*PQgetvalue) (const PGresult *res, int row, int field);
	int			(*PQgetlength) (const PGresult *res, int row, int field);
	int			(*PQgetisnull) (const PGresult *res, int row, int field);
	void		(*PQclear) (PGresult *res);
	int			(*PQputCopyData) (PGconn *conn, const char *buffer, int nbytes);
	int			(*PQputCopyEnd) (PGconn *conn, const char *errormsg);
	int			(*PQflush) (PGconn *conn);
	int			(*PQsetnonblocking) (PGconn *conn, int arg);
	int			(*PQconsumeInput) (PGconn *conn);
	int			(*PQisBusy) (PGconn *conn);
	int			(*PQsocket) (const PGconn *conn);
	char	   *(*PQerrorMessage) (const PGconn *conn);
} fdw;

static void *
fdw_function(const char *name)
{
	return load_external_function(POSTGRES_FDW_LIBRARY, name, true, NULL);
}

static void *
libpq_function(void *handle, const char *name)
{
	void	   *f = dlsym(handle, name);

	if (f == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("knn_join: libpq function %s not found", name)));
	return f;
}

static void
load_functions(void)
{
	void	   *libpq;

	if (fdw.loaded)
		return;
	fdw.GetConnection = fdw_function("GetConnection");
	fdw.pgfdw_exec_query = fdw_function("pgfdw_exec_query");
	fdw.pgfdw_get_result = fdw_function("pgfdw_get_result");
	fdw.pgfdw_report_error = fdw_function("pgfdw_report_error");
	fdw.ReleaseConnection = fdw_function("ReleaseConnection");
	fdw.handler = (PGFunction) fdw_function("postgres_fdw_handler");
	libpq = dlopen(LIBPQ_SONAME, RTLD_NOW | RTLD_NOLOAD);
	if (libpq == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("knn_join: postgres_fdw is loaded without %s", LIBPQ_SONAME)));
	fdw.PQsendQuery = libpq_function(libpq, "PQsendQuery");
	fdw.PQsendQueryParams = libpq_function(libpq, "PQsendQueryParams");
	fdw.PQgetResult = libpq_function(libpq, "PQgetResult");
	fdw.PQresultStatus = libpq_function(libpq, "PQresultStatus");
	fdw.PQntuples = libpq_function(libpq, "PQntuples");
	fdw.PQnfields = libpq_function(libpq, "PQnfields");
	fdw.PQfformat = libpq_function(libpq, "PQfformat");
	fdw.PQgetvalue = libpq_function(libpq, "PQgetvalue");
	fdw.PQgetlength = libpq_function(libpq, "PQgetlength");
	fdw.PQgetisnull = libpq_function(libpq, "PQgetisnull");
	fdw.PQclear = libpq_function(libpq, "PQclear");
	fdw.PQputCopyData = libpq_function(libpq, "PQputCopyData");
	fdw.PQputCopyEnd = libpq_function(libpq, "PQputCopyEnd");
	fdw.PQflush = libpq_function(libpq, "PQflush");
	fdw.PQsetnonblocking = libpq_function(libpq, "PQsetnonblocking");
	fdw.PQconsumeInput = libpq_function(libpq, "PQconsumeInput");
	fdw.PQisBusy = libpq_function(libpq, "PQisBusy");
	fdw.PQsocket = libpq_function(libpq, "PQsocket");
	fdw.PQerrorMessage = libpq_function(libpq, "PQerrorMessage");
	/* dlopen took a reference; the library stays loaded with postgres_fdw */
	dlclose(libpq);
	fdw.loaded = true;
}

bool
knn_shard_is_postgres_fdw(ForeignServer *server)
{
	ForeignDataWrapper *wrapper = GetForeignDataWrapper(server->fdwid);
	FmgrInfo	handler;

	if (!OidIsValid(wrapper->fdwhandler))
		return false;
	/* The same code, whatever the wrapper or its handler function is called. */
	fmgr_info(wrapper->fdwhandler, &handler);
	if (handler.fn_addr == NULL || handler.fn_oid != wrapper->fdwhandler)
		return false;
	load_functions();
	return handler.fn_addr == fdw.handler;
}

/* Every error raised while talking to a shard says which server it was. */
static void
shard_error_context(void *arg)
{
	KnnShardRemote *shard = (KnnShardRemote *) arg;

	errcontext("knn_join on foreign server \"%s\"", shard->server->servername);
}

#define WITH_SHARD_CONTEXT(shard) \
	ErrorContextCallback shard_context = {error_context_stack, shard_error_context, (shard)}; \
	error_context_stack = &shard_context
#define END_SHARD_CONTEXT() (error_context_stack = shard_context.previous)

/* Runs one statement there; ERROR (postgres_fdw's report) unless it succeeds. */
static PGresult *
exec_checked(KnnShardRemote *shard, const char *sql, int expected)
{
	PGresult   *res = fdw.pgfdw_exec_query(shard->conn, sql, shard->conn_state);

	if (fdw.PQresultStatus(res) != expected)
		fdw.pgfdw_report_error(ERROR, res, shard->conn, true, sql);
	return res;
}

/*
 * knn_gpu's schema and version there, and the types the query rows can be
 * shipped as, found by catalog identity: the base type whose input is the
 * C function of knn_gpu or pgvector for that type (the shard runs with
 * search_path = pg_catalog, so format_type qualifies the name).
 */
#define REMOTE_TYPE_SQL(knn_input, pgvector_input) \
	"(SELECT pg_catalog.format_type(t.oid, NULL) FROM pg_catalog.pg_type t" \
	" JOIN pg_catalog.pg_proc p ON p.oid = t.typinput" \
	" JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass" \
	"  AND d.objid = t.oid AND d.deptype = 'e'" \
	" JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid" \
	" WHERE t.typtype = 'b' AND p.prolang = 13" \
	"  AND ((x.extname = 'knn_gpu' AND p.prosrc = '" knn_input "')" \
	"    OR (x.extname = 'vector' AND p.prosrc = '" pgvector_input "'))" \
	" ORDER BY x.extname = 'knn_gpu' DESC LIMIT 1)"

static const char remote_check_sql[] =
	"SELECT pg_catalog.quote_ident(n.nspname), e.extversion, "
	REMOTE_TYPE_SQL("knn_vector_in", "vector_in") ", "
	REMOTE_TYPE_SQL("knn_halfvec_in", "halfvec_in") ", "
	"pg_catalog.to_regprocedure(pg_catalog.quote_ident(n.nspname) || "
	"'.knn_join(text,text,integer,text,boolean,text)') IS NOT NULL "
	"FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace "
	"WHERE e.extname = 'knn_gpu'";

static char *
text_value(PGresult *res, int field)
{
	return fdw.PQgetisnull(res, 0, field) ? NULL : pstrdup(fdw.PQgetvalue(res, 0, field));
}

const char *
knn_shard_remote_open(KnnShardRemote *shard, const char *version, KnnElement element)
{
	PGresult   *res;
	const char *why = NULL;
	char	   *remote_version;
	char	   *vector_type;
	char	   *halfvec_type;
	bool		has_join;

	WITH_SHARD_CONTEXT(shard);
	load_functions();
	shard->conn = fdw.GetConnection(shard->user, false, &shard->conn_state);
	res = exec_checked(shard, remote_check_sql, PGRES_TUPLES_OK);
	if (fdw.PQntuples(res) != 1 || fdw.PQnfields(res) != 5)
	{
		fdw.PQclear(res);
		END_SHARD_CONTEXT();
		return "knn_gpu is not installed there";
	}
	shard->knn_schema = text_value(res, 0);
	remote_version = text_value(res, 1);
	vector_type = text_value(res, 2);
	halfvec_type = text_value(res, 3);
	has_join = strcmp(fdw.PQgetvalue(res, 0, 4), "t") == 0;
	fdw.PQclear(res);

	if (remote_version == NULL || strcmp(remote_version, version) != 0)
		why = psprintf("knn_gpu there is version %s, here %s",
					   remote_version ? remote_version : "?", version);
	else if (!has_join)
		why = "knn_gpu there has no knn_join(text, text, integer, text, boolean, text)";
	else if (element == KNN_ELEMENT_FLOAT32)
		shard->query_type = vector_type;
	else if (element == KNN_ELEMENT_FLOAT16)
		shard->query_type = halfvec_type;
	else
		shard->query_type = pstrdup("pg_catalog.varbit");
	if (why == NULL && shard->query_type == NULL)
		why = psprintf("it has no %s type", element == KNN_ELEMENT_FLOAT16 ? "halfvec" : "vector");
	END_SHARD_CONTEXT();
	return why;
}

/*
 * Waits until the socket can be written (or read: libpq may need to read
 * before it can write), answering interrupts.
 */
static void
wait_socket(KnnShardRemote *shard, int events)
{
	int			rc = WaitLatchOrSocket(MyLatch,
									   WL_LATCH_SET | WL_EXIT_ON_PM_DEATH | events,
									   fdw.PQsocket(shard->conn), -1L, PG_WAIT_EXTENSION);

	if (rc & WL_LATCH_SET)
		ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	if ((rc & WL_SOCKET_READABLE) && !fdw.PQconsumeInput(shard->conn))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, "COPY");
}

/* Queues one slice of the COPY stream without blocking, then sends it all. */
static void
put_copy_data(KnnShardRemote *shard, const char *data, int len)
{
	int			rc;

	while ((rc = fdw.PQputCopyData(shard->conn, data, len)) == 0)
		wait_socket(shard, WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE);
	if (rc < 0)
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, "COPY");
	while ((rc = fdw.PQflush(shard->conn)) == 1)
		wait_socket(shard, WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE);
	if (rc < 0)
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, "COPY");
}

/* Starts COPY FROM STDIN (binary) into a new temporary table. */
static void
start_copy(KnnShardRemote *shard)
{
	static uint32 table_counter = 0;
	char	   *sql;
	PGresult   *res;

	WITH_SHARD_CONTEXT(shard);
	shard->temp_table = psprintf("pg_temp.knn_shard_queries_%d_%u", MyProcPid, ++table_counter);
	sql = psprintf("CREATE TEMPORARY TABLE %s (id pg_catalog.int8, v %s) ON COMMIT DROP",
				   shard->temp_table, shard->query_type);
	fdw.PQclear(exec_checked(shard, sql, PGRES_COMMAND_OK));

	sql = psprintf("COPY %s FROM STDIN (FORMAT binary)", shard->temp_table);
	if (!fdw.PQsendQuery(shard->conn, sql))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	shard->copy_sent = true;
	/* pgfdw_get_result waits for the end of all results, which COPY IN never reaches */
	while (fdw.PQisBusy(shard->conn))
		wait_socket(shard, WL_SOCKET_READABLE);
	res = fdw.PQgetResult(shard->conn);
	if (fdw.PQresultStatus(res) != PGRES_COPY_IN)
	{
		/* read the rest so that the connection is idle again, then report */
		PGresult   *rest;

		shard->copy_sent = false;
		rest = fdw.pgfdw_get_result(shard->conn, sql);
		fdw.PQclear(rest);
		fdw.pgfdw_report_error(ERROR, res, shard->conn, true, sql);
	}
	fdw.PQclear(res);
	shard->copying = true;
	if (fdw.PQsetnonblocking(shard->conn, 1) != 0)
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	END_SHARD_CONTEXT();
}

static void
end_copy(KnnShardRemote *shard)
{
	const char *sql = "COPY";
	PGresult   *res;

	WITH_SHARD_CONTEXT(shard);
	/* put_copy_data left nothing unsent, so this switch cannot fail on a flush */
	if (fdw.PQsetnonblocking(shard->conn, 0) != 0)
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	shard->copy_sent = false;
	shard->copying = false;
	if (fdw.PQputCopyEnd(shard->conn, NULL) != 1)
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	res = fdw.pgfdw_get_result(shard->conn, sql);
	if (fdw.PQresultStatus(res) != PGRES_COMMAND_OK)
		fdw.pgfdw_report_error(ERROR, res, shard->conn, true, sql);
	fdw.PQclear(res);
	END_SHARD_CONTEXT();
}

/*
 * Ends a COPY after an error here (a cancel, a timeout, another shard's
 * failure). postgres_fdw's abort cleanup waits for the shard to answer,
 * and it answers only once it has everything queued so far and the COPY's
 * end: so the end is queued and all of it sent now, ignoring interrupts
 * (we are already handling one) but not for longer than
 * FAIL_COPY_TIMEOUT_MS; the shard then rolls back, table and all.
 */
#define FAIL_COPY_TIMEOUT_MS 10000

static void
fail_copy(KnnShardRemote *shard)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   FAIL_COPY_TIMEOUT_MS);
	bool		ended = false;

	shard->copy_sent = false;
	if (!shard->copying)
	{
		/* COPY was sent but its answer not read: read it (COPY IN, or an error) */
		PGresult   *res;
		int			status;

		while (fdw.PQisBusy(shard->conn) && GetCurrentTimestamp() < deadline)
		{
			(void) WaitLatchOrSocket(NULL, WL_SOCKET_READABLE | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
									 fdw.PQsocket(shard->conn), 100L, PG_WAIT_EXTENSION);
			if (!fdw.PQconsumeInput(shard->conn))
				break;
		}
		if (fdw.PQisBusy(shard->conn))
			return;
		res = fdw.PQgetResult(shard->conn);
		status = fdw.PQresultStatus(res);
		fdw.PQclear(res);
		if (status != PGRES_COPY_IN)
			return;				/* it failed there: postgres_fdw reads the rest */
	}
	shard->copying = false;
	while (GetCurrentTimestamp() < deadline)
	{
		if (!ended)
		{
			int			rc = fdw.PQputCopyEnd(shard->conn, "knn_join failed on the coordinator");

			if (rc < 0)
				break;
			ended = rc == 1;
		}
		if (ended && fdw.PQflush(shard->conn) != 1)
			break;
		(void) WaitLatchOrSocket(NULL, WL_SOCKET_WRITEABLE | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 fdw.PQsocket(shard->conn), 100L, PG_WAIT_EXTENSION);
		if (!ended)
			(void) fdw.PQflush(shard->conn);
	}
	(void) fdw.PQsetnonblocking(shard->conn, 0);
}

/* One row of the binary COPY stream: (int8 id, the vector's binary form). */
static void
encode_row(StringInfo buf, int64 id, const char *row, KnnElement element, int32 dim)
{
	pq_sendint16(buf, 2);
	pq_sendint32(buf, 8);
	pq_sendint64(buf, id);
	switch (element)
	{
		case KNN_ELEMENT_FLOAT32:
			/* vector's send form: int16 dim, int16 unused, float4 each */
			pq_sendint32(buf, 4 + 4 * dim);
			pq_sendint16(buf, dim);
			pq_sendint16(buf, 0);
			for (int32 i = 0; i < dim; i++)
			{
				float4		value;

				memcpy(&value, row + 4 * (Size) i, sizeof(value));
				pq_sendfloat4(buf, value);
			}
			break;
		case KNN_ELEMENT_FLOAT16:
			/* halfvec's: int16 dim, int16 unused, binary16 each */
			pq_sendint32(buf, 4 + 2 * dim);
			pq_sendint16(buf, dim);
			pq_sendint16(buf, 0);
			for (int32 i = 0; i < dim; i++)
			{
				uint16		value;

				memcpy(&value, row + 2 * (Size) i, sizeof(value));
				pq_sendint16(buf, value);
			}
			break;
		case KNN_ELEMENT_BIT:
			/* varbit's: int32 bit length, the bytes (bits past it are zero) */
			pq_sendint32(buf, 4 + (dim + 7) / 8);
			pq_sendint32(buf, dim);
			pq_sendbytes(buf, row, (dim + 7) / 8);
			break;
	}
}

static void
send_to_all(KnnShardRemote **shards, int n_shards, StringInfo buf)
{
	for (int s = 0; s < n_shards; s++)
	{
		WITH_SHARD_CONTEXT(shards[s]);
		put_copy_data(shards[s], buf->data, buf->len);
		END_SHARD_CONTEXT();
	}
	resetStringInfo(buf);
}

void
knn_shard_remote_ship(KnnShardRemote **shards, int n_shards, const KnnMatrix *queries)
{
	static const char signature[11] = "PGCOPY\n\377\r\n\0";
	StringInfoData buf;
	instr_time	start;
	instr_time	now;

	INSTR_TIME_SET_CURRENT(start);
	initStringInfo(&buf);
	PG_TRY();
	{
		for (int s = 0; s < n_shards; s++)
			start_copy(shards[s]);
		pq_sendbytes(&buf, signature, sizeof(signature));
		pq_sendint32(&buf, 0);	/* flags */
		pq_sendint32(&buf, 0);	/* header extension length */
		for (int64 q = 0; q < queries->n; q++)
		{
			encode_row(&buf, queries->ids[q], queries->values + (Size) q * queries->row_bytes,
					   queries->element, queries->dim);
			if (buf.len >= SHIP_SLICE_BYTES)
				send_to_all(shards, n_shards, &buf);
		}
		pq_sendint16(&buf, -1); /* trailer */
		send_to_all(shards, n_shards, &buf);
		for (int s = 0; s < n_shards; s++)
			end_copy(shards[s]);
	}
	PG_CATCH();
	{
		for (int s = 0; s < n_shards; s++)
			if (shards[s]->copy_sent)
				fail_copy(shards[s]);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(buf.data);
	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	for (int s = 0; s < n_shards; s++)
		shards[s]->seconds_ship = INSTR_TIME_GET_DOUBLE(now);
}

void
knn_shard_remote_send(KnnShardRemote *shard, int32 k, KnnMetric metric, bool exclude_self,
					  KnnMethod method)
{
	WITH_SHARD_CONTEXT(shard);
	shard->join_sql =
		psprintf("SELECT query_id, target_id, distance FROM %s.knn_join(%s, %s, %d, %s, %s, %s)",
				 shard->knn_schema,
				 quote_literal_cstr(psprintf("SELECT id, v FROM %s", shard->temp_table)),
				 quote_literal_cstr(shard->targets_sql.data), k,
				 quote_literal_cstr(knn_metric_name(metric)),
				 exclude_self ? "true" : "false",
				 quote_literal_cstr(knn_method_name(method)));
	ereport(DEBUG1,
			(errmsg_internal("knn_join: foreign server \"%s\" joins: %s",
							 shard->server->servername, shard->join_sql)));
	/* binary results: ids and distances arrive exactly, without parsing */
	if (!fdw.PQsendQueryParams(shard->conn, shard->join_sql, 0, NULL, NULL, NULL, NULL, 1))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, shard->join_sql);
	shard->busy = true;
	INSTR_TIME_SET_CURRENT(shard->sent);
	END_SHARD_CONTEXT();
}

/*
 * Waits until no shard is busy, noting when each one's result arrived.
 * One socket is waited on at a time, the others looked at every
 * COLLECT_POLL_MS.
 */
static void
wait_for_shards(KnnShardRemote **shards, int n_shards)
{
	for (;;)
	{
		KnnShardRemote *waiting = NULL;

		for (int s = 0; s < n_shards; s++)
		{
			KnnShardRemote *shard = shards[s];

			if (!shard->busy)
				continue;
			{
				WITH_SHARD_CONTEXT(shard);
				if (!fdw.PQconsumeInput(shard->conn))
					fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, shard->join_sql);
				END_SHARD_CONTEXT();
			}
			if (!fdw.PQisBusy(shard->conn))
			{
				instr_time	now;

				INSTR_TIME_SET_CURRENT(now);
				INSTR_TIME_SUBTRACT(now, shard->sent);
				shard->seconds_join = INSTR_TIME_GET_DOUBLE(now);
				shard->busy = false;
			}
			else if (waiting == NULL)
				waiting = shard;
		}
		if (waiting == NULL)
			return;
		{
			int			rc = WaitLatchOrSocket(MyLatch,
											   WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
											   WL_SOCKET_READABLE | WL_TIMEOUT,
											   fdw.PQsocket(waiting->conn), COLLECT_POLL_MS,
											   PG_WAIT_EXTENSION);

			if (rc & WL_LATCH_SET)
				ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}
}

static int64
get_int8(const char *p)
{
	uint64		v;

	memcpy(&v, p, sizeof(v));
	return (int64) pg_ntoh64(v);
}

static double
get_float8(const char *p)
{
	uint64		v = (uint64) get_int8(p);
	double		d;

	memcpy(&d, &v, sizeof(d));
	return d;
}

/* The row of query id `id` among the sorted, unique ids; -1 if none. */
static int64
query_row(const int64 *ids, int64 n, int64 id)
{
	int64		lo = 0;
	int64		hi = n;

	while (lo < hi)
	{
		int64		mid = lo + (hi - lo) / 2;

		if (ids[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && ids[lo] == id ? lo : -1;
}

/*
 * Reads a join's result: three binary non-null 8-byte columns per row, a
 * query id we sent. Anything else is an error (the result is cleared
 * first: it is libpq's memory, not ours).
 */
static void
read_result(KnnShardRemote *shard, PGresult *res, const int64 *query_ids, int64 n_queries)
{
	int			n = fdw.PQntuples(res);
	KnnShardLists *lists = &shard->lists;
	int64	   *rows = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
	int64	   *fill;
	const char *bad = NULL;

	if (fdw.PQnfields(res) != 3)
		bad = "not three columns";
	for (int f = 0; bad == NULL && f < 3; f++)
		if (fdw.PQfformat(res, f) != 1)
			bad = "not in binary";
	for (int r = 0; bad == NULL && r < n; r++)
	{
		for (int f = 0; f < 3; f++)
			if (fdw.PQgetisnull(res, r, f) || fdw.PQgetlength(res, r, f) != 8)
				bad = "a NULL or a value of the wrong size";
		if (bad == NULL &&
			(rows[r] = query_row(query_ids, n_queries, get_int8(fdw.PQgetvalue(res, r, 0)))) < 0)
			bad = "a query id that was not sent";
	}
	if (bad != NULL)
	{
		fdw.PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
				 errmsg("knn_join on foreign server \"%s\" returned %s",
						shard->server->servername, bad)));
	}

	lists->n_queries = n_queries;
	lists->offsets = palloc_extended((n_queries + 1) * sizeof(int64), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	lists->target_ids = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
	lists->distances = palloc_extended(Max(n, 1) * sizeof(double), MCXT_ALLOC_HUGE);
	for (int r = 0; r < n; r++)
		lists->offsets[rows[r] + 1]++;
	for (int64 q = 0; q < n_queries; q++)
		lists->offsets[q + 1] += lists->offsets[q];
	fill = palloc_extended(Max(n_queries, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
	memcpy(fill, lists->offsets, n_queries * sizeof(int64));
	for (int r = 0; r < n; r++)
	{
		int64		at = fill[rows[r]]++;

		lists->target_ids[at] = get_int8(fdw.PQgetvalue(res, r, 1));
		lists->distances[at] = get_float8(fdw.PQgetvalue(res, r, 2));
	}
	fdw.PQclear(res);
	pfree(fill);
	pfree(rows);
}

void
knn_shard_remote_collect(KnnShardRemote **shards, int n_shards, const int64 *query_ids,
						 int64 n_queries)
{
	wait_for_shards(shards, n_shards);
	for (int s = 0; s < n_shards; s++)
	{
		KnnShardRemote *shard = shards[s];
		PGresult   *res;

		WITH_SHARD_CONTEXT(shard);
		res = fdw.pgfdw_get_result(shard->conn, shard->join_sql);
		if (fdw.PQresultStatus(res) != PGRES_TUPLES_OK)
			fdw.pgfdw_report_error(ERROR, res, shard->conn, true, shard->join_sql);
		read_result(shard, res, query_ids, n_queries);
		END_SHARD_CONTEXT();
	}
	/* ON COMMIT DROP covers errors; a long transaction should not keep them */
	for (int s = 0; s < n_shards; s++)
	{
		KnnShardRemote *shard = shards[s];
		PGresult   *res;

		WITH_SHARD_CONTEXT(shard);
		fdw.PQclear(exec_checked(shard, psprintf("DROP TABLE %s", shard->temp_table),
								 PGRES_COMMAND_OK));
		/* the shard's own record of its join: its engine's phases */
		res = exec_checked(shard, psprintf("SELECT %s.knn_gpu_last_stats()", shard->knn_schema),
						   PGRES_TUPLES_OK);
		if (fdw.PQntuples(res) == 1 && fdw.PQnfields(res) == 1 && !fdw.PQgetisnull(res, 0, 0))
			shard->remote_stats = pstrdup(fdw.PQgetvalue(res, 0, 0));
		fdw.PQclear(res);
		shard->temp_table = NULL;
		fdw.ReleaseConnection(shard->conn);
		END_SHARD_CONTEXT();
	}
}
