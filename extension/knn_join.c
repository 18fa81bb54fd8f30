/*
 * knn_join.c -- knn_join(queries text, targets text, k, metric,
 * exclude_self, method): for every row of the query set, the k nearest rows
 * of the target set; and knn_gpu_info().
 *
 * Each text is one plain SELECT returning (integer id, vector | halfvec |
 * bit | real[] | double precision[]), optionally followed by group key
 * columns (knn_join_groups.h: a query meets only targets of equal keys), run through
 * SPI with the caller's privileges, with the bind parameters of params
 * (knn_join_params.h). Rows are read through a cursor in
 * batches into one matrix per set (float32, float16 for halfvec, bits for
 * bit: knn_join_element), sorted by id (so the engine's
 * tie order, by row, is the order by id), handed to the engine in one
 * call, and the result is returned as a materialised set, or as the
 * engine's arrays to the custom scan that called it (knn_join_call_direct).
 *
 * The overload with a key argument takes ids of the key's type (any type
 * with a default btree ordering): they are read as values, and the engine
 * sees their ranks in that order (knn_key_order.h), so ties are broken by
 * the key's order and exclude_self compares keys by their equality.
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
#include "nodes/params.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/plancache.h"
#include "utils/tuplestore.h"

#include "knn_join_function_scan.h"
#include "knn_join_groups.h"
#include "knn_join_params.h"
#include "knn_key_order.h"
#include "knn_matrix.h"
#include "knn_operator_values.h"
#include "knn_progress.h"
#include "knn_run.h"
#include "knn_settings.h"
#include "knn_shard.h"
#include "knn_shard_packed.h"
#include "knn_shard_receive.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

#define KNN_FETCH_BATCH 10000
/* Rows handed back between two looks at the interrupt flags. */
#define KNN_RETURN_SLICE 4096
/* How much of a user's argument an error message quotes. */
#define KNN_QUOTE_LIMIT 32

/* At most KNN_QUOTE_LIMIT characters of a user's text, "..." if cut. */
static char *
quoted_prefix(const char *text)
{
	int			len = pg_mbcliplen(text, strlen(text), KNN_QUOTE_LIMIT);

	return psprintf("%.*s%s", len, text, text[len] != '\0' ? "..." : "");
}

/* An argument that must not be NULL; ERROR naming it (and the function) otherwise. */
static void
require_argument(FunctionCallInfo fcinfo, int n, const char *name)
{
	if (PG_ARGISNULL(n))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s: %s must not be NULL", get_func_name(fcinfo->flinfo->fn_oid),
						name)));
}

static char *
text_argument(FunctionCallInfo fcinfo, int n, const char *name)
{
	require_argument(fcinfo, n, name);
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

/* What a call of knn_join asks for. */
typedef struct KnnJoinCall
{
	char	   *queries_sql;
	char	   *targets_sql;
	int32		k;
	KnnMetric	metric;
	bool		exclude_self;
	KnnMethod	method;
	Oid			key_type;		/* InvalidOid: integer ids, returned as bigint */
	bool		has_params;
	KnnJoinParams params;
	/* knn_range_join: every pair within radius, k (0 = none) per query */
	bool		range;
	double		radius;
	bool		inclusive;		/* <= radius, else < radius */
	bool		packed;			/* knn_join_packed: rows packed into bytea values */
	bool		received;		/* the queries: received set received_set (knn_shard_receive.h) */
	int64		received_set;
	bool		with_held;		/* and the targets held for it (knn_held_queries_take) */
} KnnJoinCall;

/* One set of knn_join: its query text, prepared, and its columns. */
typedef struct KnnSet
{
	const char *sql;
	const char *arg;			/* "queries" or "targets", for messages */
	SPIPlanPtr	plan;
	Datum	   *param_values;	/* the bind parameters, or NULL */
	char	   *param_nulls;
	Oid			key_type;		/* the call's, InvalidOid for integer ids */
	Oid			key_collation;
	KnnKeyColumn *keys;			/* the key values read (keyed calls) */
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
	if (OidIsValid(set->key_type))
	{
		/*
		 * The column's values are returned as the key's type: a column of
		 * a domain over it is fine, a plain column for a domain key is not
		 * (its values were never checked against the domain).
		 */
		if (set->id_type != set->key_type &&
			(getBaseType(set->key_type) != set->key_type ||
			 getBaseType(set->id_type) != set->key_type))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("the first column of %s is of type %s, not of the key's type %s",
							set->arg, format_type_be(set->id_type),
							format_type_be(set->key_type)),
					 errhint("Cast the id column in the query text, or pass key => NULL::%s.",
							 format_type_be(set->id_type))));
		knn_key_check_type(set->id_type, set->arg);
		set->key_collation = TupleDescAttr(desc, 0)->attcollation;
	}
	else if (set->id_type != INT2OID && set->id_type != INT4OID && set->id_type != INT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the first column of %s must be an integer id, not %s",
						set->arg, format_type_be(set->id_type)),
				 errhint("Pass key => NULL::%s to join ids of that type.",
						 format_type_be(set->id_type))));
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
prepare_set(KnnSet *set, const KnnJoinCall *call)
{
	set->key_type = call->key_type;
	if (call->has_params)
		set->plan = knn_join_params_prepare(set->sql, set->arg, &call->params,
											&set->param_values, &set->param_nulls);
	else
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

/*
 * The query set of knn_join_received_packed: the rows a coordinator
 * shipped (int8 ids, vectors of the received type), taken when read.
 */
static void
describe_received_set(KnnSet *set, int64 received_set, bool with_held)
{
	set->natts = 2;
	set->id_type = INT8OID;
	set->vector_type = with_held ? knn_held_queries_type(received_set) :
		knn_received_queries_type(received_set);
	set->kind = knn_vector_kind(set->vector_type);
	set->stable = true;
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
 * The engine id of a row about to be appended: the integer id, or for a
 * keyed call the key's row number (ranked once all rows are read).
 */
static int64
row_id(KnnSet *set, Datum id, const KnnMatrix *matrix)
{
	int64		row;

	if (!OidIsValid(set->key_type))
		return read_id(id, set->id_type);
	row = knn_key_column_add(set->keys, id);
	Assert(row == matrix->n);
	return row;
}

/* The row being read, for the error context of keyed calls. */
typedef struct KeyedRowContext
{
	const KnnSet *set;
	Datum		key;
	bool		valid;
} KeyedRowContext;

/*
 * A keyed call's matrix names rows by number in its messages ("query id
 * 5"): the context names the row by its key.
 */
static void
keyed_row_context(void *arg)
{
	KeyedRowContext *row = (KeyedRowContext *) arg;
	Oid			output;
	bool		varlena;

	if (!row->valid)
		return;
	getTypeOutputInfo(row->set->key_type, &output, &varlena);
	errcontext("%s row with the key %s", row->set->arg,
			   quoted_prefix(OidOutputFunctionCall(output, row->key)));
}

/*
 * A row's id and vector (the first two columns), counted as read: false
 * for a row without a vector (documented: such rows take no part), ERROR
 * for a NULL id.
 */
static bool
row_id_and_vector(HeapTuple tuple, TupleDesc desc, const char *arg, Datum *id, Datum *vector)
{
	bool		id_null;
	bool		vector_null;

	*id = SPI_getbinval(tuple, desc, 1, &id_null);
	*vector = SPI_getbinval(tuple, desc, 2, &vector_null);
	if (id_null)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s returned a NULL id", arg)));
	knn_progress_rows(1);
	return !vector_null;
}

/*
 * Runs one set's prepared query and appends its rows to the matrix, read
 * by `reader`. Rows whose vector is NULL are skipped; a NULL id is an error.
 */
static void
read_set(KnnSet *set, const KnnVectorReader *reader, KnnMatrix *matrix,
		 KnnGroupKeys *groups, KnnShardEarly *shipping)
{
	Portal		portal;
	bool		checked = false;
	KeyedRowContext row = {set, (Datum) 0, false};
	ErrorContextCallback callback = {error_context_stack, keyed_row_context, &row};

	if (set->keys != NULL)
		error_context_stack = &callback;
	portal = SPI_cursor_open(NULL, set->plan, set->param_values, set->param_nulls, true);
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
			Datum		id;
			Datum		vector;

			if (!row_id_and_vector(tuple, desc, set->arg, &id, &vector))
				continue;
			row.key = id;
			row.valid = set->keys != NULL;
			if (groups != NULL)
			{
				int64		group = knn_join_row_group(groups, &set->groups, tuple, desc);

				/* a NULL key equals nothing, as "t.g = q.g" in SQL */
				if (group == KNN_GROUP_NULL)
					continue;
				knn_matrix_append_grouped(matrix, row_id(set, id, matrix), group, vector,
										  reader);
			}
			else
				knn_matrix_append(matrix, row_id(set, id, matrix), vector, reader);
			/* the query rows go to the shards as they are read (knn_shard.h) */
			knn_shard_queries_added(shipping, matrix);
			CHECK_FOR_INTERRUPTS();
		}
		row.valid = false;
		if (SPI_processed < KNN_FETCH_BATCH)
			break;
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	if (set->keys != NULL)
		error_context_stack = callback.previous;
}

/* Hands the engine's result back as rows. */
static void
return_rows(ReturnSetInfo *rsinfo, const KnnMatrix *queries, const KnnMatrix *targets,
			const KnnKeyColumn *query_keys, const KnnKeyColumn *target_keys,
			int32 slots, const int64 *neighbors, const double *distances,
			KnnPackedRows *packed)
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
			knn_prefetch_target(targets->ids, target_keys != NULL ? target_keys->by_rank : NULL,
								neighbors, q * slots + r, queries->n * slots);
			if (packed != NULL)
			{
				/* knn_join_packed (integer ids only): a row of a packed value */
				knn_packed_put(packed, queries->ids[q], targets->ids[t], distances[q * slots + r]);
				continue;
			}
			if (query_keys != NULL)
			{
				/* keyed: ids are ranks of the keys (knn_key_order.h) */
				values[0] = query_keys->by_rank[queries->ids[q]];
				values[1] = target_keys->by_rank[targets->ids[t]];
			}
			else
			{
				values[0] = Int64GetDatum(queries->ids[q]);
				values[1] = Int64GetDatum(targets->ids[t]);
			}
			values[2] = Int32GetDatum(r + 1);
			values[3] = Float8GetDatum(distances[q * slots + r]);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			if (++emitted % KNN_RETURN_SLICE == 0)
			{
				knn_progress_rows(KNN_RETURN_SLICE);
				CHECK_FOR_INTERRUPTS();
			}
		}
	}
}

