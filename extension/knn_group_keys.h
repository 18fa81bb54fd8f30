/*
 * knn_group_keys.h -- one dense int64 group id per row from several key
 * columns of hashable types, equal exactly when every column's value is
 * equal under its type's default equality (and collation): the group ids
 * of the engine's per-group joins (KnnProblem's query_groups and
 * target_groups) for "t.g1 = q.g1 AND t.g2 = q.g2" in the KNN Join.
 */
#ifndef KNN_GROUP_KEYS_H
#define KNN_GROUP_KEYS_H

#include "postgres.h"

/* A row with a NULL in some key column: "=" is never true for it. */
#define KNN_GROUP_NULL PG_INT64_MIN

typedef struct KnnGroupKeys KnnGroupKeys;

/* An empty map in the current memory context; types[i] need knn_keys_hashable. */
extern KnnGroupKeys *knn_group_keys_create(int n_columns, const Oid *types,
										   const Oid *collations);

/* The group of a row's values, a new one (0, 1, ...) when unseen. */
extern int64 knn_group_keys_add(KnnGroupKeys *groups, const Datum *values, const bool *isnull);

/* The group of equal values added before, -1 when none, KNN_GROUP_NULL for a NULL. */
extern int64 knn_group_keys_find(KnnGroupKeys *groups, const Datum *values, const bool *isnull);

/* Every group id given out so far is below this. */
extern int64 knn_group_keys_bound(const KnnGroupKeys *groups);

#endif							/* KNN_GROUP_KEYS_H */
