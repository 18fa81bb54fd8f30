/*
 * knn_join.c -- knn_join(queries text, targets text, k, metric,
 * exclude_self, method): for every row of the query set, the k nearest rows
 * of the target set; and knn_gpu_info().
 *
 * Each text is one plain SELECT returning (integer id, vector), run through
 * SPI with the caller's privileges. Rows are read through a cursor in
 * batches into one float32 matrix per set, sorted by id (so the engine's
 * tie order, by row, is the order by id), handed to the engine in one
 * call, and the result is returned as a materialised set.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "portability/instr_time.h"
#include "utils/builtins.h"
#include "utils/plancache.h"
#include "utils/tuplestore.h"

#include "knn_matrix.h"
#include "knn_run.h"
#include "knn_settings.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

#define KNN_FETCH_BATCH 10000
/* Rows handed back between two looks at the interrupt flags. */
#define KNN_RETURN_SLICE 4096
/* How much of a user's argument an error message quotes. */
#define KNN_QUOTE_LIMIT 32

static double
seconds_since(instr_time start)
{
	instr_time	now;

	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	return INSTR_TIME_GET_DOUBLE(now);
}

/* At most KNN_QUOTE_LIMIT characters of a user's text, "..." if cut. */
static char *
quoted_prefix(const char *text)
{
	int			len = pg_mbcliplen(text, strlen(text), KNN_QUOTE_LIMIT);

	return psprintf("%.*s%s", len, text, text[len] != '\0' ? "..." : "");
}

static char *
text_argument(FunctionCallInfo fcinfo, int n, const char *name)
{
	if (PG_ARGISNULL(n))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("knn_join: %s must not be NULL", name)));
	return text_to_cstring(PG_GETARG_TEXT_PP(n));
}

/* The value that names[] gives a text argument; ERROR listing the valid ones. */
static int
named_argument(FunctionCallInfo fcinfo, int n, const char *what, const KnnName *names)
{
	char	   *name = text_argument(fcinfo, n, what);
	StringInfoData valid;

	for (const KnnName *entry = names; entry->name != NULL; entry++)
		if (pg_strcasecmp(entry->name, name) == 0)
			return entry->value;
	initStringInfo(&valid);
	for (const KnnName *entry = names; entry->name != NULL; entry++)
		appendStringInfo(&valid, "%s%s", entry == names ? "" : ", ", entry->name);
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown %s \"%s\"", what, quoted_prefix(name)),
			 errhint("Valid values are %s.", valid.data)));
	return 0;					/* not reached */
}

static int64
read_id(Datum value, Oid type)
{
	switch (type)
	{
		case INT2OID:
			return DatumGetInt16(value);
		case INT4OID:
			return DatumGetInt32(value);
		default:
			return DatumGetInt64(value);
	}
}

/*
 * The prepared text must be exactly one plain SELECT: no data-modifying
 * CTE, no FOR UPDATE/SHARE, no INTO, no other statement. Returns whether
 * it is free of volatile functions (then it gives the same rows each time
 * it runs in this snapshot).
 */
static bool
check_plain_select(SPIPlanPtr plan, const char *arg)
{
	List	   *sources = SPI_plan_get_plan_sources(plan);
	CachedPlanSource *source;
	Query	   *query;

	if (list_length(sources) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("%s must be a single SELECT statement, not %d statements",
						arg, list_length(sources))));
	source = linitial(sources);
	query = list_length(source->query_list) == 1 ? linitial_node(Query, source->query_list) : NULL;
	if (query == NULL || query->commandType != CMD_SELECT || query->utilityStmt != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s must be a plain SELECT returning (id, vector)", arg),
				 errdetail("It is a %s statement.", GetCommandTagName(source->commandTag))));
	if (query->hasModifyingCTE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s must be a plain SELECT returning (id, vector)", arg),
				 errdetail("It has a data-modifying WITH clause.")));
	if (query->rowMarks != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s must be a plain SELECT returning (id, vector)", arg),
				 errdetail("It locks rows (FOR UPDATE or FOR SHARE).")));
	return !contain_volatile_functions((Node *) query);
}

/* The reader of the set's vector column, after checking both columns. */
static const KnnVectorReader *
check_columns(TupleDesc desc, const char *arg, Oid *id_type)
{
	KnnVectorKind kind;

	if (desc->natts != 2)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s must return 2 columns (id, vector), not %d",
						arg, desc->natts)));
	*id_type = SPI_gettypeid(desc, 1);
	if (*id_type != INT2OID && *id_type != INT4OID && *id_type != INT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the first column of %s must be an integer id, not %s",
						arg, format_type_be(*id_type))));
	kind = knn_vector_kind(SPI_gettypeid(desc, 2));
	if (kind == KNN_VECTOR_UNSUPPORTED)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the second column of %s must be a vector, real[] or double precision[], not %s",
						arg, format_type_be(SPI_gettypeid(desc, 2)))));
	return knn_vector_reader(kind);
}

/*
 * Runs one set's query (the knn_join argument called `arg`) and appends its
 * rows to the matrix. Rows whose vector is NULL are skipped; a NULL id is an
 * error. Returns whether the query has no volatile function.
 */