/* Where a range join's pairs go: the result, ranked within each query. */
typedef struct RangeOutput
{
	ReturnSetInfo *rsinfo;
	const KnnMatrix *queries;
	const KnnMatrix *targets;
	const KnnKeyColumn *query_keys;
	const KnnKeyColumn *target_keys;
	int64		query_row;		/* of the last pair, -1 before the first */
	int64		rank;			/* of the last pair within its query */
	int64		emitted;
} RangeOutput;

/* KnnPairSink: the engine's pairs as result rows, as they come. */
static void
put_range_pairs(void *arg, const int64 *query_rows, const int64 *target_rows,
				const double *distances, int64 n)
{
	RangeOutput *out = (RangeOutput *) arg;

	for (int64 i = 0; i < n; i++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};
		int64		q = query_rows[i];
		int64		t = target_rows[i];

		if (q < 0 || q >= out->queries->n || t < 0 || t >= out->targets->n)
			elog(ERROR, "knn_range_join: the engine returned a row out of range");
		out->rank = q == out->query_row ? out->rank + 1 : 1;
		out->query_row = q;
		if (out->rank > PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("knn_range_join: more than %d pairs for one query", PG_INT32_MAX),
					 errhint("Cap the pairs per query with k.")));
		if (out->query_keys != NULL)
		{
			values[0] = out->query_keys->by_rank[out->queries->ids[q]];
			values[1] = out->target_keys->by_rank[out->targets->ids[t]];
		}
		else
		{
			values[0] = Int64GetDatum(out->queries->ids[q]);
			values[1] = Int64GetDatum(out->targets->ids[t]);
		}
		values[2] = Int32GetDatum((int32) out->rank);
		values[3] = Float8GetDatum(distances[i]);
		tuplestore_putvalues(out->rsinfo->setResult, out->rsinfo->setDesc, values, nulls);
		if (++out->emitted % KNN_RETURN_SLICE == 0)
			knn_progress_rows(KNN_RETURN_SLICE);
	}
}

/* Keyed calls: the key column of a set, in the caller's context. */
static KnnKeyColumn *
key_column(const KnnSet *set, MemoryContext context)
{
	MemoryContext old = MemoryContextSwitchTo(context);
	KnnKeyColumn *column = palloc(sizeof(KnnKeyColumn));

	knn_key_column_init(column, set->key_type, set->key_collation, set->arg);
	MemoryContextSwitchTo(old);
	return column;
}

/* Keyed calls: one collation orders and compares both sets' keys. */
static void
check_key_collations(const KnnSet *queries, const KnnSet *targets)
{
	if (targets != queries && queries->key_collation != targets->key_collation)
		ereport(ERROR,
				(errcode(ERRCODE_COLLATION_MISMATCH),
				 errmsg("the keys of queries and targets have different collations"),
				 errhint("Use COLLATE on the id column of one query text.")));
}

/* Plain EXPLAIN's call (knn_join_describe): find the shards, read and join nothing. */
static bool describe_only = false;

/* The custom scan's call (knn_join_call_direct): where the arrays go, or NULL. */
static KnnJoinDirect *direct_result = NULL;

/* A packed form called value per call (packed_call): its arrays go to direct_result too. */
static bool packed_per_call = false;

/*
 * The call's shards, when its targets are sharded (knn_shard.h): the
 * whole join, or with describe_only their description. Keyed calls join
 * here (with a NOTICE when there are shards): their ids' order is this
 * server's type's, which the shards' ranks could not be merged by.
 */
static void
shard_join(const KnnJoinCall *call, KnnSet *targets, KnnOperatorValues *by_operator,
		   KnnPackedRows *packed, KnnShardJoin *shard_call)
{
	KnnShardJoin join = {0};
	ParamListInfo params = NULL;

	join.k = call->k;
	join.metric = call->metric;
	join.exclude_self = call->exclude_self;
	join.method = call->method;
	join.range = call->range;
	join.radius = call->radius;
	join.inclusive = call->inclusive;
	join.by_operator = by_operator;
	join.describe_only = describe_only;
	join.packed = packed;
	if (OidIsValid(call->key_type))
		join.not_pushed = "calls with a key argument are joined here";
	if (targets->param_values != NULL)
	{
		CachedPlanSource *source = linitial(SPI_plan_get_plan_sources(targets->plan));

		params = makeParamList(source->num_params);
		for (int i = 0; i < source->num_params; i++)
		{
			params->params[i].value = targets->param_values[i];
			params->params[i].isnull = targets->param_nulls[i] == 'n';
			params->params[i].pflags = PARAM_FLAG_CONST;
			params->params[i].ptype = source->param_types[i];
		}
		join.params = params;
	}
	*shard_call = join;
}

