/*
 * knn_key_order.c -- ranks of knn_join's keys of any ordered type
 * (knn_key_order.h): each set's row numbers are sorted by the type's
 * default btree comparison function (type cache), under the columns'
 * collation, then the two sorted lists are merged, equal values taking one
 * rank.
 */
#include "postgres.h"

#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/typcache.h"

#include "knn_key_order.h"

/* Comparisons between two looks at the interrupt flags (and scratch resets). */
#define KNN_COMPARE_SLICE 1024

typedef struct KeyComparer
{
	FmgrInfo	compare;
	Oid			collation;
	MemoryContext scratch;		/* what the comparison function allocates */
	int			calls;
} KeyComparer;

typedef struct SortArg
{
	KeyComparer *comparer;
	const Datum *values;
} SortArg;

void
knn_key_check_type(Oid type, const char *set_name)
{
	TypeCacheEntry *entry = lookup_type_cache(getBaseType(type), TYPECACHE_CMP_PROC);

	if (!OidIsValid(entry->cmp_proc))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("the key of %s, of type %s, has no default btree ordering",
						set_name, format_type_be(type)),
				 errhint("knn_join's keys must be of a type that ORDER BY can sort without USING.")));
}

void
knn_key_column_init(KnnKeyColumn *column, Oid type, Oid collation, const char *set_name)
{
	memset(column, 0, sizeof(*column));
	column->type = getBaseType(type);
	column->collation = collation;
	get_typlenbyval(column->type, &column->typlen, &column->typbyval);
	column->set_name = set_name;
	column->context = CurrentMemoryContext;
}

int64
knn_key_column_add(KnnKeyColumn *column, Datum value)
{
	MemoryContext old = MemoryContextSwitchTo(column->context);

	if (column->n == column->capacity)
	{
		column->capacity = Max(1024, column->capacity * 2);
		column->values = column->values == NULL
			? MemoryContextAllocHuge(column->context, column->capacity * sizeof(Datum))
			: repalloc_huge(column->values, column->capacity * sizeof(Datum));
	}
	/* Detoasted once here: every comparison reads the value. */
	if (column->typlen == -1)
		value = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
	else
		value = datumCopy(value, column->typbyval, column->typlen);
	column->values[column->n] = value;
	MemoryContextSwitchTo(old);
	return column->n++;
}

static int
compare_values(KeyComparer *comparer, Datum a, Datum b)
{
	MemoryContext old;
	int			result;

	if (++comparer->calls >= KNN_COMPARE_SLICE)
	{
		/* A cancel may leave the sort here: it holds no resource. */
		CHECK_FOR_INTERRUPTS();
		MemoryContextReset(comparer->scratch);
		comparer->calls = 0;
	}
	old = MemoryContextSwitchTo(comparer->scratch);
	result = DatumGetInt32(FunctionCall2Coll(&comparer->compare, comparer->collation, a, b));
	MemoryContextSwitchTo(old);
	return result;
}

static int
compare_rows(const void *a, const void *b, void *arg)
{
	SortArg    *sort = (SortArg *) arg;
	int64		row_a = *(const int64 *) a;
	int64		row_b = *(const int64 *) b;

	return compare_values(sort->comparer, sort->values[row_a], sort->values[row_b]);
}

static char *
value_text(const KnnKeyColumn *column, Datum value)
{
	Oid			output;
	bool		varlena;
	char	   *text;

	getTypeOutputInfo(column->type, &output, &varlena);
	text = OidOutputFunctionCall(output, value);
	if (strlen(text) > 64)
		text = psprintf("%.*s...", pg_mbcliplen(text, strlen(text), 64), text);
	return text;
}

/* The column's row numbers in key order; ERROR on two equal keys. */
static int64 *
sorted_rows(KeyComparer *comparer, const KnnKeyColumn *column)
{
	int64	   *rows = MemoryContextAllocHuge(CurrentMemoryContext,
											  Max(1, column->n) * sizeof(int64));
	SortArg		arg = {comparer, column->values};

	for (int64 i = 0; i < column->n; i++)
		rows[i] = i;
	qsort_arg(rows, column->n, sizeof(int64), compare_rows, &arg);
	for (int64 i = 1; i < column->n; i++)
		if (compare_values(comparer, column->values[rows[i - 1]], column->values[rows[i]]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("%s returned the key %s twice", column->set_name,
							value_text(column, column->values[rows[i]])),
					 errdetail("knn_join's keys must be unique in each set: they name the rows it returns and break ties.")));
	return rows;
}

void
knn_key_columns_rank(KnnKeyColumn *queries, int64 *query_ids,
					 KnnKeyColumn *targets, int64 *target_ids)
{
	KeyComparer comparer;
	TypeCacheEntry *entry = lookup_type_cache(queries->type, TYPECACHE_CMP_PROC_FINFO);
	int64	   *query_rows;
	int64	   *target_rows = NULL;
	int64	   *query_rank;
	int64	   *target_rank = NULL;
	int64		n_targets = targets != NULL ? targets->n : 0;
	int64		qi = 0;
	int64		ti = 0;
	int64		rank = 0;

	if (!OidIsValid(entry->cmp_proc_finfo.fn_oid))
		knn_key_check_type(queries->type, queries->set_name);
	fmgr_info_copy(&comparer.compare, &entry->cmp_proc_finfo, CurrentMemoryContext);
	comparer.collation = queries->collation;
	comparer.scratch = AllocSetContextCreate(CurrentMemoryContext, "knn_join keys",
											 ALLOCSET_SMALL_SIZES);
	comparer.calls = 0;

	query_rows = sorted_rows(&comparer, queries);
	if (targets != NULL)
		target_rows = sorted_rows(&comparer, targets);

	/* Merge: a value on both sides takes one rank. */
	query_rank = MemoryContextAllocHuge(CurrentMemoryContext, Max(1, queries->n) * sizeof(int64));
	if (targets != NULL)
		target_rank = MemoryContextAllocHuge(CurrentMemoryContext, Max(1, n_targets) * sizeof(int64));
	while (qi < queries->n || ti < n_targets)
	{
		int			order;

		if (qi == queries->n)
			order = 1;
		else if (ti == n_targets)
			order = -1;
		else
			order = compare_values(&comparer, queries->values[query_rows[qi]],
								   targets->values[target_rows[ti]]);
		if (order <= 0)
			query_rank[query_rows[qi++]] = rank;
		if (order >= 0)
			target_rank[target_rows[ti++]] = rank;
		rank++;
	}

	queries->by_rank = MemoryContextAllocHuge(queries->context, Max(1, rank) * sizeof(Datum));
	for (int64 i = 0; i < queries->n; i++)
		queries->by_rank[query_rank[i]] = queries->values[i];
	if (targets != NULL)
	{
		targets->by_rank = MemoryContextAllocHuge(targets->context, Max(1, rank) * sizeof(Datum));
		for (int64 i = 0; i < targets->n; i++)
			targets->by_rank[target_rank[i]] = targets->values[i];
	}

	/* ids hold row numbers: each becomes its value's rank. */
	for (int64 i = 0; i < queries->n; i++)
		query_ids[i] = query_rank[query_ids[i]];
	if (targets != NULL)
		for (int64 i = 0; i < n_targets; i++)
			target_ids[i] = target_rank[target_ids[i]];

	MemoryContextDelete(comparer.scratch);
	pfree(query_rows);
	pfree(query_rank);
	if (targets != NULL)
	{
		pfree(target_rows);
		pfree(target_rank);
	}
}
