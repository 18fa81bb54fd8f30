/*
 * knn_join_groups.h -- knn_join's group keys: every column of a query text
 * after (id, vector) is a group key, and a query meets only the targets
 * whose keys all equal its own (each column's type's default hashable
 * equality, under the column's collation; NULL equals nothing).
 */
#ifndef KNN_JOIN_GROUPS_H
#define KNN_JOIN_GROUPS_H

#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"

#include "knn_group_keys.h"

/* Group key columns a query text may return after (id, vector). */
#define KNN_MAX_GROUP_COLUMNS 32

typedef struct KnnJoinGroupColumns
{
	int			n;				/* 0: no groups */
	Oid			types[KNN_MAX_GROUP_COLUMNS];	/* as the text returns them */
	Oid			collations[KNN_MAX_GROUP_COLUMNS];
} KnnJoinGroupColumns;

/* Reads and checks the group columns (3 .. natts) of a text's result; ERROR if unusable. */
extern void knn_join_group_columns(TupleDesc desc, const char *arg, KnnJoinGroupColumns *out);

/*
 * The map of both sets' keys to group ids, or NULL when neither has group
 * columns; ERROR unless both have them, column for column of one type
 * (a domain counts as its base type) and of compatible collations.
 */
extern KnnGroupKeys *knn_join_group_keys(const KnnJoinGroupColumns *queries,
										 const KnnJoinGroupColumns *targets);

/* The group of a row (KNN_GROUP_NULL when a key is NULL); adds unseen keys. */
extern int64 knn_join_row_group(KnnGroupKeys *groups, const KnnJoinGroupColumns *columns,
								 HeapTuple tuple, TupleDesc desc);

#endif							/* KNN_JOIN_GROUPS_H */
