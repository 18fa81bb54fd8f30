/*
 * knn_shard_remote.c -- one shard of a sharded join (knn_shard_remote.h).
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
 * Where the shard's knn_gpu has knn_shard_receive_queries(), knn_join's
 * (knn_range_join's) query rows go in blocks of binary parameters straight into the shard
 * backend's memory (knn_shard_receive.h), and its join reads no table:
 * neither a heap written and read back nor a statement per row, and the
 * shards read a block while the next is encoded here. Each block is one
 * parameter of SHIP_BLOCK_BYTES, so no message grows with the query set
 * (one parameter or statement text is a single
 * allocation capped at 1 GB on the shard; 1,000,000 x 768 float32 queries
 * are 3 GB), and the binary form needs no float formatting or parsing.
 * Otherwise (an older knn_gpu there, the KNN Join node's rows with their
 * extra columns), they go by binary COPY into a temporary
 * table, streamed in slices for the same reason. The callers choose the
 * columns and encode the rows (knn_shard.c: the engine's elements as this
 * server read them; knn_scan_shard.c: the outer rows' values in their
 * types' send forms), so the shard joins exactly the values this server
 * would.
 *
 * knn_gpu.so does not link libpq: a server that never shards never loads
 * it. The libpq calls go to the very libpq that postgres_fdw loaded
 * (dlopen RTLD_NOLOAD), so the PGconn is handled by one library.
 */
#include "postgres.h"

#include <dlfcn.h>
#include <sys/socket.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "knn_settings.h"
#include "knn_shard_relay.h"
#include "knn_shard_remote.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

#define POSTGRES_FDW_LIBRARY "$libdir/postgres_fdw"
#define LIBPQ_SONAME "libpq.so.5"

/* Rows per slice of the COPY stream (one buffer, sent to every shard in turn). */
#define SHIP_SLICE_BYTES (1024 * 1024)
/*
 * Bytes of rows per block shipped to a shard's memory. Small: libpq keeps a
 * message whole in its output buffer and moves what is left of it to the
 * front after every partial send, so a block costs its size times the
 * sends it takes (measured: 100000 x 768 queries to one shard, 16 MB
 * blocks 1.9 s, 4 MB 1.2 s, 1 MB 0.8-1.0 s, 512 kB 1.0 s); large enough
 * that a call per block costs little.
 */
#define SHIP_BLOCK_BYTES KNN_SHARD_BLOCK_BYTES
/*
 * Query vectors up to the shard's page size less this (varlena bytes; 7000
 * with 8 kB pages) stay in the temporary table's rows (STORAGE PLAIN): a
 * row of them and a few small values fits a heap page, so the shard reads
 * them from the page, with no TOAST table to write while copying and to
 * look up while reading (vector(1536) is 6152 bytes). Larger ones keep
 * their type's storage.
 */
#define PLAIN_ROW_ROOM 1192

/*
 * libpq's stable ABI (libpq-fe.h of soname libpq.so.5), declared here
 * because PGXS puts only the server headers on the include path.
 */
typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;
#define PGRES_COMMAND_OK 1
#define PGRES_TUPLES_OK 2
#define PGRES_COPY_IN 4
#define PGRES_SINGLE_TUPLE 9
#define PGRES_PIPELINE_SYNC 10

struct KnnShardResult
{
	PGresult   *res;
	double		bytes;			/* libpq's memory of it (estimate_result_bytes) */
	bool		kept;			/* the reader keeps it (knn_shard_result_keep): not freed */
};

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
	int			(*PQsendPrepare) (PGconn *conn, const char *stmtName, const char *query,
								  int nParams, const Oid *paramTypes);
	int			(*PQsendQueryPrepared) (PGconn *conn, const char *stmtName, int nParams,
										const char *const *paramValues, const int *paramLengths,
										const int *paramFormats, int resultFormat);
	PGresult   *(*PQgetResult) (PGconn *conn);
	int			(*PQsetSingleRowMode) (PGconn *conn);
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
	/* pipeline mode: libpq 14 and later (NULL without it: one block in flight) */
	int			(*PQenterPipelineMode) (PGconn *conn);
	int			(*PQexitPipelineMode) (PGconn *conn);
	int			(*PQpipelineSync) (PGconn *conn);
	int			(*PQsendFlushRequest) (PGconn *conn);
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
	fdw.PQsendPrepare = libpq_function(libpq, "PQsendPrepare");
	fdw.PQsendQueryPrepared = libpq_function(libpq, "PQsendQueryPrepared");
	fdw.PQgetResult = libpq_function(libpq, "PQgetResult");
	fdw.PQsetSingleRowMode = libpq_function(libpq, "PQsetSingleRowMode");
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
	fdw.PQenterPipelineMode = dlsym(libpq, "PQenterPipelineMode");
	fdw.PQexitPipelineMode = dlsym(libpq, "PQexitPipelineMode");
	fdw.PQpipelineSync = dlsym(libpq, "PQpipelineSync");
	fdw.PQsendFlushRequest = dlsym(libpq, "PQsendFlushRequest");
	if (!fdw.PQexitPipelineMode || !fdw.PQpipelineSync || !fdw.PQsendFlushRequest)
		fdw.PQenterPipelineMode = NULL;
	/* dlopen took a reference; the library stays loaded with postgres_fdw */
	dlclose(libpq);
	fdw.loaded = true;
}

/*
 * Is postgres_fdw's library in this process? Where the wrapper's handler
 * is postgres_fdw's, looking it up (fmgr_info) has loaded it; where it is
 * not, and nothing else loaded it, postgres_fdw need not be installed at
 * all, and is not loaded for nothing.
 */
static bool
postgres_fdw_library_loaded(void)
{
	char		path[MAXPGPATH];
	void	   *handle;

	snprintf(path, sizeof(path), "%s/postgres_fdw%s", pkglib_path, DLSUFFIX);
	handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (handle == NULL)
		return false;
	dlclose(handle);			/* (the reference NOLOAD took) */
	return true;
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
	if (!fdw.loaded && !postgres_fdw_library_loaded())
		return false;
	load_functions();
	return handler.fn_addr == fdw.handler;
}

void
knn_shard_error_context(void *arg)
{
	KnnShardRemote *shard = (KnnShardRemote *) arg;

	errcontext("%s on foreign server \"%s\"", shard->who ? shard->who : "knn_join",
			   shard->server->servername);
}

#define WITH_SHARD_CONTEXT(shard) \
	ErrorContextCallback shard_context = {error_context_stack, knn_shard_error_context, (shard)}; \
	error_context_stack = &shard_context
#define END_SHARD_CONTEXT() (error_context_stack = shard_context.previous)

/* Runs one statement there; ERROR (postgres_fdw's report) unless it succeeds. */
static PGresult *
exec_checked(KnnShardRemote *shard, const char *sql, int expected)
{
	PGresult   *res;

	shard->round_trips++;
	res = fdw.pgfdw_exec_query(shard->conn, sql, shard->conn_state);

	if (fdw.PQresultStatus(res) != expected)
		fdw.pgfdw_report_error(ERROR, res, shard->conn, true, sql);
	return res;
}

/*
 * knn_gpu's schema and version there, and the types the query rows can be
 * shipped as, found by catalog identity: the base type whose input is the
 * C function of knn_gpu or pgvector for that type, of the extension (and
 * version) the caller wants, w (NULL: either, knn_gpu's first; any
 * version). The shard runs with search_path = pg_catalog, so format_type
 * qualifies the name.
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
	"  AND (w.extname IS NULL OR x.extname = w.extname)" \
	"  AND (w.extversion IS NULL OR x.extversion = w.extversion)" \
	" ORDER BY x.extname = 'knn_gpu' DESC LIMIT 1)"

/*
 * Does knn_gpu's function of that signature exist there, and may the
 * mapped user run it? (A function it may not run means the older way: a
 * shard's administrator may have revoked it.)
 */
#define REMOTE_CALLABLE_SQL(signature) \
	"COALESCE(pg_catalog.has_function_privilege(pg_catalog.to_regprocedure(" \
	"pg_catalog.quote_ident(n.nspname) || '." signature "'), 'EXECUTE'), false)"

/* (the caller's fields go between these two) */
#define REMOTE_CHECK_FIELDS 16
static const char remote_check_sql[] =
	"SELECT pg_catalog.quote_ident(n.nspname), e.extversion, "
	REMOTE_TYPE_SQL("knn_vector_in", "vector_in") ", "
	REMOTE_TYPE_SQL("knn_halfvec_in", "halfvec_in") ", "
	"pg_catalog.to_regprocedure(pg_catalog.quote_ident(n.nspname) || "
	"'.knn_join(text,text,integer,text,boolean,text)') IS NOT NULL, "
	REMOTE_CALLABLE_SQL("knn_join_packed(text,text,integer,text,boolean,text)") ", "
	"pg_catalog.current_setting('block_size'), "
	REMOTE_CALLABLE_SQL("knn_shard_receive_queries(bigint,regtype,bytea)") " AND "
	REMOTE_CALLABLE_SQL("knn_join_received_packed(bigint,text,integer,text,boolean,text)") ", "
	REMOTE_CALLABLE_SQL("knn_shard_receive_queries(bigint,regtype,bytea)") " AND "
	REMOTE_CALLABLE_SQL("knn_range_join_received(bigint,text,double precision,text,boolean,integer,boolean,text)") ", "
	REMOTE_CALLABLE_SQL("knn_shard_prefetch_targets(bigint,regtype,text,text)") " AND "
	REMOTE_CALLABLE_SQL("knn_shard_drop_targets(bigint)") ", "
	REMOTE_CALLABLE_SQL("knn_shard_prefetch_self_join(bigint,regtype,text,text)") " AND "
	REMOTE_CALLABLE_SQL("knn_shard_held_target_blocks(bigint)") ", "
	/* the two types' OIDs there: the blocks name their type by OID, in binary */
	"pg_catalog.to_regtype(" REMOTE_TYPE_SQL("knn_vector_in", "vector_in") ")::pg_catalog.oid, "
	"pg_catalog.to_regtype(" REMOTE_TYPE_SQL("knn_halfvec_in", "halfvec_in") ")::pg_catalog.oid, "
	REMOTE_CALLABLE_SQL("knn_join_received_held_packed(bigint,text,integer,text,boolean,text)") ", "
	REMOTE_CALLABLE_SQL("knn_shard_receive_held_rows(bigint,regtype,bytea)") ", "
	REMOTE_CALLABLE_SQL("knn_shard_read_held_blocks(bigint,regtype,text,text,text,text,integer,integer)");
