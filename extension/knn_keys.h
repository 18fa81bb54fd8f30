/*
 * knn_keys.h -- dense int64 keys for values of any hashable type, equal
 * exactly when the type's default equality says so.
 *
 * The KNN Join turns "WHERE t.id <> q.id" in the LATERAL subquery into the
 * engine's self-exclusion, which compares int64 keys: both sides' values
 * are mapped through one of these maps, so that two keys are equal exactly
 * when the values are equal under the operator's collation.
 */
#ifndef KNN_KEYS_H
#define KNN_KEYS_H

#include "postgres.h"

/*
 * Is opno the negator of type's default equality operator (type cache),
 * and has the type a hash function consistent with that equality?
 */
extern bool knn_keys_supported(Oid type, Oid opno);

/*
 * Has the type a default equality operator and a hash function consistent
 * with it (type cache)? The group keys of knn_join need both.
 */
extern bool knn_keys_hashable(Oid type);

typedef struct KnnKeys KnnKeys;

/* An empty map in the current memory context. */
extern KnnKeys *knn_keys_create(Oid type, Oid collation);

/*
 * The key of a non-NULL value, a new one (0, 1, ...) when no equal value was
 * added before. The map keeps a copy of the values it holds.
 */
extern int64 knn_keys_add(KnnKeys *keys, Datum value);

/* The key of an equal value added before, or -1. */
extern int64 knn_keys_find(KnnKeys *keys, Datum value);

/* How many keys were given out (they are 0 .. count - 1). */
extern int64 knn_keys_count(const KnnKeys *keys);

#endif							/* KNN_KEYS_H */