void
knn_join_describe(FuncExpr *call)
{
	FmgrInfo	flinfo;
	ReturnSetInfo rsinfo = {T_ReturnSetInfo};
	ListCell   *lc;
	int			n = 0;
	LOCAL_FCINFO(fcinfo, FUNC_MAX_ARGS);

	fmgr_info(call->funcid, &flinfo);
	fmgr_info_set_expr((Node *) call, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, list_length(call->args), call->inputcollid,
							 NULL, (Node *) &rsinfo);
	foreach(lc, call->args)
	{
		Const	   *arg = lfirst_node(Const, lc);

		fcinfo->args[n].value = arg->constvalue;
		fcinfo->args[n].isnull = arg->constisnull;
		n++;
	}
	rsinfo.econtext = CreateStandaloneExprContext();
	rsinfo.allowedModes = SFRM_Materialize;
	describe_only = true;
	PG_TRY();
	{
		(void) FunctionCallInvoke(fcinfo);
	}
	PG_FINALLY();
	{
		describe_only = false;
	}
	PG_END_TRY();
	FreeExprContext(rsinfo.econtext, true);
}

/* A matrix's vectors, once the engine is done with them (the direct result keeps the ids). */
static void
drop_vectors(KnnMatrix *m)
{
	if (m->shared == NULL && m->values != NULL)
	{
		pfree(m->values);
		m->values = NULL;
	}
}

bool
knn_join_call_direct(FunctionCallInfo fcinfo, KnnJoinDirect *result)
{
	memset(result, 0, sizeof(*result));
	direct_result = result;
	PG_TRY();
	{
		(void) FunctionCallInvoke(fcinfo);
	}
	PG_FINALLY();
	{
		direct_result = NULL;
	}
	PG_END_TRY();
	/* the engine's arrays, or a sharded call's merged lists */
	return result->neighbors != NULL || result->offsets != NULL;
}

/*
 * The engine's join of these query rows (all of them, or a batch) with the
 * targets, ranked by pgvector's operator where by_operator is given.
 */
static void
run_join_problem(const KnnJoinCall *call, KnnMatrix *queries, KnnMatrix *targets, int32 slots,
				 KnnOperatorValues *by_operator, int64 *neighbors, double *distances,
				 KnnProblem *problem, KnnStats *stats)
{
	knn_matrix_join_problem(problem, queries, targets, slots, call->metric, call->method,
							call->exclude_self);
	knn_progress_phase(KNN_PROGRESS_ENGINE);
	if (by_operator != NULL)
		knn_operator_values_run(by_operator, problem, queries, targets, neighbors, distances,
								stats);
	else
		knn_run_problem(problem, neighbors, distances, stats);
}

/*
 * A join whose result arrays would pass knn_gpu.max_result_memory (k is
 * the caller's: |Q| x k x 16 bytes can be far more than the server has):
 * the engine runs on batches of per_run query rows, and each batch's rows
 * go into the tuplestore (which spills past work_mem) before the next
 * runs. Each query's neighbours are its own, so the rows are the same, in
 * the same order.
 */
static void
join_in_batches(ReturnSetInfo *rsinfo, const KnnJoinCall *call, KnnMatrix *queries,
				KnnMatrix *targets, const KnnKeyColumn *query_keys,
				const KnnKeyColumn *target_keys, int32 slots, int64 per_run,
				KnnOperatorValues *by_operator, KnnPackedRows *packed,
				double seconds_read, double seconds_sort)
{
	int64	   *neighbors = MemoryContextAllocHuge(CurrentMemoryContext,
												   (Size) per_run * slots * sizeof(int64));
	double	   *distances = MemoryContextAllocHuge(CurrentMemoryContext,
												   (Size) per_run * slots * sizeof(double));
	KnnProblem	problem;
	KnnStats	total;
	KnnJoinRecord record;
	double		seconds_return = 0;

	knn_progress_totals(queries->n, targets->n, -1);
	for (int64 first = 0; first < queries->n; first += per_run)
	{
		KnnMatrix	part = *queries;
		KnnStats	stats;
		instr_time	start;

		part.n = Min(per_run, queries->n - first);
		part.values += first * queries->row_bytes;
		part.ids += first;
		if (part.groups != NULL)
			part.groups += first;
		run_join_problem(call, &part, targets, slots, by_operator, neighbors, distances,
						 &problem, &stats);
		knn_stats_add(&total, &stats, first == 0);
		knn_progress_work(total.distance_computations);
		knn_progress_phase(KNN_PROGRESS_RETURNING);
		INSTR_TIME_SET_CURRENT(start);
		return_rows(rsinfo, &part, targets, query_keys, target_keys, slots, neighbors, distances,
					packed);
		seconds_return += knn_seconds_since(start);
	}
	pfree(neighbors);
	pfree(distances);
	/* the record is the whole join's */
	problem.n_queries = queries->n;
	knn_stats_record(&record, &problem, &total, seconds_read, seconds_sort, seconds_return);
	knn_join_explain_report(&record);
}