/* (a format: w, the wanted type's extension and version, two literals) */
#define REMOTE_CHECK_FROM \
	" FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace" \
	" CROSS JOIN (VALUES (%s::pg_catalog.name, %s::pg_catalog.text)) w(extname, extversion)" \
	" WHERE e.extname = 'knn_gpu'"

/* A literal of the text, or NULL. */
static char *
literal_or_null(const char *text)
{
	return text != NULL ? quote_literal_cstr(text) : "NULL";
}

static char *
text_value(PGresult *res, int field)
{
	return fdw.PQgetisnull(res, 0, field) ? NULL : pstrdup(fdw.PQgetvalue(res, 0, field));
}

static Oid
remote_oid(const char *text)
{
	return DatumGetObjectId(DirectFunctionCall1(oidin, CStringGetDatum(text)));
}

const char *
knn_shard_remote_open(KnnShardRemote *shard, const char *version, KnnElement element,
					  const char *type_extension, const char *type_version,
					  const char *more_fields, int n_more, char ***more_values)
{
	PGresult   *res;
	char	   *check_sql = psprintf("%s%s" REMOTE_CHECK_FROM, remote_check_sql, more_fields,
									 literal_or_null(type_extension),
									 literal_or_null(type_version));
	const char *why = NULL;
	char	   *remote_version;
	char	   *vector_type;
	char	   *halfvec_type;
	char	   *vector_oid;
	char	   *halfvec_oid;
	bool		has_join;

	WITH_SHARD_CONTEXT(shard);
	load_functions();
	/*
	 * will_prep_stmt: the blocks go through a statement prepared there
	 * (knn_shard_remote_ship_blocks), which postgres_fdw's cleanup after an
	 * error deallocates.
	 */
	shard->conn = fdw.GetConnection(shard->user, true, &shard->conn_state);
	res = exec_checked(shard, check_sql, PGRES_TUPLES_OK);
	pfree(check_sql);
	if (fdw.PQntuples(res) != 1 || fdw.PQnfields(res) != REMOTE_CHECK_FIELDS + n_more)
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
	shard->has_packed_join = strcmp(fdw.PQgetvalue(res, 0, 5), "t") == 0;
	shard->block_size = pg_strtoint32(fdw.PQgetvalue(res, 0, 6));
	shard->has_received_join = strcmp(fdw.PQgetvalue(res, 0, 7), "t") == 0;
	shard->has_received_range_join = strcmp(fdw.PQgetvalue(res, 0, 8), "t") == 0;
	shard->has_prefetch = strcmp(fdw.PQgetvalue(res, 0, 9), "t") == 0;
	shard->has_held_blocks = strcmp(fdw.PQgetvalue(res, 0, 10), "t") == 0;
	vector_oid = text_value(res, 11);
	halfvec_oid = text_value(res, 12);
	shard->has_received_held_join = strcmp(fdw.PQgetvalue(res, 0, 13), "t") == 0;
	shard->has_held_relay = strcmp(fdw.PQgetvalue(res, 0, 14), "t") == 0;
	shard->has_held_stream = strcmp(fdw.PQgetvalue(res, 0, 15), "t") == 0;
	*more_values = palloc(Max(n_more, 1) * sizeof(char *));
	for (int i = 0; i < n_more; i++)
		(*more_values)[i] = text_value(res, REMOTE_CHECK_FIELDS + i);
	shard->rows_shipped = -1;
	fdw.PQclear(res);

	if (remote_version == NULL || strcmp(remote_version, version) != 0)
		why = psprintf("knn_gpu there is version %s, here %s",
					   remote_version ? remote_version : "?", version);
	else if (!has_join)
		why = "knn_gpu there has no knn_join(text, text, integer, text, boolean, text)";
	else if (element == KNN_ELEMENT_FLOAT32)
	{
		shard->query_type = vector_type;
		shard->query_type_oid = vector_oid ? remote_oid(vector_oid) : InvalidOid;
	}
	else if (element == KNN_ELEMENT_FLOAT16)
	{
		shard->query_type = halfvec_type;
		shard->query_type_oid = halfvec_oid ? remote_oid(halfvec_oid) : InvalidOid;
	}
	else
	{
		shard->query_type = pstrdup("pg_catalog.varbit");
		/* a built-in type: the same OID on every server */
		shard->query_type_oid = VARBITOID;
	}
	if (why == NULL && (shard->query_type == NULL || !OidIsValid(shard->query_type_oid)))
		why = psprintf("it has no %s type%s%s%s%s",
					   element == KNN_ELEMENT_FLOAT16 ? "halfvec" : "vector",
					   type_extension ? " of extension " : "",
					   type_extension ? psprintf("\"%s\"", type_extension) : "",
					   type_version ? " version " : "", type_version ? type_version : "");
	END_SHARD_CONTEXT();
	return why;
}

/*
 * The operator there: the same name, the same C function of the same
 * extension at the same version, between two values of the same type (the
 * same extension's type with the same input function, or bit).
 */
char *
knn_shard_remote_operator(KnnShardRemote *shard, const KnnOperatorIdentity *identity,
						  char **operand_type, const char **why)
{
	StringInfoData sql;
	PGresult   *res;
	char	   *schema = NULL;

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "SELECT pg_catalog.quote_ident(n.nspname), pg_catalog.format_type(o.oprleft, NULL)"
					 " FROM pg_catalog.pg_operator o"
					 " JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace"
					 " JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode"
					 " JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass"
					 "  AND d.objid = p.oid AND d.deptype = 'e'"
					 " JOIN pg_catalog.pg_extension x ON x.oid = d.refobjid"
					 " WHERE o.oprname = %s AND o.oprleft = o.oprright AND p.prolang = 13"
					 " AND p.prosrc = %s AND x.extname = %s AND x.extversion = %s AND ",
					 quote_literal_cstr(identity->name), quote_literal_cstr(identity->symbol),
					 quote_literal_cstr(identity->extension),
					 quote_literal_cstr(identity->version));
	if (identity->type_extension == NULL)
		appendStringInfoString(&sql, "o.oprleft = 'pg_catalog.bit'::pg_catalog.regtype");
	else
		appendStringInfo(&sql,
						 "EXISTS (SELECT FROM pg_catalog.pg_type t"
						 " JOIN pg_catalog.pg_proc i ON i.oid = t.typinput"
						 " JOIN pg_catalog.pg_depend td ON td.classid = 'pg_catalog.pg_type'::pg_catalog.regclass"
						 "  AND td.objid = t.oid AND td.deptype = 'e'"
						 " JOIN pg_catalog.pg_extension tx ON tx.oid = td.refobjid"
						 " WHERE t.oid = o.oprleft AND t.typtype = 'b' AND i.prolang = 13"
						 " AND i.prosrc = %s AND tx.extname = %s)",
						 quote_literal_cstr(identity->type_input),
						 quote_literal_cstr(identity->type_extension));
	{
		WITH_SHARD_CONTEXT(shard);
		res = exec_checked(shard, sql.data, PGRES_TUPLES_OK);
		if (fdw.PQntuples(res) == 1 && fdw.PQnfields(res) == 2)
		{
			schema = text_value(res, 0);
			*operand_type = text_value(res, 1);
		}
		fdw.PQclear(res);
		END_SHARD_CONTEXT();
	}
	if (schema == NULL)
		*why = psprintf("it has no operator %s of extension %s %s (%s) for that type",
						identity->name, identity->extension, identity->version,
						identity->symbol);
	return schema;
}

/*
 * postgres_fdw's cleanup after an error in a subtransaction (cancel what
 * runs, ROLLBACK TO SAVEPOINT) covers only connections whose remote
 * subtransaction is that one's: GetConnection opens remote savepoints up to
 * the current level (nothing is sent where they are open already).
 */
void
knn_shard_remote_take_again(KnnShardRemote *shard)
{
	WITH_SHARD_CONTEXT(shard);
	shard->conn = fdw.GetConnection(shard->user, true, &shard->conn_state);
	END_SHARD_CONTEXT();
}

void
knn_shard_remote_release(KnnShardRemote *shard)
{
	if (shard->conn != NULL)
		fdw.ReleaseConnection(shard->conn);
	shard->conn = NULL;
}

/* ---- statements queued together ---- */

/*
 * Ends a connection's pipeline: a sync, its results read up to the sync's
 * (any left by statements an error skipped), then out of pipeline mode. Waits
 * interruptibly, or (after an error) until deadline only. False where that
 * did not come to pass (the connection is left to postgres_fdw's cleanup,
 * which then gives it up). The sync is sent once: a cancel or timeout
 * during the interruptible wait leaves it pending, and the cleanup's call
 * then reads up to it (a second sync would leave the second's result
 * pending, and the connection in pipeline mode).
 */
