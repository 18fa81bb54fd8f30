/*
 * knn_join_groups.c -- knn_join's group key columns (knn_join_groups.h).
 */
#include "postgres.h"

#include "catalog/pg_collation.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "knn_join_groups.h"
#include "knn_keys.h"

void
knn_join_group_columns(TupleDesc desc, const char *arg, KnnJoinGroupColumns *out)
{
	out->n = desc->natts - 2;
	if (out->n > KNN_MAX_GROUP_COLUMNS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s returns %d group key columns, at most %d are supported",
						arg, out->n, KNN_MAX_GROUP_COLUMNS)));
	for (int i = 0; i < out->n; i++)
	{
		Form_pg_attribute attr = TupleDescAttr(desc, 2 + i);

		out->types[i] = attr->atttypid;
		out->collations[i] = attr->attcollation;
		/* the equality "t.g = q.g" would use, with a hash function agreeing with it */
		if (!knn_keys_hashable(getBaseType(attr->atttypid)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("group key column %d of %s is of type %s, which has no hashable equality",
							3 + i, arg, format_type_be(attr->atttypid)),
					 errhint("Group keys need a type with a default hash operator class.")));
	}
}

KnnGroupKeys *
knn_join_group_keys(const KnnJoinGroupColumns *queries, const KnnJoinGroupColumns *targets)
{
	Oid			types[KNN_MAX_GROUP_COLUMNS];
	Oid			collations[KNN_MAX_GROUP_COLUMNS];

	if (queries->n == 0 && targets->n == 0)
		return NULL;
	if (queries->n == 0 || targets->n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s must return 2 columns (id, vector), not %d",
						queries->n > 0 ? "queries" : "targets", 2 + Max(queries->n, targets->n)),
				 errhint("Columns after (id, vector) are group keys: each query meets only the targets of equal keys, so %s must return them too.",
						 queries->n > 0 ? "targets" : "queries")));
	if (queries->n != targets->n)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("queries return %d group key columns but targets return %d",
						queries->n, targets->n)));
	for (int i = 0; i < queries->n; i++)
	{
		Oid			collation = queries->collations[i];

		types[i] = getBaseType(queries->types[i]);
		if (types[i] != getBaseType(targets->types[i]))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("group key column %d of queries and targets has different types: %s and %s",
							3 + i, format_type_be(queries->types[i]),
							format_type_be(targets->types[i])),
					 errhint("Cast one of them in its query text.")));
		/* as SQL's "=" between the two columns: one collation, or none */
		if (OidIsValid(targets->collations[i]) && targets->collations[i] != collation)
		{
			if (OidIsValid(collation))
				ereport(ERROR,
						(errcode(ERRCODE_INDETERMINATE_COLLATION),
						 errmsg("group key column %d of queries and targets has different collations: \"%s\" and \"%s\"",
								3 + i, get_collation_name(collation),
								get_collation_name(targets->collations[i])),
						 errhint("Give the column the same COLLATE clause in both query texts.")));
			collation = targets->collations[i];
		}
		if (!OidIsValid(collation) && type_is_collatable(types[i]))
			collation = DEFAULT_COLLATION_OID;
		collations[i] = collation;
	}
	return knn_group_keys_create(queries->n, types, collations);
}

int64
knn_join_row_group(KnnGroupKeys *groups, const KnnJoinGroupColumns *columns,
				   HeapTuple tuple, TupleDesc desc)
{
	Datum		values[KNN_MAX_GROUP_COLUMNS];
	bool		isnull[KNN_MAX_GROUP_COLUMNS];

	for (int i = 0; i < columns->n; i++)
		values[i] = SPI_getbinval(tuple, desc, 3 + i, &isnull[i]);
	return knn_group_keys_add(groups, values, isnull);
}