static void
knn_join_run(FunctionCallInfo fcinfo, const KnnJoinCall *call)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	/* this call's, not that of a knn_join its texts may call */
	KnnJoinDirect *direct = call->range || (call->packed && !packed_per_call) ? NULL : direct_result;
	/* packed into the ReturnSetInfo's tuplestore here (not value per call) */
	bool		pack_here = call->packed && direct == NULL;
	KnnSet		query_set = {0};
	KnnSet		target_text = {0};
	KnnSet	   *target_source = &target_text;
	KnnElement	element;
	MemoryContext caller_context;
	MemoryContext old_context;
	KnnMatrix	queries;
	KnnMatrix	target_set;
	KnnMatrix  *targets = &target_set;
	KnnKeyColumn *target_keys = NULL;
	KnnProblem	problem;
	KnnStats	stats;
	KnnJoinRecord record;
	KnnGroupKeys *groups;
	int64	   *neighbors;
	double	   *distances;
	int32		slots;
	int64		per_run;
	KnnOperatorValues operator_values;
	bool		by_operator;
	Oid			operand_type;
	instr_time	start;
	double		seconds_read;
	double		seconds_sort;
	KnnPackedRows packed;
	KnnShardJoin shard_call;
	KnnShardEarly *shards = NULL;
	instr_time	queries_start;
	bool		targets_taken = false;	/* a view of the held queries' first rows */

	direct_result = NULL;
	packed_per_call = false;

	/*
	 * knn_join_packed returns bytea values, not rows: the caller's one-column
	 * descriptor. The others take the caller's descriptor too where it
	 * gives one (a Function Scan, a target list): the result type looked up
	 * from the catalog instead (get_call_result_type) leaves its scratch
	 * (about 0.8 kB) in the query's memory on every call, which a call per
	 * row (LATERAL, a target list) piles up until the statement ends.
	 */
	if (!call->packed || pack_here)
		InitMaterializedSRF(fcinfo, call->packed || rsinfo->expectedDesc != NULL ?
							MAT_SRF_USE_EXPECTED_DESC : 0);
	if (pack_here)
		knn_packed_begin(&packed, rsinfo);

	INSTR_TIME_SET_CURRENT(start);
	caller_context = CurrentMemoryContext;
	knn_progress_begin(call->range ? "knn_range_join" : "knn_join", call->k);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	query_set.sql = call->queries_sql;
	query_set.arg = "queries";
	if (call->received)
		describe_received_set(&query_set, call->received_set, call->with_held);
	else
		prepare_set(&query_set, call);
	if (!call->received && strcmp(call->queries_sql, call->targets_sql) == 0)
		target_source = &query_set;
	else
	{
		target_text.sql = call->targets_sql;
		target_text.arg = "targets";
		prepare_set(&target_text, call);
	}
	element = knn_join_element(&query_set, target_source, call->metric);
	/* Group keys of both sets map to one set of group ids (SPI's context). */
	groups = knn_join_group_keys(&query_set.groups, &target_source->groups);
	if (OidIsValid(call->key_type))
	{
		check_key_collations(&query_set, target_source);
		query_set.keys = key_column(&query_set, caller_context);
		if (target_source != &query_set)
			target_text.keys = key_column(&target_text, caller_context);
	}
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
	/*
	 * pgvector's columns: rank by the values of the operator SQL resolves
	 * between them, pgvector's own (knn_operator_values_type).
	 */
	operand_type = knn_operator_values_type(query_set.vector_type, target_source->vector_type);
	by_operator = OidIsValid(operand_type) &&
		knn_operator_values_init(&operator_values, operand_type, call->metric, element);
	/* Sharded targets (postgres_fdw partitions) join on their servers: knn_shard.h. */
	shard_join(call, target_source, by_operator ? &operator_values : NULL,
			   pack_here ? &packed : NULL, &shard_call);
	/* a sharded call's merged rows go to the custom scan's arrays too */
	shard_call.direct = direct;
	shard_call.fcinfo = fcinfo;
	/* the other shards' rows relayed into the held rows: those rows, no copy; else copied after the received */
	if (call->received && call->with_held && !describe_only)
	{
		if (groups != NULL ||
			!knn_held_rows_take(call->received_set, target_source->sql, target_source->vector_type,
								&queries, targets, &targets_taken))
			knn_held_queries_take(call->received_set, &queries);
	}
	else if (call->received && !describe_only)
		knn_received_queries_take(call->received_set, &queries);
	else if (!describe_only)
	{
		/* the shards read their targets meanwhile */
		/* a stable self-join's rows may come from the shards that read them (knn_shard.h) */
		shards = knn_shard_start(query_set.plan, target_source->plan, element, groups != NULL,
								 &shard_call, target_source == &query_set && query_set.stable);
		INSTR_TIME_SET_CURRENT(queries_start);
		PG_TRY();
		{
			const KnnVectorReader *reader = knn_vector_reader_for(query_set.kind, element);

			if (!knn_shard_read_queries(shards, &queries))
				read_set(&query_set, reader, &queries, groups, shards);
		}
		PG_CATCH();
		{
			/* rows shipped meanwhile: the connections are left to postgres_fdw's cleanup */
			knn_shard_queries_failed(shards);
			PG_RE_THROW();
		}
		PG_END_TRY();
		knn_shard_queries_read(shards, knn_seconds_since(queries_start));
	}
	knn_progress_phase(KNN_PROGRESS_READING_TARGETS);
	if (knn_shard_try_join(rsinfo, &queries, target_source->plan, target_source->sql,
						   target_source->kind, &shard_call, shards) ||
		describe_only)
	{
		/* merged: the result lists hold their own ids, the queries need not wait for the scan's end */
		knn_matrix_free(&queries);
		if (pack_here)
			knn_packed_end(&packed);
		SPI_finish();
		knn_progress_end();
		return;
	}
	if (target_source == &query_set && query_set.stable)
	{
		targets = &queries;
		target_keys = query_set.keys;
	}
	else
	{
		KnnKeyColumn *query_keys = query_set.keys;

		/* The same volatile text, read again: its keys of their own. */
		if (target_source == &query_set && query_keys != NULL)
			query_set.keys = key_column(&query_set, caller_context);
		/* a shard's targets may have been read ahead of its queries (knn_shard_receive.h) */
		if (!targets_taken &&
			!(call->received && groups == NULL &&
			  knn_held_targets_take(call->received_set, target_source->sql,
									target_source->vector_type, targets)))
			read_set(target_source, knn_vector_reader_for(target_source->kind, element), targets,
					 groups, NULL);
		target_keys = target_source->keys;
		query_set.keys = query_keys;
	}
	SPI_finish();

	if (queries.n == 0 || targets->n == 0)
	{
		knn_progress_end();
		return;
	}
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
	seconds_read = knn_seconds_since(start);

	knn_progress_phase(KNN_PROGRESS_SORTING);
	INSTR_TIME_SET_CURRENT(start);
	if (query_set.keys != NULL)
		knn_key_columns_rank(query_set.keys, queries.ids,
							 targets != &queries ? target_keys : NULL,
							 targets != &queries ? targets->ids : NULL);
	/*
	 * A shard's packed pairs of received queries go back keyed by query id
	 * (the coordinator puts them in its order): their order here is no one's.
	 */
	if (!(call->received && call->packed))
		knn_matrix_sort_by_id(&queries);
	if (targets != &queries)
		knn_matrix_sort_by_id(targets);
	seconds_sort = knn_seconds_since(start);

	if (call->range)
	{
		RangeOutput output = {rsinfo, &queries, targets, query_set.keys, target_keys, -1, 0, 0};

		knn_matrix_join_problem(&problem, &queries, targets, call->k, call->metric, call->method,
								call->exclude_self);
		problem.max_distance = call->radius;
		problem.range = call->inclusive ? KNN_RANGE_AT_MOST : KNN_RANGE_BELOW;
		knn_progress_totals(queries.n, targets->n, -1);
		knn_progress_phase(KNN_PROGRESS_ENGINE);
		/*
		 * The pairs go into the result while the engine works: no return
		 * phase. pgvector's columns: the radius applies to its operator's
		 * values.
		 */
		if (by_operator)
			knn_operator_values_range(&operator_values, &problem, &queries, targets,
									  put_range_pairs, &output, &stats);
		else
			knn_run_range_problem(&problem, put_range_pairs, &output, &stats);
		knn_progress_work(stats.distance_computations);
		knn_stats_record(&record, &problem, &stats, seconds_read, seconds_sort, 0);
		knn_join_explain_report(&record);
		knn_progress_end();
		return;
	}

	/* k past the target count returns every target: no need for more slots. */
	slots = (int32) Min((int64) call->k, targets->n);
	per_run = knn_result_rows_per_run(slots);
	if (per_run < queries.n)
	{
		/* too large to hold: batches through the tuplestore, not the custom scan's arrays */
		if (call->packed && !pack_here)
		{
			InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
			knn_packed_begin(&packed, rsinfo);
		}
		join_in_batches(rsinfo, call, &queries, targets, query_set.keys, target_keys, slots,
						per_run, by_operator ? &operator_values : NULL,
						call->packed ? &packed : NULL, seconds_read, seconds_sort);
		if (call->packed)
			knn_packed_end(&packed);
		knn_progress_end();
		return;
	}
	knn_progress_totals(queries.n, targets->n, -1);
	neighbors = MemoryContextAllocHuge(CurrentMemoryContext, (Size) queries.n * slots * sizeof(int64));
	distances = MemoryContextAllocHuge(CurrentMemoryContext, (Size) queries.n * slots * sizeof(double));

	run_join_problem(call, &queries, targets, slots, by_operator ? &operator_values : NULL,
					 neighbors, distances, &problem, &stats);
	knn_progress_work(stats.distance_computations);
	knn_progress_totals(queries.n, targets->n, stats.pairs);
	knn_progress_phase(KNN_PROGRESS_RETURNING);

	if (direct != NULL)
	{
		/* The custom scan returns the rows (and measures that). */
		drop_vectors(&queries);
		/* (targets taken as a view of the queries' first rows have no vectors of their own) */
		if (targets != &queries && !targets_taken)
			drop_vectors(targets);
		direct->n_queries = queries.n;
		direct->slots = slots;
		direct->query_ids = queries.ids;
		direct->target_ids = targets->ids;
		direct->neighbors = neighbors;
		direct->distances = distances;
		direct->query_keys = query_set.keys != NULL ? query_set.keys->by_rank : NULL;
		direct->target_keys = target_keys != NULL ? target_keys->by_rank : NULL;
		knn_stats_record(&record, &problem, &stats, seconds_read, seconds_sort, 0);
		knn_join_explain_report(&record);
		knn_progress_end();
		return;
	}

	INSTR_TIME_SET_CURRENT(start);
	return_rows(rsinfo, &queries, targets, query_set.keys, target_keys, slots, neighbors,
				distances, pack_here ? &packed : NULL);
	if (pack_here)
		knn_packed_end(&packed);
	knn_stats_record(&record, &problem, &stats, seconds_read, seconds_sort,
					 knn_seconds_since(start));
	knn_join_explain_report(&record);
	knn_progress_end();
}