static bool
leave_pipeline(KnnShardRemote *shard, bool *synced, bool interruptible, TimestampTz deadline)
{
	PGconn	   *conn = shard->conn;

	if (!*synced)
	{
		if (fdw.PQpipelineSync(conn) != 1)
			return false;
		*synced = true;
		if (interruptible && knn_gpu_fault_injection == KNN_GPU_FAULT_SHIP_CANCEL_AT_SYNC)
			ereport(ERROR,
					(errcode(ERRCODE_QUERY_CANCELED),
					 errmsg("canceling statement due to user request"),
					 errdetail("knn_gpu.fault_injection = ship_cancel_at_sync")));
	}
	for (;;)
	{
		int			rc = fdw.PQflush(conn);

		if (rc < 0 || !fdw.PQconsumeInput(conn))
			return false;
		/* two NULLs in a row: nothing more to read now */
		for (int ends = 0; ends < 2 && !fdw.PQisBusy(conn);)
		{
			PGresult   *res = fdw.PQgetResult(conn);
			int			status;

			if (res == NULL)
			{
				ends++;
				continue;
			}
			ends = 0;
			status = fdw.PQresultStatus(res);
			fdw.PQclear(res);
			if (status == PGRES_PIPELINE_SYNC)
				return fdw.PQexitPipelineMode(conn) == 1;
		}
		if (!interruptible && GetCurrentTimestamp() >= deadline)
			return false;
		(void) WaitLatchOrSocket(interruptible ? MyLatch : NULL,
								 (interruptible ? WL_LATCH_SET : 0) | WL_SOCKET_READABLE |
								 (rc == 1 ? WL_SOCKET_WRITEABLE : 0) | WL_TIMEOUT |
								 WL_EXIT_ON_PM_DEATH,
								 fdw.PQsocket(conn), 100L, PG_WAIT_EXTENSION);
		if (interruptible)
		{
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}
}

/*
 * Statements that need none of each other's answers, run on a shard
 * together: each a message of the extended protocol of its own (one
 * statement, its parameters bound: never a string of several), all queued
 * in libpq's pipeline mode with one sync after them and sent before any
 * answer is read, so that they cost one round trip (without pipeline mode,
 * libpq before 14: one after another). Their answers are read in order; the
 * first that failed raises its ERROR as exec_checked would (the shard's
 * message and SQLSTATE, its statement as the remote SQL), the statements
 * after it skipped there, once the connection is out of pipeline mode
 * (postgres_fdw's cleanup after the error runs its statements outside it).
 */
#define BATCH_STATEMENTS 4

typedef struct ShardStatement
{
	const char *sql;
	int			expected;		/* PGRES_COMMAND_OK or PGRES_TUPLES_OK */
	int			n_params;		/* $1 .. $n, as text */
	const Oid  *param_types;
	const char *const *param_values;
	PGresult  **result;			/* its result, the caller's to clear; NULL: cleared here */
} ShardStatement;

typedef struct ShardBatch
{
	ShardStatement statements[BATCH_STATEMENTS];
	int			n;
	bool		pipelined;		/* sent in pipeline mode, the connection not yet out of it */
	bool		synced;			/* ... its sync sent (leave_pipeline) */
} ShardBatch;

static ShardStatement *
batch_add(ShardBatch *batch, const char *sql, int expected, PGresult **result)
{
	ShardStatement *st;

	if (batch->n >= BATCH_STATEMENTS)
		elog(ERROR, "knn_shard_remote: more than %d statements queued together", BATCH_STATEMENTS);
	st = &batch->statements[batch->n++];
	memset(st, 0, sizeof(*st));
	st->sql = sql;
	st->expected = expected;
	st->result = result;
	return st;
}

static void
send_batch_statement(KnnShardRemote *shard, const ShardStatement *st)
{
	if (!fdw.PQsendQueryParams(shard->conn, st->sql, st->n_params, st->param_types,
							   st->param_values, NULL, NULL, 0))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, st->sql);
}

/*
 * Sends the statements and their sync without waiting for their answers
 * (nothing, without pipeline mode: batch_finish runs them one by one).
 * Until batch_finish, nothing else may use the connection, and after an
 * error the caller calls batch_fail.
 */
static void
batch_send(KnnShardRemote *shard, ShardBatch *batch)
{
	if (fdw.PQenterPipelineMode == NULL || batch->n == 0)
		return;
	{
		WITH_SHARD_CONTEXT(shard);
		if (fdw.PQenterPipelineMode(shard->conn) != 1)
			fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, batch->statements[0].sql);
		batch->pipelined = true;
		for (int i = 0; i < batch->n; i++)
			send_batch_statement(shard, &batch->statements[i]);
		/* (in blocking mode the sync sends everything queued) */
		if (fdw.PQpipelineSync(shard->conn) != 1)
			fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false,
								   batch->statements[batch->n - 1].sql);
		batch->synced = true;
		END_SHARD_CONTEXT();
	}
}

/*
 * After an error here (a cancel, a timeout, another shard's failure):
 * reads the batch's answers up to its sync, ignoring interrupts but not
 * for longer than FAIL_BATCH_TIMEOUT_MS (its statements are short), and
 * leaves pipeline mode, so that postgres_fdw's abort cleanup finds the
 * connection as after an exec_checked. No-op where nothing is pending.
 */
#define FAIL_BATCH_TIMEOUT_MS 10000

static void
batch_fail(KnnShardRemote *shard, ShardBatch *batch)
{
	if (!batch->pipelined)
		return;
	batch->pipelined = false;
	(void) leave_pipeline(shard, &batch->synced, false,
						  TimestampTzPlusMilliseconds(GetCurrentTimestamp(), FAIL_BATCH_TIMEOUT_MS));
}

/* Reads the statements' answers (waiting cancellably), one round trip; ERROR at the first failed. */
static void
batch_finish(KnnShardRemote *shard, ShardBatch *batch)
{
	WITH_SHARD_CONTEXT(shard);
	shard->round_trips += batch->pipelined ? 1 : batch->n;
	for (int i = 0; i < batch->n; i++)
	{
		ShardStatement *st = &batch->statements[i];
		PGresult   *res;

		if (!batch->pipelined)
			send_batch_statement(shard, st);
		res = fdw.pgfdw_get_result(shard->conn, st->sql);
		if (fdw.PQresultStatus(res) != st->expected)
		{
			/* the results kept so far go; the rest was skipped there: read up to the sync */
			for (int j = 0; j < i; j++)
				if (batch->statements[j].result != NULL)
				{
					fdw.PQclear(*batch->statements[j].result);
					*batch->statements[j].result = NULL;
				}
			batch_fail(shard, batch);
			fdw.pgfdw_report_error(ERROR, res, shard->conn, true, st->sql);
		}
		if (st->result != NULL)
			*st->result = res;
		else
			fdw.PQclear(res);
	}
	if (batch->pipelined)
	{
		if (!leave_pipeline(shard, &batch->synced, true, 0))
			fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false,
								   batch->statements[batch->n - 1].sql);
		batch->pipelined = false;
	}
	END_SHARD_CONTEXT();
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

void
knn_shard_remote_name_table(KnnShardRemote *shard)
{
	static uint32 table_counter = 0;

	shard->temp_table = psprintf("pg_temp.knn_shard_queries_%d_%u", MyProcPid, ++table_counter);
	shard->received_set = table_counter;
}

/*
 * Queues (batch_send) what comes before COPY: a new temporary table, its
 * vector column PLAIN when the vectors fit a row, and the settings of the
 * shard's join.
 */
static void
send_table_statements(KnnShardRemote *shard, ShardBatch *batch, int64 max_vector_bytes)
{
	batch_add(batch, psprintf("CREATE TEMPORARY TABLE %s (%s) ON COMMIT DROP",
							  shard->temp_table, shard->temp_columns),
			  PGRES_COMMAND_OK, NULL);
	if (shard->vector_column != NULL && max_vector_bytes > 0 &&
		max_vector_bytes <= (int64) shard->block_size - PLAIN_ROW_ROOM)
		batch_add(batch, psprintf("ALTER TABLE %s ALTER COLUMN %s SET STORAGE PLAIN",
								  shard->temp_table, shard->vector_column),
				  PGRES_COMMAND_OK, NULL);

	/*
	 * The shard's join must be exact too: load knn_gpu's library there (its
	 * planner hook plans the node's LATERAL query; a fresh connection has
	 * not loaded it) and make the node win over an approximate index (hnsw,
	 * ivfflat) on the shard's partition, for this remote transaction only.
	 */
	batch_add(batch, psprintf("SELECT %s.knn_gpu_last_stats()", shard->knn_schema),
			  PGRES_TUPLES_OK, NULL);
	batch_add(batch, "SELECT pg_catalog.set_config('knn_gpu.exact_over_index', 'on', true)",
			  PGRES_TUPLES_OK, NULL);
	batch_send(shard, batch);
}

/*
 * Once the table statements are answered, starts COPY FROM STDIN (binary)
 * into the table (COPY cannot be queued in pipeline mode).
 */
