/*
 * knn_join.c -- knn_join(queries text, targets text, k, metric,
 * exclude_self, method): for every row of the query set, the k nearest rows
 * of the target set; and knn_gpu_info().
 *
 * Each text is one plain SELECT returning (integer id, vector | halfvec |
 * bit | real[] | double precision[]), optionally followed by group key
 * columns (knn_join_groups.h: a query meets only targets of equal keys), run through
 * SPI with the caller's privileges. Rows are read through a cursor in
 * batches into one matrix per set (float32, float16 for halfvec, bits for
 * bit: knn_join_element), sorted by id (so the engine's
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

#include "knn_join_groups.h"
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

/* One set of knn_join: its query text, prepared, and its columns. */
typedef struct KnnSet
{
	const char *sql;
	const char *arg;			/* "queries" or "targets", for messages */
	SPIPlanPtr	plan;
	bool		stable;			/* no volatile function */
	int			natts;			/* 2, plus the group key columns */
	Oid			id_type;
	Oid			vector_type;
	KnnVectorKind kind;
	KnnJoinGroupColumns groups;
} KnnSet;

/* Checks the columns a set returns: id, vector and an optional group key. */
static void
check_columns(TupleDesc desc, KnnSet *set)
{
	if (desc == NULL || desc->natts < 2)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s must return at least 2 columns (id, vector), not %d",
						set->arg, desc == NULL ? 0 : desc->natts)));
	set->natts = desc->natts;
	knn_join_group_columns(desc, set->arg, &set->groups);
	set->id_type = TupleDescAttr(desc, 0)->atttypid;
	if (set->id_type != INT2OID && set->id_type != INT4OID && set->id_type != INT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the first column of %s must be an integer id, not %s",
						set->arg, format_type_be(set->id_type))));
	set->vector_type = TupleDescAttr(desc, 1)->atttypid;
	set->kind = knn_vector_kind(set->vector_type);
	if (set->kind == KNN_VECTOR_UNSUPPORTED)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the second column of %s must be a vector, halfvec, bit, real[] or double precision[], not %s",
						set->arg, format_type_be(set->vector_type))));
}

/*
 * Prepares a set's text and checks its columns, before any row is read:
 * both sets' types decide how either is read (knn_join_element).
 */
static void
prepare_set(KnnSet *set)
{
	set->plan = SPI_prepare(set->sql, 0, NULL);
	if (set->plan == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("could not prepare %s: %s", set->arg,
						SPI_result_code_string(SPI_result))));
	set->stable = check_plain_select(set->plan, set->arg);
	check_columns(((CachedPlanSource *) linitial(SPI_plan_get_plan_sources(set->plan)))->resultDesc,
				  set);
}

static bool
is_bit_metric(KnnMetric metric)
{
	return metric == KNN_METRIC_HAMMING || metric == KNN_METRIC_JACCARD;
}

/*
 * The engine's element type for the two sets and the metric: bits for bit
 * columns (hamming, jaccard only); float16 where a halfvec meets a halfvec
 * or a vector (pgvector's implicit cast vector -> halfvec: the vector is
 * rounded to halfvec, as "h <-> v" would); float32 otherwise.
 */
static KnnElement
knn_join_element(const KnnSet *queries, const KnnSet *targets, KnnMetric metric)
{
	KnnElement	element;

	if (queries->kind == KNN_VECTOR_BIT || targets->kind == KNN_VECTOR_BIT)
	{
		if (queries->kind != targets->kind)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("cannot join %s with %s",
							format_type_be(queries->vector_type),
							format_type_be(targets->vector_type)),
					 errdetail("Bit strings join only bit strings.")));
		element = KNN_ELEMENT_BIT;
	}
	else if (queries->kind == KNN_VECTOR_HALFVEC || targets->kind == KNN_VECTOR_HALFVEC)
	{
		const KnnSet *other = queries->kind == KNN_VECTOR_HALFVEC ? targets : queries;

		if (other->kind != KNN_VECTOR_HALFVEC && other->kind != KNN_VECTOR_TYPE)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("cannot join %s with %s",
							format_type_be(queries->vector_type),
							format_type_be(targets->vector_type)),
					 errhint("Cast the %s column to halfvec in its query text.", other->arg)));
		element = KNN_ELEMENT_FLOAT16;
	}
	else
		element = KNN_ELEMENT_FLOAT32;

	if ((element == KNN_ELEMENT_BIT) != is_bit_metric(metric))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("metric %s does not apply to %s columns", knn_metric_name(metric),
						format_type_be(queries->vector_type)),
				 element == KNN_ELEMENT_BIT
				 ? errhint("Bit strings take the metrics hamming and jaccard.")
				 : errhint("hamming and jaccard are the metrics of bit strings; vectors take l2, cosine, ip and l1.")));
	return element;
}