/* Runs the call, closing its progress row on the way out of an ERROR too; its record goes to the node that made it. */
static void
knn_join_run_reported(FunctionCallInfo fcinfo, const KnnJoinCall *call)
{
	void	   *outer = knn_join_explain_enter();

	PG_TRY();
	{
		knn_join_run(fcinfo, call);
	}
	PG_CATCH();
	{
		knn_join_explain_leave(outer);
		knn_progress_end();
		PG_RE_THROW();
	}
	PG_END_TRY();
	knn_join_explain_leave(outer);
}

/*
 * The arguments every form has: targets and k (at targets_arg and the one
 * after), then metric, exclude_self and method at the given positions.
 */
static void
read_join_arguments(FunctionCallInfo fcinfo, KnnJoinCall *call, int targets_arg, int metric_arg,
					int exclude_self_arg, int method_arg)
{
	call->targets_sql = text_argument(fcinfo, targets_arg, "targets");
	require_argument(fcinfo, targets_arg + 1, "k");
	call->k = PG_GETARG_INT32(targets_arg + 1);
	call->metric = (KnnMetric) named_argument(fcinfo, metric_arg, "metric", knn_metric_names);
	require_argument(fcinfo, exclude_self_arg, "exclude_self");
	call->exclude_self = PG_GETARG_BOOL(exclude_self_arg);
	call->method = (KnnMethod) named_argument(fcinfo, method_arg, "method", knn_method_names);
	if (call->k < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be at least 1, not %d", call->k)));
}

/* The queries text first, then targets and k, and the others at the given positions. */
static void
read_common_arguments(FunctionCallInfo fcinfo, KnnJoinCall *call, int metric_arg,
					  int exclude_self_arg, int method_arg)
{
	memset(call, 0, sizeof(*call));
	call->queries_sql = text_argument(fcinfo, 0, "queries");
	read_join_arguments(fcinfo, call, 1, metric_arg, exclude_self_arg, method_arg);
}

/* params: NULL means none; NULL elements are NULL values. */
static void
read_params_argument(FunctionCallInfo fcinfo, KnnJoinCall *call, int n)
{
	if (PG_ARGISNULL(n))
		return;
	call->has_params = true;
	knn_join_params_read(PG_GETARG_ARRAYTYPE_P(n), &call->params);
}

/*
 * The key argument's type (its value is not used: NULL::uuid is the usual
 * form), for the keyed forms.
 */
static Oid
key_argument_type(FunctionCallInfo fcinfo, int n)
{
	Oid			key_type = get_fn_expr_argtype(fcinfo->flinfo, n);

	if (!OidIsValid(key_type))
		elog(ERROR, "%s: could not determine the key's type", get_func_name(fcinfo->flinfo->fn_oid));
	if (getBaseType(key_type) == RECORDOID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s: the key cannot be an anonymous record",
						get_func_name(fcinfo->flinfo->fn_oid)),
				 errhint("Use a named composite type: key => NULL::my_type.")));
	return key_type;
}

/* knn_join(queries, targets, k, metric, exclude_self, method) */
PG_FUNCTION_INFO_V1(knn_join);
Datum
knn_join(PG_FUNCTION_ARGS)
{
	KnnJoinCall call;

	read_common_arguments(fcinfo, &call, 3, 4, 5);
	knn_join_run_reported(fcinfo, &call);
	PG_RETURN_NULL();
}

/*
 * A packed form's call. Value per call where the caller allows it: the
 * join runs at the first call, its arrays kept in the call's multi-call
 * memory, and each call packs the next value (knn_packed_next), so that,
 * called from a query's target list, each value goes to the coordinator
 * as it is made, with no tuplestore (whose 24 bytes a row spill to disk
 * past work_mem). Otherwise (a caller that only materialises, or EXPLAIN's
 * description) the packed values go into the caller's tuplestore.
 */
static Datum
packed_call(FunctionCallInfo fcinfo, const KnnJoinCall *call)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	FuncCallContext *funcctx;
	KnnPackedCursor *cursor;
	bytea	   *value;

	if (describe_only || rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_ValuePerCall) == 0)
	{
		knn_join_run_reported(fcinfo, call);
		PG_RETURN_NULL();
	}
	if (SRF_IS_FIRSTCALL())
	{
		MemoryContext old;

		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		cursor = palloc0(sizeof(KnnPackedCursor));
		direct_result = &cursor->result;
		packed_per_call = true;
		PG_TRY();
		{
			knn_join_run_reported(fcinfo, call);
		}
		PG_FINALLY();
		{
			direct_result = NULL;
			packed_per_call = false;
		}
		PG_END_TRY();
		MemoryContextSwitchTo(old);
		funcctx->user_fctx = cursor;
		/* a result too large to hold went into the tuplestore (join_in_batches) */
		if (rsinfo->returnMode == SFRM_Materialize)
		{
			end_MultiFuncCall(fcinfo, funcctx);
			PG_RETURN_NULL();
		}
	}
	funcctx = SRF_PERCALL_SETUP();
	cursor = (KnnPackedCursor *) funcctx->user_fctx;
	/* (no arrays: no rows, the join ended early) */
	if ((cursor->result.neighbors == NULL && cursor->result.offsets == NULL) ||
		(value = knn_packed_next(cursor)) == NULL)
		SRF_RETURN_DONE(funcctx);
	SRF_RETURN_NEXT(funcctx, PointerGetDatum(value));
}

/*
 * knn_join_packed(queries, targets, k, metric, exclude_self, method): the
 * same join, its rows packed for a coordinator (knn_shard_packed.h).
 */
PG_FUNCTION_INFO_V1(knn_join_packed);
Datum
knn_join_packed(PG_FUNCTION_ARGS)
{
	KnnJoinCall call;

	read_common_arguments(fcinfo, &call, 3, 4, 5);
	call.packed = true;
	return packed_call(fcinfo, &call);
}