static void
start_copy(KnnShardRemote *shard, ShardBatch *batch)
{
	char	   *sql = psprintf("COPY %s FROM STDIN (FORMAT binary)", shard->temp_table);
	PGresult   *res;

	batch_finish(shard, batch);
	shard->table_exists = true;
	{
		WITH_SHARD_CONTEXT(shard);
		if (!fdw.PQsendQuery(shard->conn, sql))
			fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
		shard->copy_sent = true;
		shard->round_trips++;
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
	shard->round_trips++;
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

void
knn_shard_copy_field(StringInfo buf, const char *data, int len)
{
	if (data == NULL)
	{
		pq_sendint32(buf, -1);
		return;
	}
	pq_sendint32(buf, len);
	pq_sendbytes(buf, data, len);
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

/* The shards were shipped to together: each one's shipping took from start to now. */
static void
note_ship_time(KnnShardRemote **shards, int n_shards, instr_time start)
{
	instr_time	now;

	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	for (int s = 0; s < n_shards; s++)
		shards[s]->seconds_ship = INSTR_TIME_GET_DOUBLE(now);
}

void
knn_shard_remote_ship(KnnShardRemote **shards, int n_shards, const KnnShardRows *rows)
{
	static const char signature[11] = "PGCOPY\n\377\r\n\0";
	StringInfoData buf;
	instr_time	start;
	ShardBatch *batches = palloc0(n_shards * sizeof(ShardBatch));

	INSTR_TIME_SET_CURRENT(start);
	initStringInfo(&buf);
	for (int s = 0; s < n_shards; s++)
		shards[s]->round_trips = 0;
	PG_TRY();
	{
		/* every shard's table statements on their way before any answer is read */
		for (int s = 0; s < n_shards; s++)
			send_table_statements(shards[s], &batches[s], rows->max_vector_bytes);
		for (int s = 0; s < n_shards; s++)
			start_copy(shards[s], &batches[s]);
		pq_sendbytes(&buf, signature, sizeof(signature));
		pq_sendint32(&buf, 0);	/* flags */
		pq_sendint32(&buf, 0);	/* header extension length */
		for (int64 r = 0; r < rows->n; r++)
		{
			pq_sendint16(&buf, rows->n_fields);
			rows->encode(rows->arg, r, &buf);
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
		{
			batch_fail(shards[s], &batches[s]);
			if (shards[s]->copy_sent)
				fail_copy(shards[s]);
		}
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(buf.data);
	pfree(batches);
	note_ship_time(shards, n_shards, start);
}

/* ---- shipping in blocks into the shards' memory (knn_shard_receive.h) ---- */

/*
 * Blocks a shard may have unanswered at once: its connection is in libpq's
 * pipeline mode, so the next block travels while the shard reads the one
 * before, rather than after its answer. (Only one block is queued in libpq
 * at a time: libpq moves what is left of its buffer to the front after
 * every partial send.)
 */
#define SHIP_IN_FLIGHT 2

/*
 * Blocks kept encoded for shards that have not sent them yet: each shard
 * gets its next block as soon as it has fewer than SHIP_IN_FLIGHT
 * unanswered, so a fast shard does not wait for a slow one, up to this many
 * blocks ahead of it.
 */
#define SHIP_BLOCKS_AHEAD (SHIP_IN_FLIGHT + 3)

typedef struct ShipBlock
{
	StringInfoData data;
	int64		rows;
	int			origin;			/* the shard whose own rows these are (not sent them), or -1 */
	/* a relayed block (KnnShardRows.relay): its bytes as they came, and its index there, or -1 */
	const char *raw;
	int			raw_length;
	int64		relay_index;
} ShipBlock;

/*
 * The statement each shard runs per block, prepared there once per set:
 * a statement of its own (the unnamed one would be parsed, planned with
 * the block folded into a constant and the plan copied, for every block:
 * three more copies of each block on the shard), named after the set,
 * which is unique per connection, so that no other statement there (of
 * postgres_fdw's, or of another set's, a connection outlives its queries)
 * has the name. Deallocated once the set is shipped; after an error,
 * postgres_fdw's cleanup deallocates it (GetConnection's will_prep_stmt).
 */
typedef struct ShipStatement
{
	char	   *name;
	char	   *sql;
	/* its first two parameters' send forms (int8 set, regtype oid) */
	char		set_send[8];
	char		type_send[4];
} ShipStatement;

/* One shard's progress through the blocks; at most SHIP_IN_FLIGHT in flight (1 without pipeline mode). */
typedef struct ShipProgress
{
	int64		passed;			/* blocks sent, or passed over as its own rows */
	int64		sent;			/* blocks handed to libpq */
	int64		answered;		/* blocks whose answer was read */
	int64		rows_sent;		/* the rows of the blocks sent */
	int64		expected[SHIP_IN_FLIGHT];	/* rows the shard must hold after each block in flight */
	int			from[SHIP_IN_FLIGHT];	/* ... and the shard that sent it, where relayed (else -1) */
	int64		held;			/* rows the shard said it holds, at its last answer */
	bool		unsent_bytes;	/* libpq still holds bytes of them */
	bool		pipelined;		/* the connection is in pipeline mode */
	bool		synced;			/* ... and its closing sync is sent (leave_pipeline) */
	int			old_send_buffer;	/* SO_SNDBUF before widen_send_buffer, or -1 */
} ShipProgress;

/*
 * Hands block `b` to libpq (it keeps a copy) and sends what the socket
 * takes: an execution of the statement prepared there (ship_statement),
 * every parameter in binary.
 */
static void
send_block(KnnShardRemote *shard, ShipProgress *p, const ShipStatement *st, const ShipBlock *b)
{
	static const int formats[3] = {1, 1, 1};
	const char *values[3] = {st->set_send, st->type_send, b->raw ? b->raw : b->data.data};
	int			lengths[3] = {sizeof(st->set_send), sizeof(st->type_send),
	b->raw ? b->raw_length : b->data.len};

	WITH_SHARD_CONTEXT(shard);
	/* in pipeline mode, the flush request makes the shard answer now, not at a sync */
	if (!fdw.PQsendQueryPrepared(shard->conn, st->name, 3, values, lengths, formats, 0) ||
		(p->pipelined && !fdw.PQsendFlushRequest(shard->conn)))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, st->sql);
	END_SHARD_CONTEXT();
	p->rows_sent += b->rows;
	p->expected[p->sent % SHIP_IN_FLIGHT] = p->rows_sent;
	p->from[p->sent % SHIP_IN_FLIGHT] = b->raw ? b->origin : -1;
	p->sent++;
}

/* An error of a shard about rows relayed to it also names the shard they came from. */
static void
relayed_error_context(void *arg)
{
	errcontext("rows sent by foreign server \"%s\", relayed to it unchanged",
			   ((KnnShardRemote *) arg)->server->servername);
}

/*
 * Moves the shard's blocks in flight along: sends what libpq holds of them,
 * reads the oldest one's answer once it is there (the rows the shard holds:
 * all of that block and before). True when an answer was read. origins:
 * the shards relayed blocks came from (KnnShardRows.relay), or NULL.
 */
static bool
advance_block(KnnShardRemote *shard, ShipProgress *p, const char *sql, KnnShardRemote **origins)
{
	PGresult   *res;
	int64		held;
	int			rc;
	ErrorContextCallback relayed;

	WITH_SHARD_CONTEXT(shard);
	if ((rc = fdw.PQflush(shard->conn)) < 0 || !fdw.PQconsumeInput(shard->conn))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	p->unsent_bytes = rc == 1;
	if (p->answered == p->sent || fdw.PQisBusy(shard->conn))
	{
		END_SHARD_CONTEXT();
		return false;
	}
	/* its result is here; the rest (the end of that call's results) follows at once */
	res = fdw.pgfdw_get_result(shard->conn, sql);
	if (fdw.PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (origins != NULL && p->from[p->answered % SHIP_IN_FLIGHT] >= 0)
		{
			relayed.callback = relayed_error_context;
			relayed.arg = origins[p->from[p->answered % SHIP_IN_FLIGHT]];
			relayed.previous = error_context_stack;
			error_context_stack = &relayed;
		}
		fdw.pgfdw_report_error(ERROR, res, shard->conn, true, sql);
	}
	held = fdw.PQntuples(res) == 1 && fdw.PQnfields(res) == 1 && !fdw.PQgetisnull(res, 0, 0) ?
		pg_strtoint64(fdw.PQgetvalue(res, 0, 0)) : -1;
	fdw.PQclear(res);
	if (held != p->expected[p->answered % SHIP_IN_FLIGHT])
		ereport(ERROR,
				(errcode(ERRCODE_FDW_ERROR),
				 errmsg("%s: foreign server \"%s\" holds " INT64_FORMAT " query rows of the " INT64_FORMAT " sent",
						shard->who, shard->server->servername, held,
						p->expected[p->answered % SHIP_IN_FLIGHT])));
	END_SHARD_CONTEXT();
	p->held = held;
	p->answered++;
	return true;
}

/*
 * After an error here, ends the pipeline, sends what is still queued (the rest of a block's
 * message: a shard reading a message does not see a cancel), ignoring
 * interrupts but not past deadline (one for all shards), and makes the
 * connection blocking again: postgres_fdw's abort cleanup then reads the
 * shard's answer, cancels what still runs and rolls back its transaction,
 * the received rows with it. A message still unsent at the deadline (a
 * stalled shard) is left to that cleanup, which gives the connection up.
 */
static void
fail_blocks(KnnShardRemote *shard, ShipProgress *p, TimestampTz deadline)
{
	shard->sending = false;
	if (p->pipelined)
	{
		p->pipelined = false;
		(void) leave_pipeline(shard, &p->synced, false, deadline);
	}
	while (GetCurrentTimestamp() < deadline && fdw.PQflush(shard->conn) == 1)
		(void) WaitLatchOrSocket(NULL, WL_SOCKET_WRITEABLE | WL_SOCKET_READABLE | WL_TIMEOUT |
								 WL_EXIT_ON_PM_DEATH,
								 fdw.PQsocket(shard->conn), 100L, PG_WAIT_EXTENSION);
	(void) fdw.PQsetnonblocking(shard->conn, 0);
}

/*
 * A local shard's socket (Unix-domain) takes a whole block per send once
 * its send buffer holds one: libpq moves what is left of its buffer to the
 * front after every partial send, so a 1 MB block through the default
 * 208 kB buffer cost some 2.5 MB of moves here (perf). Raised for the
 * shipping (as far as net.core.wmem_max lets it), put back after; a TCP
 * socket is left alone (setting its size would end the kernel's own
 * tuning of it). The size before, or -1 where it was not changed.
 */
static int
widen_send_buffer(int sock)
{
	struct sockaddr_storage addr;
	socklen_t	len = sizeof(addr);
	int			old;
	socklen_t	old_len = sizeof(old);
	int			wanted = 2 * SHIP_BLOCK_BYTES;

	if (sock < 0 || getsockname(sock, (struct sockaddr *) &addr, &len) != 0 ||
		addr.ss_family != AF_UNIX ||
		getsockopt(sock, SOL_SOCKET, SO_SNDBUF, &old, &old_len) != 0 || old >= wanted ||
		setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &wanted, sizeof(wanted)) != 0)
		return -1;
	return old;
}

static void
restore_send_buffer(int sock, ShipProgress *p)
{
	/* the kernel doubles what it is given (getsockopt returned the doubled size) */
	int			size = p->old_send_buffer / 2;

	if (p->old_send_buffer >= 0 && sock >= 0)
		(void) setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	p->old_send_buffer = -1;
}

static void
ship_statement_init(KnnShardRemote *shard, ShipStatement *st, bool relay)
{
	uint64		set = pg_hton64((uint64) shard->received_set);
	uint32		type = pg_hton32(shard->query_type_oid);

	st->name = psprintf("knn_gpu_receive_%s_" INT64_FORMAT, relay ? "held" : "queries",
						shard->received_set);
	st->sql = psprintf("SELECT %s.knn_shard_receive_%s($1, $2, $3)", shard->knn_schema,
					   relay ? "held_rows" : "queries");
	memcpy(st->set_send, &set, sizeof(set));
	memcpy(st->type_send, &type, sizeof(type));
}

/* Prepares each shard's statement, all shards at once. */
static void
ship_statement_prepare(KnnShardRemote **shards, int n_shards, ShipStatement *st)
{
	static const Oid types[3] = {INT8OID, REGTYPEOID, BYTEAOID};

	for (int s = 0; s < n_shards; s++)
	{
		WITH_SHARD_CONTEXT(shards[s]);
		if (!fdw.PQsendPrepare(shards[s]->conn, st[s].name, st[s].sql, 3, types))
			fdw.pgfdw_report_error(ERROR, NULL, shards[s]->conn, false, st[s].sql);
		END_SHARD_CONTEXT();
	}
	for (int s = 0; s < n_shards; s++)
	{
		PGresult   *res;

		WITH_SHARD_CONTEXT(shards[s]);
		shards[s]->round_trips++;
		res = fdw.pgfdw_get_result(shards[s]->conn, st[s].sql);
		if (fdw.PQresultStatus(res) != PGRES_COMMAND_OK)
			fdw.pgfdw_report_error(ERROR, res, shards[s]->conn, true, st[s].sql);
		fdw.PQclear(res);
		END_SHARD_CONTEXT();
	}
}

/*
 * A shipment in blocks under way (knn_shard_remote.h): the blocks encoded
 * ahead (a ring shared by the shards), each shard's progress through them.
 * rows->n may grow until the finish (the caller reads on): a block is
 * complete once it holds SHIP_BLOCK_BYTES, or at the finish.
 */
struct KnnShardShipment
{
	KnnShardRemote **shards;
	int			n_shards;
	const KnnShardRows *rows;
	ShipBlock	blocks[SHIP_BLOCKS_AHEAD];
	ShipProgress *progress;
	ShipStatement *st;
	int64		r;				/* rows encoded */
	int64		encoded;		/* blocks complete */
	bool		filling;		/* blocks[encoded % SHIP_BLOCKS_AHEAD] has rows, not yet complete */
	int64		block_start;	/* sh->r when that block began */
	/* rows->origin_end: the next row of each shard's own rows, and whose block is next */
	int64	   *origin_next;
	int			origin_turn;
	/* rows->relay: the blocks in the order they go (knn_shard_relay_order), and the next one */
	int64	   *relay_order;
	int64		relay_next;
	bool		open;			/* started, neither finished nor failed */
	bool		savepoint;		/* the rows went in under a savepoint there (ship_savepoint) */
	int64		held_at_finish; /* the rows every shard held when the finish began */
	instr_time	start;
	/* where the coordinator's time goes, for DEBUG1 */
	double		seconds_encode;
	double		seconds_libpq;
	double		seconds_wait;
	int64		waits;
};

/* The savepoint a shipment's rows go in under, named after the set (unique per connection). */
static char *
ship_savepoint(KnnShardRemote *shard)
{
	return psprintf("knn_gpu_ship_" INT64_FORMAT, shard->received_set);
}

KnnShardShipment *
knn_shard_remote_ship_start(KnnShardRemote **shards, int n_shards, const KnnShardRows *rows,
							bool savepoint)
{
	KnnShardShipment *sh = palloc0(sizeof(KnnShardShipment));

	INSTR_TIME_SET_CURRENT(sh->start);
	sh->shards = shards;
	sh->n_shards = n_shards;
	sh->rows = rows;
	sh->savepoint = savepoint;
	for (int s = 0; s < n_shards; s++)
		shards[s]->round_trips = 0;
	sh->progress = palloc0(n_shards * sizeof(ShipProgress));
	sh->st = palloc0(n_shards * sizeof(ShipStatement));
	for (int i = 0; i < SHIP_BLOCKS_AHEAD; i++)
	{
		initStringInfo(&sh->blocks[i].data);
		sh->blocks[i].relay_index = -1;
	}
	for (int s = 0; s < n_shards; s++)
	{
		ship_statement_init(shards[s], &sh->st[s], rows->relay != NULL);
		sh->progress[s].old_send_buffer = -1;
	}
	if (rows->relay != NULL)
	{
		/* (a block's origin is its sender's index among these shards) */
		if (rows->relay->n_origins != n_shards || rows->origin_end != NULL ||
			rows->n != rows->relay->rows)
			elog(ERROR, "knn_shard_remote_ship_start: a relay of %d shards' blocks to %d shards",
				 rows->relay->n_origins, n_shards);
		sh->relay_order = knn_shard_relay_order(rows->relay);
	}
	if (rows->origin_end != NULL)
	{
		/* each shard's own rows, in shard order, cover the rows */
		sh->origin_next = palloc(n_shards * sizeof(int64));
		for (int s = 0; s < n_shards; s++)
		{
			sh->origin_next[s] = s > 0 ? rows->origin_end[s - 1] : 0;
			if (rows->origin_end[s] < sh->origin_next[s])
				elog(ERROR, "knn_shard_remote_ship_start: shard %d's rows end before they begin", s);
		}
		if (rows->origin_end[n_shards - 1] != rows->n)
			elog(ERROR, "knn_shard_remote_ship_start: the shards' own rows are not the rows");
	}
	sh->open = true;
	PG_TRY();
	{
		/* rows that may have to be taken back: a savepoint of their own there */
		for (int s = 0; s < n_shards && savepoint; s++)
		{
			WITH_SHARD_CONTEXT(shards[s]);
			fdw.PQclear(exec_checked(shards[s], psprintf("SAVEPOINT %s", ship_savepoint(shards[s])),
									 PGRES_COMMAND_OK));
			END_SHARD_CONTEXT();
		}
		ship_statement_prepare(shards, n_shards, sh->st);
		for (int s = 0; s < n_shards; s++)
		{
			WITH_SHARD_CONTEXT(shards[s]);
			if (fdw.PQsetnonblocking(shards[s]->conn, 1) != 0)
				fdw.pgfdw_report_error(ERROR, NULL, shards[s]->conn, false, sh->st[s].sql);
			shards[s]->sending = true;
			sh->progress[s].pipelined = fdw.PQenterPipelineMode != NULL &&
				fdw.PQenterPipelineMode(shards[s]->conn) == 1;
			sh->progress[s].old_send_buffer = widen_send_buffer(fdw.PQsocket(shards[s]->conn));
			END_SHARD_CONTEXT();
		}
	}
	PG_CATCH();
	{
		knn_shard_remote_ship_fail(sh);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return sh;
}

/*
 * Takes relayed blocks into the ring while it has room (a slot every shard
 * has passed): nothing to encode, the block's bytes are sent as they came.
 * The block a slot held before is sent everywhere (libpq copied it), so its
 * result is freed here. True when a block was taken.
 */
static bool
relay_blocks(KnnShardShipment *sh, int64 slowest)
{
	KnnShardRelay *relay = sh->rows->relay;
	bool		moved = false;

	while (sh->encoded - slowest < SHIP_BLOCKS_AHEAD && sh->relay_next < relay->n_blocks)
	{
		ShipBlock  *b = &sh->blocks[sh->encoded % SHIP_BLOCKS_AHEAD];
		const KnnShardRelayBlock *from;

		if (b->relay_index >= 0)
			knn_shard_relay_free_block(relay, b->relay_index);
		b->relay_index = sh->relay_order[sh->relay_next++];
		from = &relay->blocks[b->relay_index];
		b->raw = from->data;
		b->raw_length = from->length;
		b->rows = from->rows;
		b->origin = from->origin;
		sh->r += b->rows;
		sh->encoded++;
		moved = true;
	}
	return moved;
}

/*
 * Encodes rows into blocks while the ring has room (a slot every shard has
 * sent): a block is complete at SHIP_BLOCK_BYTES, or with `last` at the
 * last row. True when a block was completed.
 */
static bool
encode_blocks(KnnShardShipment *sh, bool last)
{
	const KnnShardRows *rows = sh->rows;
	int64		slowest = PG_INT64_MAX;
	bool		moved = false;
	instr_time	phase;

	for (int s = 0; s < sh->n_shards; s++)
		slowest = Min(slowest, sh->progress[s].passed);
	if (rows->relay != NULL)
		return relay_blocks(sh, slowest);
	INSTR_TIME_SET_CURRENT(phase);
	while (sh->encoded - slowest < SHIP_BLOCKS_AHEAD &&
		   (sh->r < rows->n || (last && sh->filling)))
	{
		ShipBlock  *b = &sh->blocks[sh->encoded % SHIP_BLOCKS_AHEAD];
		int64		row;
		int64		end = rows->n;

		if (!sh->filling)
		{
			resetStringInfo(&b->data);
			sh->filling = true;
			sh->block_start = sh->r;
			b->origin = -1;
			if (rows->origin_end != NULL)
			{
				/* the next shard's own rows in turn, a block each: every shard has blocks to take */
				do
					b->origin = sh->origin_turn++ % sh->n_shards;
				while (sh->origin_next[b->origin] == rows->origin_end[b->origin]);
			}
		}
		row = b->origin >= 0 ? sh->origin_next[b->origin] : sh->r;
		if (b->origin >= 0)
			end = rows->origin_end[b->origin];
		while (row < end && b->data.len < SHIP_BLOCK_BYTES)
		{
			rows->encode(rows->arg, row++, &b->data);
			if (++sh->r % 1024 == 0)
				CHECK_FOR_INTERRUPTS();
		}
		if (b->origin >= 0)
			sh->origin_next[b->origin] = row;
		/* (rows shipped while read) the rest of it is not read yet; a shard's own rows are all here */
		if (b->data.len < SHIP_BLOCK_BYTES && b->origin < 0 && !last)
			break;
		b->rows = sh->r - sh->block_start;
		sh->encoded++;
		sh->filling = false;
		moved = true;
	}
	sh->seconds_encode += knn_seconds_since(phase);
	return moved;
}

/*
 * Sends each shard the blocks it has room for and reads the answers there,
 * without waiting. True when a block was sent or an answer read; *done
 * when every complete block is answered everywhere.
 */
static bool
move_blocks(KnnShardShipment *sh, bool *done)
{
	bool		moved = false;
	instr_time	phase;
	KnnShardRemote **origins = sh->rows->relay != NULL ? sh->shards : NULL;

	*done = true;
	INSTR_TIME_SET_CURRENT(phase);
	for (int s = 0; s < sh->n_shards; s++)
	{
		KnnShardRemote *shard = sh->shards[s];
		ShipProgress *p = &sh->progress[s];

		if (advance_block(shard, p, sh->st[s].sql, origins))
			moved = true;
		while (p->passed < sh->encoded)
		{
			const ShipBlock *b = &sh->blocks[p->passed % SHIP_BLOCKS_AHEAD];

			if (b->origin != s)
			{
				if (p->sent - p->answered >= (p->pipelined ? SHIP_IN_FLIGHT : 1) ||
					p->unsent_bytes)
					break;
				send_block(shard, p, &sh->st[s], b);
				(void) advance_block(shard, p, sh->st[s].sql, origins);
			}
			p->passed++;
			moved = true;
		}
		*done = *done && p->passed == sh->encoded && p->answered == p->sent;
	}
	sh->seconds_libpq += knn_seconds_since(phase);
	return moved;
}

void
knn_shard_remote_ship_poll(KnnShardShipment *sh)
{
	bool		done;

	Assert(sh->open);
	/* each pass moves something, or ends: the rows read so far are finite */
	while (encode_blocks(sh, false) | move_blocks(sh, &done))
		;
}

void
knn_shard_remote_ship_finish(KnnShardShipment *sh)
{
	KnnShardRemote **shards = sh->shards;
	int			n_shards = sh->n_shards;
	WaitEventSet *volatile events = NULL;	/* set in PG_TRY, freed in PG_CATCH */

	Assert(sh->open);
	sh->held_at_finish = PG_INT64_MAX;
	for (int s = 0; s < n_shards; s++)
		sh->held_at_finish = Min(sh->held_at_finish, sh->progress[s].held);
	PG_TRY();
	{
		/* the latch (a cancel), the postmaster, then each shard's socket at 2 + s */
		events = CreateWaitEventSet(CurrentMemoryContext, n_shards + 2);
		AddWaitEventToSet(events, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(events, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		for (int s = 0; s < n_shards; s++)
			AddWaitEventToSet(events, WL_SOCKET_READABLE, fdw.PQsocket(shards[s]->conn), NULL, NULL);
		for (;;)
		{
			bool		done;
			bool		moved = encode_blocks(sh, true);
			WaitEvent	occurred;
			instr_time	phase;

			moved = move_blocks(sh, &done) || moved;
			if (done && sh->r == sh->rows->n && !sh->filling)
				break;
			if (moved)
				continue;
			/* nothing to do until a shard answers or takes more bytes */
			for (int s = 0; s < n_shards; s++)
				ModifyWaitEvent(events, 2 + s,
								WL_SOCKET_READABLE | (sh->progress[s].unsent_bytes ? WL_SOCKET_WRITEABLE : 0),
								NULL);
			INSTR_TIME_SET_CURRENT(phase);
			if (WaitEventSetWait(events, -1L, &occurred, 1, PG_WAIT_EXTENSION) > 0 &&
				(occurred.events & WL_LATCH_SET))
				ResetLatch(MyLatch);
			sh->seconds_wait += knn_seconds_since(phase);
			sh->waits++;
			CHECK_FOR_INTERRUPTS();
		}
		FreeWaitEventSet(events);
		events = NULL;
		for (int s = 0; s < n_shards; s++)
		{
			WITH_SHARD_CONTEXT(shards[s]);
			if (sh->progress[s].pipelined)
			{
				if (!leave_pipeline(shards[s], &sh->progress[s].synced, true, 0))
					fdw.pgfdw_report_error(ERROR, NULL, shards[s]->conn, false, sh->st[s].sql);
				sh->progress[s].pipelined = false;
			}
			/* every block was answered, so nothing is left unsent: this switch cannot fail on a flush */
			shards[s]->sending = false;
			restore_send_buffer(fdw.PQsocket(shards[s]->conn), &sh->progress[s]);
			if (fdw.PQsetnonblocking(shards[s]->conn, 0) != 0)
				fdw.pgfdw_report_error(ERROR, NULL, shards[s]->conn, false, sh->st[s].sql);
			fdw.PQclear(exec_checked(shards[s], psprintf("DEALLOCATE %s", sh->st[s].name),
									 PGRES_COMMAND_OK));
			END_SHARD_CONTEXT();
		}
	}
	PG_CATCH();
	{
		if (events != NULL)
			FreeWaitEventSet(events);
		knn_shard_remote_ship_fail(sh);
		PG_RE_THROW();
	}
	PG_END_TRY();
	sh->open = false;
	for (int s = 0; s < n_shards; s++)
		shards[s]->rows_shipped = sh->progress[s].rows_sent;
	for (int i = 0; i < SHIP_BLOCKS_AHEAD; i++)
		pfree(sh->blocks[i].data.data);
	if (sh->rows->relay != NULL)
		knn_shard_relay_free(sh->rows->relay);
	note_ship_time(shards, n_shards, sh->start);
	ereport(DEBUG1,
			(errmsg_internal("%s: " INT64_FORMAT " query rows shipped to %d shards in %.3f s (" INT64_FORMAT " held there before the finish): encoding %.3f s, libpq %.3f s, waiting for the shards %.3f s (" INT64_FORMAT " waits)",
							 shards[0]->who, sh->rows->n, n_shards, shards[0]->seconds_ship,
							 sh->held_at_finish, sh->seconds_encode, sh->seconds_libpq,
							 sh->seconds_wait, sh->waits)));
}

int64
knn_shard_remote_ship_held_at_finish(const KnnShardShipment *sh)
{
	return sh->held_at_finish;
}

void
knn_shard_remote_ship_fail(KnnShardShipment *sh)
{
	TimestampTz deadline;

	if (sh == NULL || !sh->open)
		return;
	sh->open = false;
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), FAIL_COPY_TIMEOUT_MS);
	for (int s = 0; s < sh->n_shards; s++)
	{
		if (sh->shards[s]->sending)
			fail_blocks(sh->shards[s], &sh->progress[s], deadline);
		restore_send_buffer(fdw.PQsocket(sh->shards[s]->conn), &sh->progress[s]);
	}
}

void
knn_shard_remote_ship_end_savepoint(KnnShardShipment *sh, bool keep)
{
	Assert(!sh->open && sh->savepoint);
	for (int s = 0; s < sh->n_shards; s++)
	{
		char	   *name = ship_savepoint(sh->shards[s]);

		WITH_SHARD_CONTEXT(sh->shards[s]);
		/* taken back: the received set goes with its subtransaction there (knn_shard_receive.h) */
		if (!keep)
			fdw.PQclear(exec_checked(sh->shards[s], psprintf("ROLLBACK TO SAVEPOINT %s", name),
									 PGRES_COMMAND_OK));
		fdw.PQclear(exec_checked(sh->shards[s], psprintf("RELEASE SAVEPOINT %s", name),
								 PGRES_COMMAND_OK));
		END_SHARD_CONTEXT();
	}
	sh->savepoint = false;
}

void
knn_shard_remote_ship_blocks(KnnShardRemote **shards, int n_shards, const KnnShardRows *rows)
{
	knn_shard_remote_ship_finish(knn_shard_remote_ship_start(shards, n_shards, rows, false));
}

/* What wait_for_shards waits for. */
typedef enum ShardWait
{
	WAIT_JOIN,
	WAIT_JOIN_ROWS,				/* the join's rows, each read as it arrives */
	WAIT_PREFETCH,
	WAIT_FETCH
} ShardWait;

/* Is the shard busy with what wait_for_shards waits for? */
static bool
shard_busy(const KnnShardRemote *shard, ShardWait what)
{
	return what == WAIT_PREFETCH ? shard->prefetching :
		what == WAIT_FETCH ? shard->fetching : shard->busy;
}

/* Waits (cancellably) until any busy shard's socket has something to read. */
static void
wait_for_any(KnnShardRemote **shards, int n_shards, ShardWait what)
{
	WaitEventSet *set = CreateWaitEventSet(CurrentMemoryContext, n_shards + 2);

	PG_TRY();
	{
		WaitEvent	event;

		AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		for (int s = 0; s < n_shards; s++)
			if (shard_busy(shards[s], what))
				AddWaitEventToSet(set, WL_SOCKET_READABLE, fdw.PQsocket(shards[s]->conn), NULL, NULL);
		if (WaitEventSetWait(set, -1L, &event, 1, PG_WAIT_EXTENSION) == 1 &&
			(event.events & WL_LATCH_SET))
			ResetLatch(MyLatch);
	}
	PG_FINALLY();
	{
		FreeWaitEventSet(set);
	}
	PG_END_TRY();
	CHECK_FOR_INTERRUPTS();
}

static void wait_for_shards(KnnShardRemote **shards, int n_shards, ShardWait what,
							KnnShardReader reader, void *reader_arg);
static void read_arrived_blocks(KnnShardRemote *shard, ShardWait what, KnnShardReader reader,
								void *reader_arg);

/* DEBUG1: what the shard is sent; `what` it does. */
static void
debug_statement(KnnShardRemote *shard, const char *what, const char *sql)
{
	ereport(DEBUG1,
			(errmsg_internal("%s: foreign server \"%s\" %s: %s", shard->who,
							 shard->server->servername, what, sql)));
}

/* Sends a statement (with text parameters) without waiting for it; `what` the shard does, for DEBUG1. */
static void
send_statement(KnnShardRemote *shard, const char *what, const char *sql, int n_params,
			   const Oid *types, const char *const *values, bool binary_result)
{
	WITH_SHARD_CONTEXT(shard);
	debug_statement(shard, what, sql);
	if (!fdw.PQsendQueryParams(shard->conn, sql, n_params, types, values, NULL, NULL,
							   binary_result ? 1 : 0))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	shard->round_trips++;
	END_SHARD_CONTEXT();
}

void
knn_shard_remote_prefetch_send(KnnShardRemote *shard)
{
	send_statement(shard, "reads its targets", shard->prefetch_sql, 0, NULL, NULL, false);
	shard->prefetching = true;
	shard->read_ahead = true;
}

/* Reads a shard's prefetch result: the rows it holds now. */
static void
read_prefetch_result(KnnShardRemote *shard)
{
	PGresult   *res;
	char	   *rows = NULL;
	char	   *seconds = NULL;
	char	   *dim = NULL;

	WITH_SHARD_CONTEXT(shard);
	res = fdw.pgfdw_get_result(shard->conn, shard->prefetch_sql);
	if (fdw.PQresultStatus(res) != PGRES_TUPLES_OK)
		fdw.pgfdw_report_error(ERROR, res, shard->conn, true, shard->prefetch_sql);
	/* (targets_read, seconds): the shard's own time, which it spent while we read our queries */
	if (fdw.PQntuples(res) == 1 && fdw.PQnfields(res) >= 2 &&
		!fdw.PQgetisnull(res, 0, 0) && !fdw.PQgetisnull(res, 0, 1))
	{
		rows = pstrdup(fdw.PQgetvalue(res, 0, 0));
		seconds = pstrdup(fdw.PQgetvalue(res, 0, 1));
	}
	/* a self-join's read: then (id_type, vector_type, dim), what the rows held are */
	shard->held_id_type = shard->held_vector_type = NULL;
	shard->held_dim = -1;
	if (fdw.PQntuples(res) == 1 && fdw.PQnfields(res) == 5)
	{
		shard->held_id_type = text_value(res, 2);
		shard->held_vector_type = text_value(res, 3);
		dim = text_value(res, 4);
	}
	fdw.PQclear(res);
	if (dim != NULL)
		shard->held_dim = pg_strtoint32(dim);
	shard->prefetched_rows = rows != NULL ? pg_strtoint64(rows) : -1;
	if (seconds != NULL)
		shard->seconds_read = float8in_internal(seconds, NULL, "double precision", seconds);
	if (shard->prefetched_rows < 0)
		ereport(ERROR,
				(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
				 errmsg("%s: foreign server \"%s\" did not say how many targets it read",
						shard->who, shard->server->servername)));
	shard->holds_targets = true;
	END_SHARD_CONTEXT();
}

void
knn_shard_remote_prefetch_wait(KnnShardRemote **shards, int n_shards)
{
	bool	   *pending = palloc(Max(n_shards, 1) * sizeof(bool));

	for (int s = 0; s < n_shards; s++)
		pending[s] = shards[s]->prefetching;
	wait_for_shards(shards, n_shards, WAIT_PREFETCH, NULL, NULL);
	for (int s = 0; s < n_shards; s++)
		if (pending[s])
			read_prefetch_result(shards[s]);
	pfree(pending);
}

bool
knn_shard_remote_prefetch_poll(KnnShardRemote **shards, int n_shards)
{
	bool		all = true;

	for (int s = 0; s < n_shards; s++)
	{
		KnnShardRemote *shard = shards[s];

		if (!shard->prefetching)
			continue;
		{
			WITH_SHARD_CONTEXT(shard);
			if (!fdw.PQconsumeInput(shard->conn))
				fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, shard->prefetch_sql);
			END_SHARD_CONTEXT();
		}
		if (fdw.PQisBusy(shard->conn))
			all = false;
		else
		{
			shard->prefetching = false;
			read_prefetch_result(shard);
		}
	}
	return all;
}

static void
drop_targets(KnnShardRemote *shard)
{
	WITH_SHARD_CONTEXT(shard);
	fdw.PQclear(exec_checked(shard,
							 psprintf("SELECT %s.knn_shard_drop_targets(" INT64_FORMAT "::pg_catalog.int8)",
									  shard->knn_schema, shard->received_set),
							 PGRES_TUPLES_OK));
	shard->holds_targets = false;
	END_SHARD_CONTEXT();
}

void
knn_shard_remote_prefetch_drop(KnnShardRemote **shards, int n_shards)
{
	knn_shard_remote_prefetch_wait(shards, n_shards);
	for (int s = 0; s < n_shards; s++)
		if (shards[s]->holds_targets)
			drop_targets(shards[s]);
}

/*
 * A join read as it arrives (knn_shard_remote_collect_rows) whose rows are
 * small (a range join's pairs, the KNN Join node's rows) is fetched from a
 * cursor in batches of about JOIN_BATCH_BYTES: in single-row mode libpq
 * makes a result of its own for every row, a quarter of a range join's
 * time for 1500000 pairs. The first batches are small (a row's size is
 * not known before one comes), the next FETCH goes as soon as a batch has
 * arrived (the shard makes it while this one is read here), and what
 * libpq holds stays about a batch whatever the answer's size.
 */
#define JOIN_FIRST_BATCH_ROWS 256
#define JOIN_MAX_BATCH_ROWS 65536
#define JOIN_BATCH_BYTES (1024 * 1024)

/*
 * Sends the next FETCH of a join's cursor. (In the extended protocol the
 * result's format is asked for with each FETCH, whatever the cursor's
 * BINARY.)
 */
static void
send_fetch(KnnShardRemote *shard)
{
	char	   *sql = psprintf("FETCH " INT64_FORMAT " FROM %s", shard->fetch_rows, shard->cursor);

	WITH_SHARD_CONTEXT(shard);
	if (!fdw.PQsendQueryParams(shard->conn, sql, 0, NULL, NULL, NULL, NULL,
							   shard->binary_result ? 1 : 0))
		fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
	shard->round_trips++;
	END_SHARD_CONTEXT();
}

/*
 * Queues (batch_send) the join's cursor there. DECLARE plans for
 * cursor_tuple_fraction of the rows (a fast start, which may be another
 * plan): the join is read whole, so it is planned with 1, and the setting
 * is RESET after it (neither knn_gpu nor postgres_fdw sets it otherwise in
 * that session; a rollback undoes both). Its first batch is asked for once
 * these are answered.
 */
static void
send_cursor_statements(KnnShardRemote *shard, ShardBatch *batch)
{
	ShardStatement *declare;

	shard->cursor = psprintf("knn_gpu_join_" INT64_FORMAT, shard->received_set);
	shard->fetch_rows = JOIN_FIRST_BATCH_ROWS;
	shard->more_rows = true;
	batch_add(batch, "SET LOCAL cursor_tuple_fraction = 1", PGRES_COMMAND_OK, NULL);
	declare = batch_add(batch, psprintf("DECLARE %s NO SCROLL %sCURSOR FOR %s", shard->cursor,
										shard->binary_result ? "BINARY " : "", shard->join_sql),
						PGRES_COMMAND_OK, NULL);
	declare->n_params = shard->n_params;
	declare->param_types = shard->param_types;
	declare->param_values = shard->param_values;
	batch_add(batch, "RESET cursor_tuple_fraction", PGRES_COMMAND_OK, NULL);
	{
		WITH_SHARD_CONTEXT(shard);
		debug_statement(shard, "joins", declare->sql);
		END_SHARD_CONTEXT();
	}
	batch_send(shard, batch);
}

void
knn_shard_remote_send(KnnShardRemote **shards, int n_shards)
{
	ShardBatch *batches = palloc0(Max(n_shards, 1) * sizeof(ShardBatch));

	PG_TRY();
	{
		/* every shard's cursor statements on their way before any answer is read */
		for (int s = 0; s < n_shards; s++)
		{
			shards[s]->cursor = NULL;
			if (shards[s]->stream_result && !shards[s]->packed_result)
				send_cursor_statements(shards[s], &batches[s]);
		}
		for (int s = 0; s < n_shards; s++)
		{
			KnnShardRemote *shard = shards[s];

			if (shard->cursor != NULL)
			{
				batch_finish(shard, &batches[s]);
				send_fetch(shard);
			}
			else
			{
				send_statement(shard, "joins", shard->join_sql, shard->n_params,
							   shard->param_types, shard->param_values, shard->binary_result);
				/* packed values (up to 65536 pairs each) read as they arrive: libpq never holds the whole */
				if (shard->stream_result && !fdw.PQsetSingleRowMode(shard->conn))
					fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, shard->join_sql);
			}
			shard->busy = true;
			shard->holds_targets = false;	/* the join takes them */
			INSTR_TIME_SET_CURRENT(shard->sent);
		}
	}
	PG_CATCH();
	{
		for (int s = 0; s < n_shards; s++)
			batch_fail(shards[s], &batches[s]);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(batches);
}

/*
 * Waits until no shard is busy (WAIT_PREFETCH: prefetching; WAIT_FETCH:
 * fetching, each block handed to reader as it arrives: read_arrived_blocks),
 * noting when each one's join result arrived. Waits on every busy shard's
 * socket at once (wait_for_any): the blocks of a fetch are read as soon as
 * any shard's arrive.
 */
static void
wait_for_shards(KnnShardRemote **shards, int n_shards, ShardWait what, KnnShardReader reader,
				void *reader_arg)
{
	bool		prefetch = what != WAIT_JOIN && what != WAIT_JOIN_ROWS;

	for (;;)
	{
		bool		any_busy = false;

		for (int s = 0; s < n_shards; s++)
		{
			KnnShardRemote *shard = shards[s];
			bool	   *busy = what == WAIT_PREFETCH ? &shard->prefetching :
				what == WAIT_FETCH ? &shard->fetching : &shard->busy;
			const char *sql = what == WAIT_PREFETCH ? shard->prefetch_sql :
				what == WAIT_FETCH ? shard->fetch_sql : shard->join_sql;

			if (!*busy)
				continue;
			{
				WITH_SHARD_CONTEXT(shard);
				if (!fdw.PQconsumeInput(shard->conn))
					fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, sql);
				END_SHARD_CONTEXT();
			}
			if (what == WAIT_FETCH || what == WAIT_JOIN_ROWS)
				read_arrived_blocks(shard, what, reader, reader_arg);
			else if (!fdw.PQisBusy(shard->conn))
			{
				instr_time	now;

				INSTR_TIME_SET_CURRENT(now);
				INSTR_TIME_SUBTRACT(now, shard->sent);
				if (!prefetch)
					shard->seconds_join = INSTR_TIME_GET_DOUBLE(now);
				*busy = false;
			}
			any_busy |= *busy;
		}
		if (!any_busy)
			return;
		wait_for_any(shards, n_shards, what);
	}
}

/*
 * libpq's memory of a result, estimated from up to 1024 of its rows: their
 * values, a pointer and a length per field, a row pointer.
 */
static double
estimate_result_bytes(PGresult *res)
{
	int			n = fdw.PQntuples(res);
	int			n_fields = fdw.PQnfields(res);
	int			step = Max(n / 1024, 1);
	double		sampled = 0.0;
	double		bytes = 0.0;

	for (int r = 0; r < n; r += step)
	{
		for (int f = 0; f < n_fields; f++)
			bytes += fdw.PQgetlength(res, r, f) + 17;
		bytes += 8;
		sampled++;
	}
	return sampled > 0 ? bytes / sampled * n : 0.0;
}

double
knn_shard_result_bytes(const KnnShardResult *result)
{
	return result->bytes;
}

int
knn_shard_result_rows(const KnnShardResult *result)
{
	return fdw.PQntuples(result->res);
}

int
knn_shard_result_columns(const KnnShardResult *result)
{
	return fdw.PQnfields(result->res);
}

const char *
knn_shard_result_value(const KnnShardResult *result, int row, int column, int *length)
{
	/* a NULL's length is 0: a value of any other length is not one (a call less per value) */
	*length = fdw.PQgetlength(result->res, row, column);
	if (*length == 0 && fdw.PQgetisnull(result->res, row, column))
		return NULL;
	return fdw.PQgetvalue(result->res, row, column);
}

/* Hands a result to the reader; the result is libpq's memory: freed whatever happens. */
static void
read_result(KnnShardRemote *shard, PGresult *res, double bytes, KnnShardReader reader,
			void *reader_arg)
{
	KnnShardResult result = {res, bytes, false};

	if (res != NULL && fdw.PQnfields(res) > 0 && fdw.PQfformat(res, 0) != (shard->binary_result ? 1 : 0))
	{
		fdw.PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
				 errmsg("%s on foreign server \"%s\" returned its result in another format",
						shard->who, shard->server->servername)));
	}
	shard->rows = fdw.PQntuples(res);
	PG_TRY();
	{
		reader(reader_arg, shard, &result);
	}
	PG_FINALLY();
	{
		if (!result.kept)
			fdw.PQclear(res);
	}
	PG_END_TRY();
}