/* Are the group columns of the rows of the types the text was prepared with? */
static bool
same_group_types(TupleDesc desc, const KnnJoinGroupColumns *groups)
{
	for (int i = 0; i < groups->n; i++)
		if (SPI_gettypeid(desc, 3 + i) != groups->types[i])
			return false;
	return true;
}

/*
 * Runs one set's prepared query and appends its rows to the matrix, read
 * by `reader`. Rows whose vector is NULL are skipped; a NULL id is an error.
 */
static void
read_set(const KnnSet *set, const KnnVectorReader *reader, KnnMatrix *matrix,
		 KnnGroupKeys *groups)
{
	Portal		portal;
	bool		checked = false;

	portal = SPI_cursor_open(NULL, set->plan, NULL, NULL, true);
	for (;;)
	{
		TupleDesc	desc;

		SPI_cursor_fetch(portal, true, KNN_FETCH_BATCH);
		desc = SPI_tuptable->tupdesc;
		/* the rows must be of the types the reader was chosen for */
		if (!checked)
		{
			if (desc->natts != set->natts || SPI_gettypeid(desc, 1) != set->id_type ||
				SPI_gettypeid(desc, 2) != set->vector_type ||
				!same_group_types(desc, &set->groups))
				ereport(ERROR,
						(errcode(ERRCODE_DATATYPE_MISMATCH),
						 errmsg("%s changed its column types while it ran", set->arg)));
			checked = true;
		}

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
						 errmsg("%s returned a NULL id", set->arg)));
			if (vector_null)
				continue;		/* documented: rows without a vector take no part */
			if (groups != NULL)
			{
				int64		group = knn_join_row_group(groups, &set->groups, tuple, desc);

				/* a NULL key equals nothing, as "t.g = q.g" in SQL */
				if (group == KNN_GROUP_NULL)
					continue;
				knn_matrix_append_grouped(matrix, read_id(id, set->id_type), group, vector,
										  reader);
			}
			else
				knn_matrix_append(matrix, read_id(id, set->id_type), vector, reader);
			CHECK_FOR_INTERRUPTS();
		}
		if (SPI_processed < KNN_FETCH_BATCH)
			break;
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
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
	KnnSet		query_set = {0};
	KnnSet		target_text = {0};
	KnnSet	   *target_source = &target_text;
	KnnElement	element;
	MemoryContext caller_context;
	MemoryContext old_context;
	KnnMatrix	queries;
	KnnMatrix	target_set;
	KnnMatrix  *targets = &target_set;
	KnnProblem	problem;
	KnnStats	stats;
	KnnJoinRecord record;
	KnnGroupKeys *groups;
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
	caller_context = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	query_set.sql = queries_sql;
	query_set.arg = "queries";
	prepare_set(&query_set);
	if (strcmp(queries_sql, targets_sql) == 0)
		target_source = &query_set;
	else
	{
		target_text.sql = targets_sql;
		target_text.arg = "targets";
		prepare_set(&target_text);
	}
	element = knn_join_element(&query_set, target_source, metric);
	/* Group keys of both sets map to one set of group ids (SPI's context). */
	groups = knn_join_group_keys(&query_set.groups, &target_source->groups);
	/* The matrices outlive SPI_finish: they live in the caller's context. */
	old_context = MemoryContextSwitchTo(caller_context);
	knn_matrix_init(&queries, "query", element);
	knn_matrix_init(targets, "target", element);
	if (groups != NULL)
	{
		knn_matrix_use_groups(&queries);
		knn_matrix_use_groups(targets);
	}
	MemoryContextSwitchTo(old_context);

	/*
	 * The same text without volatile functions gives the same rows again in
	 * this snapshot: read it once, and the engine sees one matrix on both
	 * sides, a self-join (shared clustering, the symmetric Gram matrix).
	 */
	read_set(&query_set, knn_vector_reader_for(query_set.kind, element), &queries, groups);
	if (target_source == &query_set && query_set.stable)
		targets = &queries;
	else
		read_set(target_source, knn_vector_reader_for(target_source->kind, element), targets,
				 groups);
	SPI_finish();

	if (queries.n == 0 || targets->n == 0)
		PG_RETURN_NULL();
	if (queries.dim != targets->dim && element == KNN_ELEMENT_BIT)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different bit lengths: query bit strings have %d bits but target bit strings have %d",
						queries.dim, targets->dim)));
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