/* The two joins of a received set below: its rows (and with_held, the targets held for it) as queries. */
static Datum
join_received_packed(FunctionCallInfo fcinfo, bool with_held)
{
	KnnJoinCall call;

	memset(&call, 0, sizeof(call));
	require_argument(fcinfo, 0, "set");
	call.received = true;
	call.with_held = with_held;
	call.received_set = PG_GETARG_INT64(0);
	read_join_arguments(fcinfo, &call, 1, 3, 4, 5);
	call.packed = true;
	return packed_call(fcinfo, &call);
}

/*
 * knn_join_received_packed(set, targets, k, metric, exclude_self, method):
 * knn_join_packed whose queries are the rows a coordinator shipped into
 * this transaction (knn_shard_receive.h).
 */
PG_FUNCTION_INFO_V1(knn_join_received_packed);
Datum
knn_join_received_packed(PG_FUNCTION_ARGS)
{
	return join_received_packed(fcinfo, false);
}

/*
 * knn_join_received_held_packed(set, targets, k, metric, exclude_self,
 * method): knn_join_received_packed of a sharded self-join whose
 * coordinator shipped only the other shards' rows: the queries are those
 * and this server's own, the targets knn_shard_prefetch_self_join holds
 * for the set (knn_held_queries_take).
 */
PG_FUNCTION_INFO_V1(knn_join_received_held_packed);
Datum
knn_join_received_held_packed(PG_FUNCTION_ARGS)
{
	return join_received_packed(fcinfo, true);
}

/*
 * The start of a shard's read of a set's targets: its arguments (set,
 * query_type, targets, metric) into a call and the query set's types
 * (those a coordinator ships queries as: knn_shard_receive_queries's),
 * checked; then, connected to SPI, the targets text prepared as
 * target_set (label names it in messages), of two columns.
 */
static void
held_read_begin(FunctionCallInfo fcinfo, const char *function, const char *label,
				KnnJoinCall *call, KnnSet *query_set, KnnSet *target_set)
{
	memset(call, 0, sizeof(*call));
	require_argument(fcinfo, 0, "set");
	require_argument(fcinfo, 1, "query_type");
	call->received_set = PG_GETARG_INT64(0);
	call->targets_sql = text_argument(fcinfo, 2, "targets");
	call->metric = (KnnMetric) named_argument(fcinfo, 3, "metric", knn_metric_names);
	query_set->natts = 2;
	query_set->vector_type = PG_GETARG_OID(1);
	knn_shard_check_type_exists(query_set->vector_type, function);
	query_set->kind = knn_vector_kind(query_set->vector_type);
	if (getBaseType(query_set->vector_type) != query_set->vector_type ||
		(query_set->kind != KNN_VECTOR_TYPE && query_set->kind != KNN_VECTOR_HALFVEC &&
		 query_set->kind != KNN_VECTOR_BIT))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s takes query types vector, halfvec or bit, not %s",
						function, format_type_be(query_set->vector_type))));

	knn_progress_begin(function, 0);
	knn_progress_phase(KNN_PROGRESS_READING_TARGETS);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	target_set->sql = call->targets_sql;
	target_set->arg = label;
	prepare_set(target_set, call);
	if (target_set->natts != 2)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s reads targets of 2 columns (id, vector), not %d",
						function, target_set->natts)));
}

/*
 * knn_shard_prefetch_targets(set, query_type, targets, metric): a shard
 * reads its targets for set `set`'s join before the coordinator ships the
 * queries (of query_type), as that join would read them (the element
 * query_type, the text's type and the metric give), and holds them for it
 * (knn_shard_receive.h). Returns the rows held and the seconds it took.
 */
static Datum
prefetch_targets(FunctionCallInfo fcinfo, const char *function, const char *label,
				 const char *set_name)
{
	KnnJoinCall call;
	KnnSet		query_set = {0};
	KnnSet		target_set = {0};
	KnnMatrix	targets;
	MemoryContext context;
	MemoryContext old_context;
	instr_time	start;
	TupleDesc	desc;
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};

	INSTR_TIME_SET_CURRENT(start);
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "%s: not called for a record", function);
	held_read_begin(fcinfo, function, label, &call, &query_set, &target_set);
	context = knn_held_targets_begin(call.received_set);
	old_context = MemoryContextSwitchTo(context);
	knn_matrix_init(&targets, set_name, knn_join_element(&query_set, &target_set, call.metric));
	MemoryContextSwitchTo(old_context);
	knn_held_targets_filling(true);
	PG_TRY();
	{
		read_set(&target_set, knn_vector_reader_for(target_set.kind, targets.element), &targets, NULL, NULL);
	}
	PG_FINALLY();
	{
		knn_held_targets_filling(false);
	}
	PG_END_TRY();
	SPI_finish();
	knn_held_targets_keep(call.received_set, call.targets_sql, target_set.vector_type, &targets);
	knn_progress_end();
	values[0] = Int64GetDatum(targets.n);
	values[1] = Float8GetDatum(knn_seconds_since(start));
	/* knn_shard_prefetch_self_join's: what the rows are, checked against the coordinator's columns */
	if (desc->natts == 5)
	{
		for (int column = 2; column <= 3; column++)
		{
			char	   *identity = knn_shard_type_identity(column == 2 ? target_set.id_type :
														   target_set.vector_type);

			nulls[column] = identity == NULL;
			values[column] = identity ? CStringGetTextDatum(identity) : (Datum) 0;
		}
		values[4] = Int32GetDatum(targets.dim);
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

PG_FUNCTION_INFO_V1(knn_shard_prefetch_targets);
Datum
knn_shard_prefetch_targets(PG_FUNCTION_ARGS)
{
	return prefetch_targets(fcinfo, "knn_shard_prefetch_targets", "targets", "target");
}

/*
 * knn_shard_prefetch_self_join(set, query_type, text, metric): the same
 * read for a coordinator whose queries text is its targets text: it takes
 * these rows as its queries too (knn_shard_held_target_blocks), so errors
 * name them as its own query read would ("queries returned a NULL id",
 * "query id 5 has ..."), and the answer says what the rows are (the id and
 * vector columns' types, knn_shard_type_identity, and the dimension), for
 * the coordinator to take them only where its declared columns read the same.
 */
PG_FUNCTION_INFO_V1(knn_shard_prefetch_self_join);
Datum
knn_shard_prefetch_self_join(PG_FUNCTION_ARGS)
{
	return prefetch_targets(fcinfo, "knn_shard_prefetch_self_join", "queries", "query");
}

/*
 * knn_shard_read_held_blocks's state between its calls: the read's cursor
 * (a portal, which outlives each call's SPI connection), the rows read
 * (held for the set's join) and how many were sent.
 */
typedef struct HeldStream
{
	int64		set;
	char	   *portal_name;
	char	   *targets_sql;
	Oid			id_type;
	Oid			vector_type;
	const KnnVectorReader *reader;
	KnnMatrix  *matrix;			/* in the held targets' memory ... */
	uint64		generation;		/* ... while these are the held targets (knn_held_targets_unchanged) */
	int64		sent;
	int32		min_dim;		/* what the coordinator's declared column allows */
	int32		max_dim;
	bool		done;			/* the cursor is read to its end, or closed */
	bool		refused;		/* the refusal is sent: nothing more */
	bool		kept;			/* all sent: held for the join */
	bool		progress;		/* its progress row is open */
	/* where held_stream_shutdown is registered, until the last call */
	ExprContext *shutdown_registered;
} HeldStream;

/*
 * The held rows the stream reads into, or ERROR where they are no longer
 * the ones it began (dropped, read again or rolled back between calls:
 * their memory went with them).
 */
static KnnMatrix *
held_stream_matrix(const HeldStream *st)
{
	if (!knn_held_targets_unchanged(st->set, st->generation))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the targets held for query set " INT64_FORMAT " were dropped while knn_shard_read_held_blocks read them",
						st->set)));
	return st->matrix;
}