void *
knn_shard_result_keep(const KnnShardResult *result)
{
	((KnnShardResult *) result)->kept = true;
	return result->res;
}

void
knn_shard_result_free_kept(void *kept)
{
	fdw.PQclear((PGresult *) kept);
}

/* Each shard's join result to reader, in shard order; a failed one raises the shard's ERROR. */
static void
read_results(KnnShardRemote **shards, int n_shards, KnnShardReader reader, void *reader_arg)
{
	for (int s = 0; s < n_shards; s++)
	{
		KnnShardRemote *shard = shards[s];
		PGresult   *res;

		WITH_SHARD_CONTEXT(shard);
		res = fdw.pgfdw_get_result(shard->conn, shard->join_sql);
		if (fdw.PQresultStatus(res) != PGRES_TUPLES_OK)
			fdw.pgfdw_report_error(ERROR, res, shard->conn, true, shard->join_sql);
		read_result(shard, res, estimate_result_bytes(res), reader, reader_arg);
		END_SHARD_CONTEXT();
	}
}

/*
 * A FETCH of a join's cursor has ended (libpq's NULL result): sends the
 * next after a full batch; false when the rows have ended.
 */
static bool
cursor_statement_ended(KnnShardRemote *shard)
{
	if (!shard->more_rows)
		return false;
	send_fetch(shard);
	return true;
}

