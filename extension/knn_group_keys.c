/*
 * knn_group_keys.c -- dense group ids of several key columns
 * (knn_group_keys.h). Each column's values map to dense keys (knn_keys.h);
 * the keys of columns 1..n are folded in one at a time, each column
 * through its own hash table of (group so far, this column's key) pairs.
 */
#include "postgres.h"

#include "common/hashfn.h"

#include "knn_group_keys.h"
#include "knn_keys.h"

typedef struct KnnPair
{
	int64		group;
	int64		key;
} KnnPair;

typedef struct KnnPairEntry
{
	KnnPair		pair;
	int64		folded;
	char		status;			/* simplehash's */
} KnnPairEntry;

#define SH_PREFIX knn_pair_table
#define SH_ELEMENT_TYPE KnnPairEntry
#define SH_KEY_TYPE KnnPair
#define SH_KEY pair
#define SH_HASH_KEY(tb, k) \
	hash_combine(murmurhash32((uint32) (k).group ^ (uint32) ((k).group >> 32)), \
				 murmurhash32((uint32) (k).key ^ (uint32) ((k).key >> 32)))
#define SH_EQUAL(tb, a, b) ((a).group == (b).group && (a).key == (b).key)
#define SH_SCOPE static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

struct KnnGroupKeys
{
	int			n_columns;
	KnnKeys   **columns;
	knn_pair_table_hash **pairs;	/* per column after the first: its fold */
	int64		n_groups;
};

KnnGroupKeys *
knn_group_keys_create(int n_columns, const Oid *types, const Oid *collations)
{
	KnnGroupKeys *groups = palloc0(sizeof(KnnGroupKeys));

	Assert(n_columns >= 1);
	groups->n_columns = n_columns;
	groups->columns = palloc(sizeof(KnnKeys *) * n_columns);
	for (int i = 0; i < n_columns; i++)
		groups->columns[i] = knn_keys_create(types[i], collations[i]);
	groups->pairs = palloc0(sizeof(knn_pair_table_hash *) * n_columns);
	for (int i = 1; i < n_columns; i++)
		groups->pairs[i] = knn_pair_table_create(CurrentMemoryContext, 1024, NULL);
	return groups;
}

/* adding: unseen values get new keys; else -1 for an unseen one. */
static int64
group_of(KnnGroupKeys *groups, const Datum *values, const bool *isnull, bool adding)
{
	int64		group;

	for (int i = 0; i < groups->n_columns; i++)
		if (isnull[i])
			return KNN_GROUP_NULL;
	group = adding ? knn_keys_add(groups->columns[0], values[0]) :
		knn_keys_find(groups->columns[0], values[0]);
	for (int i = 1; i < groups->n_columns && group >= 0; i++)
	{
		KnnPair		pair;

		pair.group = group;
		pair.key = adding ? knn_keys_add(groups->columns[i], values[i]) :
			knn_keys_find(groups->columns[i], values[i]);
		if (pair.key < 0)
			return -1;
		if (adding)
		{
			bool		found;
			KnnPairEntry *entry = knn_pair_table_insert(groups->pairs[i], pair, &found);

			if (!found)
				entry->folded = groups->n_groups++;
			group = entry->folded;
		}
		else
		{
			KnnPairEntry *entry = knn_pair_table_lookup(groups->pairs[i], pair);

			group = entry != NULL ? entry->folded : -1;
		}
	}
	return group;
}

int64
knn_group_keys_add(KnnGroupKeys *groups, const Datum *values, const bool *isnull)
{
	return group_of(groups, values, isnull, true);
}

int64
knn_group_keys_find(KnnGroupKeys *groups, const Datum *values, const bool *isnull)
{
	return group_of(groups, values, isnull, false);
}

int64
knn_group_keys_bound(const KnnGroupKeys *groups)
{
	return groups->n_columns == 1 ? knn_keys_count(groups->columns[0]) : groups->n_groups;
}