/* The stream's cursor closed (where it is still open), its progress row ended. */
static void
held_stream_close(HeldStream *st)
{
	Portal		portal;

	if (!st->done && st->portal_name != NULL &&
		PortalIsValid(portal = GetPortalByName(st->portal_name)))
		SPI_cursor_close(portal);
	st->done = true;
	if (st->progress)
		knn_progress_end();
	st->progress = false;
}

/*
 * The query that called the stream ends before its last value (a LIMIT,
 * a cursor closed): its cursor is closed and the rows it did not finish
 * are not held (an aborted query's go with the transaction).
 */
static void
held_stream_shutdown(Datum arg)
{
	HeldStream *st = (HeldStream *) DatumGetPointer(arg);

	st->shutdown_registered = NULL;
	held_stream_close(st);
	if (!st->kept && !st->refused && knn_held_targets_unchanged(st->set, st->generation))
		knn_held_targets_drop(st->set);
}

/*
 * The stream's last call: the shutdown callback goes before the state it
 * points to (the call's multi-call memory, which SRF_RETURN_DONE frees);
 * it would otherwise run on freed memory when the query ends or rescans.
 */
static void
held_stream_finish(HeldStream *st)
{
	if (st->shutdown_registered != NULL)
		UnregisterExprContextCallback(st->shutdown_registered, held_stream_shutdown,
									  PointerGetDatum(st));
	st->shutdown_registered = NULL;
	held_stream_close(st);
}

/* The one value of a read whose rows are not what the coordinator's columns read. */
static bytea *
held_refusal(void)
{
	bytea	   *value = palloc(VARHDRSZ + 12);
	uint32		header[3] = {pg_hton32(UINT32_MAX), 0, 0};

	SET_VARSIZE(value, VARHDRSZ + 12);
	memcpy(VARDATA(value), header, sizeof(header));
	return value;
}

/* The next batch of the cursor into the stream's matrix, as read_set reads (without keys or groups). */
static void
read_held_batch(HeldStream *st)
{
	Portal		portal;
	TupleDesc	desc;

	KnnMatrix  *matrix = held_stream_matrix(st);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	portal = SPI_cursor_find(st->portal_name);
	if (portal == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_CURSOR_STATE),
				 errmsg("knn_shard_read_held_blocks: the cursor of its read was closed before the read ended"),
				 errhint("Call it from a query that runs to its end in its transaction, not from a cursor WITH HOLD.")));
	/* (the text's functions run in this fetch: none may drop the matrix it fills) */
	knn_held_targets_filling(true);
	PG_TRY();
	{
		SPI_cursor_fetch(portal, true, KNN_FETCH_BATCH);
	}
	PG_FINALLY();
	{
		knn_held_targets_filling(false);
	}
	PG_END_TRY();
	desc = SPI_tuptable->tupdesc;
	if (desc->natts != 2 || SPI_gettypeid(desc, 1) != st->id_type ||
		SPI_gettypeid(desc, 2) != st->vector_type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("queries changed its column types while it ran")));
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Datum		id;
		Datum		vector;

		if (!row_id_and_vector(SPI_tuptable->vals[r], desc, "queries", &id, &vector))
			continue;
		knn_matrix_append(matrix, read_id(id, st->id_type), vector, st->reader);
		CHECK_FOR_INTERRUPTS();
	}
	if (SPI_processed < KNN_FETCH_BATCH)
	{
		SPI_cursor_close(portal);
		st->done = true;
	}
	SPI_finish();
}

/*
 * knn_shard_read_held_blocks(set, query_type, targets, metric, id_type,
 * vector_type, min_dim, max_dim): knn_shard_prefetch_self_join's read,
 * its rows sent back as they are read, value per call from a query's
 * target list, in blocks of knn_shard_held_target_blocks's layout: the
 * coordinator has them when the read ends, not a whole fetch later. The
 * rows stay held for the set's join, as the prefetch's do. Where they are
 * not what the coordinator's declared columns would read (id_type and
 * vector_type: knn_shard_type_identity of its columns, NULL for none; the
 * first row's dimension in min_dim .. max_dim) the one value is a refusal
 * (a header of element -1, no rows) and nothing stays held: the
 * coordinator then reads the rows itself.
 */
PG_FUNCTION_INFO_V1(knn_shard_read_held_blocks);
Datum
knn_shard_read_held_blocks(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;
	HeldStream *st;
	int64		rows;

	if (SRF_IS_FIRSTCALL())
	{
		KnnJoinCall call;
		KnnSet		query_set = {0};
		KnnSet		target_set = {0};
		MemoryContext context;
		MemoryContext old;
		Portal		portal;
		char	   *id_identity;
		char	   *vector_identity;

		funcctx = SRF_FIRSTCALL_INIT();
		require_argument(fcinfo, 6, "min_dim");
		require_argument(fcinfo, 7, "max_dim");
		held_read_begin(fcinfo, "knn_shard_read_held_blocks", "queries", &call, &query_set,
						&target_set);
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		st = palloc0(sizeof(HeldStream));
		st->set = call.received_set;
		st->targets_sql = pstrdup(call.targets_sql);
		st->min_dim = PG_GETARG_INT32(6);
		st->max_dim = PG_GETARG_INT32(7);
		MemoryContextSwitchTo(old);
		funcctx->user_fctx = st;
		id_identity = knn_shard_type_identity(target_set.id_type);
		vector_identity = knn_shard_type_identity(target_set.vector_type);
		st->refused = PG_ARGISNULL(4) || PG_ARGISNULL(5) || id_identity == NULL ||
			vector_identity == NULL ||
			strcmp(id_identity, text_to_cstring(PG_GETARG_TEXT_PP(4))) != 0 ||
			strcmp(vector_identity, text_to_cstring(PG_GETARG_TEXT_PP(5))) != 0;
		st->id_type = target_set.id_type;
		st->vector_type = target_set.vector_type;
		if (!st->refused)
		{
			context = knn_held_targets_begin(st->set);
			st->generation = knn_held_targets_generation();
			old = MemoryContextSwitchTo(context);
			st->matrix = palloc(sizeof(KnnMatrix));
			knn_matrix_init(st->matrix, "query", knn_join_element(&query_set, &target_set, call.metric));
			MemoryContextSwitchTo(old);
			st->reader = knn_vector_reader_for(target_set.kind, st->matrix->element);
			portal = SPI_cursor_open(NULL, target_set.plan, target_set.param_values,
									 target_set.param_nulls, true);
			st->portal_name = MemoryContextStrdup(funcctx->multi_call_memory_ctx, portal->name);
			st->shutdown_registered = ((ReturnSetInfo *) fcinfo->resultinfo)->econtext;
			RegisterExprContextCallback(st->shutdown_registered, held_stream_shutdown,
										PointerGetDatum(st));
		}
		st->progress = true;
		SPI_finish();
		if (st->refused)
		{
			held_stream_finish(st);
			SRF_RETURN_NEXT(funcctx, PointerGetDatum(held_refusal()));
		}
	}
	funcctx = SRF_PERCALL_SETUP();
	st = (HeldStream *) funcctx->user_fctx;
	if (st->refused)
	{
		held_stream_finish(st);
		SRF_RETURN_DONE(funcctx);
	}
	/* a block's rows read (or all there are), then sent */
	while (!st->done && (held_stream_matrix(st)->dim < 0 ||
						 st->matrix->n - st->sent < knn_held_block_rows(st->matrix)))
		read_held_batch(st);
	(void) held_stream_matrix(st);
	if (st->sent == 0 && st->matrix->n > 0 &&
		(st->matrix->dim < st->min_dim || st->matrix->dim > st->max_dim))
	{
		/* (another dimension than the declared column's: read there, as it would be) */
		knn_held_targets_drop(st->set);
		st->refused = true;
		held_stream_finish(st);
		SRF_RETURN_NEXT(funcctx, PointerGetDatum(held_refusal()));
	}
	rows = Min(knn_held_block_rows(st->matrix), st->matrix->n - st->sent);
	if (rows > 0)
	{
		bytea	   *block = knn_held_block(st->matrix, st->sent, rows);

		st->sent += rows;
		SRF_RETURN_NEXT(funcctx, PointerGetDatum(block));
	}
	/* all read and sent: held for the join, as the prefetch holds them */
	knn_held_targets_keep(st->set, st->targets_sql, st->vector_type, st->matrix);
	st->kept = true;
	held_stream_finish(st);
	SRF_RETURN_DONE(funcctx);
}