/*
 * A batch of a join's cursor: the next batch's count set from this one's
 * rows (about JOIN_BATCH_BYTES, at most four times this count), the next
 * FETCH sent when libpq has the statement's end already (so the shard
 * makes the next batch while this one is read), then the batch to reader.
 */
static void
read_batch(KnnShardRemote *shard, PGresult *res, KnnShardReader reader, void *reader_arg)
{
	int			n = fdw.PQntuples(res);
	double		bytes = estimate_result_bytes(res);

	shard->more_rows = n > 0 && n >= shard->fetch_rows;
	if (n > 0)
		shard->fetch_rows = (int64) Max(Min(Min(JOIN_BATCH_BYTES / (bytes / n),
												4.0 * shard->fetch_rows),
											JOIN_MAX_BATCH_ROWS), 1.0);
	if (!fdw.PQisBusy(shard->conn))
	{
		PGresult   *end = fdw.PQgetResult(shard->conn);

		if (end != NULL)
		{
			fdw.PQclear(res);
			fdw.PQclear(end);
			ereport(ERROR,
					(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
					 errmsg("%s on foreign server \"%s\" answered a FETCH with more than one result",
							shard->who, shard->server->servername)));
		}
		/* the rows ended: the caller's loop finds the statement's end again and ends the join */
		(void) cursor_statement_ended(shard);
	}
	read_result(shard, res, bytes, reader, reader_arg);
}