static bool
read_set(const char *sql, const char *arg, KnnMatrix *matrix)
{
	SPIPlanPtr	plan;
	Portal		portal;
	const KnnVectorReader *reader = NULL;
	Oid			id_type = InvalidOid;
	bool		stable;

	plan = SPI_prepare(sql, 0, NULL);
	if (plan == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("could not prepare %s: %s", arg,
						SPI_result_code_string(SPI_result))));
	stable = check_plain_select(plan, arg);

	portal = SPI_cursor_open(NULL, plan, NULL, NULL, true);
	for (;;)
	{
		TupleDesc	desc;

		SPI_cursor_fetch(portal, true, KNN_FETCH_BATCH);
		desc = SPI_tuptable->tupdesc;
		if (reader == NULL)
			reader = check_columns(desc, arg, &id_type);

		for (uint64 r = 0; r < SPI_processed; r++)
		{
			HeapTuple	tuple = SPI_tuptable->vals[r];
			bool		id_null;
			bool		vector_null;
			Datum		id = SPI_getbinval(tuple, desc, 1, &id_null);
			Datum		vector = SPI_getbinval(tuple, desc, 2, &vector_null);

			if (id_null)
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("%s returned a NULL id", arg)));
			if (vector_null)
				continue;		/* documented: rows without a vector take no part */
			knn_matrix_append(matrix, read_id(id, id_type), vector, reader);
			CHECK_FOR_INTERRUPTS();
		}
		if (SPI_processed < KNN_FETCH_BATCH)
			break;
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	return stable;
}

/* Hands the engine's result back as rows. */
static void
return_rows(ReturnSetInfo *rsinfo, const KnnMatrix *queries, const KnnMatrix *targets,
			int32 slots, const int64 *neighbors, const double *distances)
{
	int64		emitted = 0;

	for (int64 q = 0; q < queries->n; q++)
	{
		for (int32 r = 0; r < slots; r++)
		{
			int64		t = neighbors[q * slots + r];
			Datum		values[4];
			bool		nulls[4] = {false, false, false, false};

			if (t < 0)
				break;
			values[0] = Int64GetDatum(queries->ids[q]);
			values[1] = Int64GetDatum(targets->ids[t]);
			values[2] = Int32GetDatum(r + 1);
			values[3] = Float8GetDatum(distances[q * slots + r]);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			if (++emitted % KNN_RETURN_SLICE == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
}

PG_FUNCTION_INFO_V1(knn_join);
Datum
knn_join(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *queries_sql = text_argument(fcinfo, 0, "queries");
	char	   *targets_sql = text_argument(fcinfo, 1, "targets");
	int32		k;
	KnnMetric	metric = (KnnMetric) named_argument(fcinfo, 3, "metric", knn_metric_names);
	bool		exclude_self;
	KnnMethod	method = (KnnMethod) named_argument(fcinfo, 5, "method", knn_method_names);
	KnnMatrix	queries;
	KnnMatrix	target_set;
	KnnMatrix  *targets = &target_set;
	KnnProblem	problem;
	KnnStats	stats;
	KnnJoinRecord record;
	int64	   *neighbors;
	double	   *distances;
	int32		slots;
	instr_time	start;
	double		seconds_read;
	double		seconds_sort;

	if (PG_ARGISNULL(2) || PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("knn_join: %s must not be NULL", PG_ARGISNULL(2) ? "k" : "exclude_self")));
	k = PG_GETARG_INT32(2);
	exclude_self = PG_GETARG_BOOL(4);
	if (k < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be at least 1, not %d", k)));

	InitMaterializedSRF(fcinfo, 0);

	INSTR_TIME_SET_CURRENT(start);
	knn_matrix_init(&queries, "query");
	knn_matrix_init(targets, "target");
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * The same text without volatile functions gives the same rows again in
	 * this snapshot: read it once, and the engine sees one matrix on both
	 * sides, a self-join (shared clustering, the symmetric Gram matrix).
	 */
	if (read_set(queries_sql, "queries", &queries) && strcmp(queries_sql, targets_sql) == 0)
		targets = &queries;
	else
		read_set(targets_sql, "targets", targets);
	SPI_finish();

	if (queries.n == 0 || targets->n == 0)
		PG_RETURN_NULL();
	if (queries.dim != targets->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("query vectors have %d dimensions but target vectors have %d",
						queries.dim, targets->dim)));
	seconds_read = seconds_since(start);

	INSTR_TIME_SET_CURRENT(start);
	knn_matrix_sort_by_id(&queries);
	if (targets != &queries)
		knn_matrix_sort_by_id(targets);
	seconds_sort = seconds_since(start);

	/* k past the target count returns every target: no need for more slots. */
	slots = (int32) Min((int64) k, targets->n);
	neighbors = MemoryContextAllocHuge(CurrentMemoryContext, (Size) queries.n * slots * sizeof(int64));
	distances = MemoryContextAllocHuge(CurrentMemoryContext, (Size) queries.n * slots * sizeof(double));

	knn_matrix_problem(&problem, &queries, targets, slots);
	problem.metric = metric;
	problem.method = method;
	if (exclude_self)
	{
		problem.query_keys = queries.ids;
		problem.target_keys = targets->ids;
	}
	knn_run_problem(&problem, neighbors, distances, &stats);

	INSTR_TIME_SET_CURRENT(start);
	return_rows(rsinfo, &queries, targets, slots, neighbors, distances);
	knn_stats_record(&record, &problem, &stats, seconds_read, seconds_sort,
					 seconds_since(start));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(knn_gpu_info);
Datum
knn_gpu_info(PG_FUNCTION_ARGS)
{
	char		line[512];

	if (knn_gpu_device == KNN_DEVICE_CPU)
	{
		knn_engine_describe_cpu(line, sizeof(line));
		strlcat(line, " (knn_gpu.device = cpu)", sizeof(line));
	}
	else
		knn_engine_describe(line, sizeof(line));
	PG_RETURN_TEXT_P(cstring_to_text(line));
}