/* knn_shard_drop_targets(set): drops what knn_shard_prefetch_targets holds for set `set`, for the current role (another role's are its own). */
PG_FUNCTION_INFO_V1(knn_shard_drop_targets);
Datum
knn_shard_drop_targets(PG_FUNCTION_ARGS)
{
	knn_held_targets_drop(PG_GETARG_INT64(0));
	PG_RETURN_VOID();
}

/* knn_shard_held_targets(): the rows of the targets this role holds, or -1 (tests). */
PG_FUNCTION_INFO_V1(knn_shard_held_targets);
Datum
knn_shard_held_targets(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(knn_held_targets_rows());
}

/*
 * The forms below take exclude_self fifth, where the first form has it:
 * a positional call of the first form (metric, exclude_self as unknown
 * literals) then resolves to it alone (20_knn_join.sql, 22_...).
 */

/* knn_join(queries, targets, k, params, exclude_self, metric, method) */
PG_FUNCTION_INFO_V1(knn_join_params);
Datum
knn_join_params(PG_FUNCTION_ARGS)
{
	KnnJoinCall call;

	read_common_arguments(fcinfo, &call, 5, 4, 6);
	read_params_argument(fcinfo, &call, 3);
	knn_join_run_reported(fcinfo, &call);
	PG_RETURN_NULL();
}

/*
 * knn_join(queries, targets, k, key, exclude_self, metric, method, params):
 * ids of key's type (its value is not used, NULL::uuid is the usual form).
 */
PG_FUNCTION_INFO_V1(knn_join_keyed);
Datum
knn_join_keyed(PG_FUNCTION_ARGS)
{
	KnnJoinCall call;

	read_common_arguments(fcinfo, &call, 5, 4, 6);
	read_params_argument(fcinfo, &call, 7);
	call.key_type = key_argument_type(fcinfo, 3);
	knn_join_run_reported(fcinfo, &call);
	PG_RETURN_NULL();
}

/*
 * The arguments of knn_range_join: queries, targets and radius first, then
 * metric, exclude_self, k, inclusive, method and params (-1: none) at the
 * given positions.
 */
typedef struct KnnRangeArguments
{
	int			metric;
	int			exclude_self;
	int			k;
	int			inclusive;
	int			method;
	int			params;
} KnnRangeArguments;

/* The arguments after the queries: targets and radius second and third, the others at `at`. */
static void
read_range_join_arguments(FunctionCallInfo fcinfo, KnnJoinCall *call, const KnnRangeArguments *at)
{
	call->targets_sql = text_argument(fcinfo, 1, "targets");
	require_argument(fcinfo, 2, "radius");
	call->radius = PG_GETARG_FLOAT8(2);
	call->metric = (KnnMetric) named_argument(fcinfo, at->metric, "metric", knn_metric_names);
	require_argument(fcinfo, at->exclude_self, "exclude_self");
	call->exclude_self = PG_GETARG_BOOL(at->exclude_self);
	if (!PG_ARGISNULL(at->k))
	{
		call->k = PG_GETARG_INT32(at->k);
		if (call->k < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("k must be at least 1 (or NULL for every pair), not %d", call->k)));
	}
	require_argument(fcinfo, at->inclusive, "inclusive");
	call->inclusive = PG_GETARG_BOOL(at->inclusive);
	call->method = (KnnMethod) named_argument(fcinfo, at->method, "method", knn_method_names);
	if (at->params >= 0)
		read_params_argument(fcinfo, call, at->params);
	call->range = true;
}

/* knn_range_join's: the queries text first. */
static void
read_range_arguments(FunctionCallInfo fcinfo, KnnJoinCall *call, const KnnRangeArguments *at)
{
	memset(call, 0, sizeof(*call));
	call->queries_sql = text_argument(fcinfo, 0, "queries");
	read_range_join_arguments(fcinfo, call, at);
}

/*
 * knn_range_join_received(set, targets, radius, metric, exclude_self, k,
 * inclusive, method): knn_range_join whose queries are the rows a
 * coordinator shipped into this transaction (knn_shard_receive.h).
 */
PG_FUNCTION_INFO_V1(knn_range_join_received);
Datum
knn_range_join_received(PG_FUNCTION_ARGS)
{
	static const KnnRangeArguments at = {3, 4, 5, 6, 7, -1};
	KnnJoinCall call;

	memset(&call, 0, sizeof(call));
	require_argument(fcinfo, 0, "set");
	call.received = true;
	call.received_set = PG_GETARG_INT64(0);
	read_range_join_arguments(fcinfo, &call, &at);
	knn_join_run_reported(fcinfo, &call);
	PG_RETURN_NULL();
}

/*
 * knn_range_join(queries, targets, radius, metric, exclude_self, k,
 * inclusive, method, params): every pair within radius (k: at most that
 * many per query, NULL = all), through the same reading, keys and
 * statistics as knn_join; the engine's range job hands its pairs over while
 * it works, so it never holds more than a bounded number of them.
 */
PG_FUNCTION_INFO_V1(knn_range_join);
Datum
knn_range_join(PG_FUNCTION_ARGS)
{
	static const KnnRangeArguments at = {3, 4, 5, 6, 7, 8};
	KnnJoinCall call;

	read_range_arguments(fcinfo, &call, &at);
	knn_join_run_reported(fcinfo, &call);
	PG_RETURN_NULL();
}

/*
 * knn_range_join(queries, targets, radius, key, exclude_self, k, inclusive,
 * method, params, metric): ids of key's type, as knn_join's keyed form.
 */
PG_FUNCTION_INFO_V1(knn_range_join_keyed);
Datum
knn_range_join_keyed(PG_FUNCTION_ARGS)
{
	static const KnnRangeArguments at = {9, 4, 5, 6, 7, 8};
	KnnJoinCall call;

	read_range_arguments(fcinfo, &call, &at);
	call.key_type = key_argument_type(fcinfo, 3);
	knn_join_run_reported(fcinfo, &call);
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