/*
 * The blocks of a shard's fetch of held rows that libpq holds whole (in
 * single-row mode each is a result of its own), each to reader and freed;
 * fetching ends with its statement's end. Never waits: libpq has what it
 * has read, a block or two (its input buffer), not the shard's whole answer.
 */
static void
read_arrived_blocks(KnnShardRemote *shard, ShardWait what, KnnShardReader reader,
					void *reader_arg)
{
	bool	   *busy = what == WAIT_FETCH ? &shard->fetching : &shard->busy;
	const char *sql = what == WAIT_FETCH ? shard->fetch_sql : shard->join_sql;
	bool		in_cursor = what == WAIT_JOIN_ROWS && shard->cursor != NULL;

	WITH_SHARD_CONTEXT(shard);
	while (*busy && !fdw.PQisBusy(shard->conn))
	{
		PGresult   *res = fdw.PQgetResult(shard->conn);

		if (res == NULL && in_cursor && cursor_statement_ended(shard))
			continue;			/* the next FETCH sent */
		if (res == NULL)
		{
			*busy = false;
			if (what == WAIT_JOIN_ROWS)
			{
				instr_time	now;

				INSTR_TIME_SET_CURRENT(now);
				INSTR_TIME_SUBTRACT(now, shard->sent);
				shard->seconds_join = INSTR_TIME_GET_DOUBLE(now);
			}
			/* a read that sent its rows as it read them: its time is the fetch's */
			else if (shard->stream_sql != NULL)
			{
				instr_time	now;

				INSTR_TIME_SET_CURRENT(now);
				INSTR_TIME_SUBTRACT(now, shard->sent);
				shard->seconds_read = INSTR_TIME_GET_DOUBLE(now);
				shard->read_ahead = true;
			}
		}
		else if (fdw.PQresultStatus(res) == PGRES_SINGLE_TUPLE)
			read_result(shard, res, estimate_result_bytes(res), reader, reader_arg);
		else if (in_cursor && fdw.PQresultStatus(res) == PGRES_TUPLES_OK)
			read_batch(shard, res, reader, reader_arg);
		else if (fdw.PQresultStatus(res) == PGRES_TUPLES_OK)
			fdw.PQclear(res);	/* the end of the rows */
		else
			fdw.pgfdw_report_error(ERROR, res, shard->conn, true, sql);
	}
	END_SHARD_CONTEXT();
}

void
knn_shard_remote_fetch_held(KnnShardRemote **shards, int n_shards, KnnShardReader reader,
							void *reader_arg)
{
	for (int s = 0; s < n_shards; s++)
	{
		KnnShardRemote *shard = shards[s];

		/* value per call from the target list: the shard sends each block as it makes it */
		shard->fetch_sql = shard->stream_sql != NULL ? shard->stream_sql :
			psprintf("SELECT %s.knn_shard_held_target_blocks(" INT64_FORMAT "::pg_catalog.int8)",
					 shard->knn_schema, shard->received_set);
		INSTR_TIME_SET_CURRENT(shard->sent);
		send_statement(shard, shard->stream_sql != NULL ? "reads its targets, sending them as the queries" :
					   "sends its targets back as the queries", shard->fetch_sql, 0, NULL, NULL, true);
		/* and each block is read here as it arrives, not once all are in libpq's memory */
		if (!fdw.PQsetSingleRowMode(shard->conn))
			fdw.pgfdw_report_error(ERROR, NULL, shard->conn, false, shard->fetch_sql);
		shard->fetching = true;
	}
	wait_for_shards(shards, n_shards, WAIT_FETCH, reader, reader_arg);
}

static void after_join(KnnShardRemote **shards, int n_shards);

void
knn_shard_remote_collect(KnnShardRemote **shards, int n_shards, KnnShardReader reader,
						 void *reader_arg)
{
	wait_for_shards(shards, n_shards, WAIT_JOIN, NULL, NULL);
	read_results(shards, n_shards, reader, reader_arg);
	after_join(shards, n_shards);
}

void
knn_shard_remote_collect_rows(KnnShardRemote **shards, int n_shards, KnnShardReader reader,
							  void *reader_arg)
{
	for (int s = 0; s < n_shards; s++)
		if (shards[s]->busy && !shards[s]->stream_result)
			elog(ERROR, "knn_shard_remote_collect_rows: a join sent to be read whole");
	wait_for_shards(shards, n_shards, WAIT_JOIN_ROWS, reader, reader_arg);
	after_join(shards, n_shards);
}

/*
 * The shards' cursors closed and temporary tables dropped, their own
 * statistics read: each shard's statements together (batch_send), every
 * shard's sent before any answer is read.
 */
static void
after_join(KnnShardRemote **shards, int n_shards)
{
	ShardBatch *batches = palloc0(Max(n_shards, 1) * sizeof(ShardBatch));
	PGresult  **stats = palloc0(Max(n_shards, 1) * sizeof(PGresult *));

	PG_TRY();
	{
		for (int s = 0; s < n_shards; s++)
		{
			KnnShardRemote *shard = shards[s];

			/* the join's cursor (at its end) first: it reads the table */
			if (shard->cursor != NULL)
				batch_add(&batches[s], psprintf("CLOSE %s", shard->cursor), PGRES_COMMAND_OK, NULL);
			shard->cursor = NULL;
			/* ON COMMIT DROP covers errors; a long transaction should not keep them */
			if (shard->table_exists)
				batch_add(&batches[s], psprintf("DROP TABLE %s", shard->temp_table),
						  PGRES_COMMAND_OK, NULL);
			shard->table_exists = false;
			/* the shard's own record of its join: its engine's phases */
			batch_add(&batches[s], psprintf("SELECT %s.knn_gpu_last_stats()", shard->knn_schema),
					  PGRES_TUPLES_OK, &stats[s]);
			batch_send(shard, &batches[s]);
		}
		for (int s = 0; s < n_shards; s++)
		{
			KnnShardRemote *shard = shards[s];
			PGresult   *res;

			batch_finish(shard, &batches[s]);
			res = stats[s];
			if (fdw.PQntuples(res) == 1 && fdw.PQnfields(res) == 1 && !fdw.PQgetisnull(res, 0, 0))
				shard->remote_stats = pstrdup(fdw.PQgetvalue(res, 0, 0));
			stats[s] = NULL;
			fdw.PQclear(res);
			ereport(DEBUG1,
					(errmsg_internal("%s: foreign server \"%s\": %d round trips from the shipping to the statistics",
									 shard->who, shard->server->servername, shard->round_trips)));
		}
	}
	PG_CATCH();
	{
		for (int s = 0; s < n_shards; s++)
		{
			batch_fail(shards[s], &batches[s]);
			fdw.PQclear(stats[s]);
		}
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(batches);
	pfree(stats);
}
