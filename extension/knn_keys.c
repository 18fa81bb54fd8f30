/*
 * knn_keys.c -- dense keys by equality (knn_keys.h): a simplehash table of
 * the values seen, hashed and compared with the type's default hash and
 * equality functions from the type cache, under the operator's collation.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/typcache.h"

#include "knn_keys.h"

typedef struct KnnKeyEntry
{
	Datum		value;
	int64		key;
	uint32		hash;
	char		status;			/* simplehash's */
} KnnKeyEntry;

static uint32 keys_hash(KnnKeys *keys, Datum value);
static bool keys_equal(KnnKeys *keys, Datum a, Datum b);

#define SH_PREFIX knn_keys_table
#define SH_ELEMENT_TYPE KnnKeyEntry
#define SH_KEY_TYPE Datum
#define SH_KEY value
#define SH_HASH_KEY(tb, key) keys_hash((KnnKeys *) (tb)->private_data, key)
#define SH_EQUAL(tb, a, b) keys_equal((KnnKeys *) (tb)->private_data, a, b)
#define SH_STORE_HASH
#define SH_GET_HASH(tb, a) ((a)->hash)
#define SH_SCOPE static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

struct KnnKeys
{
	FmgrInfo	hash_function;
	FmgrInfo	equal_function;
	Oid			collation;
	bool		varlena;
	bool		byval;
	int16		typlen;
	MemoryContext context;		/* the map and detoasted values */
	MemoryContext scratch;		/* what the functions allocate */
	int			calls;			/* since scratch was last reset */
	knn_keys_table_hash *table;
	int64		n_keys;
};


static uint32
keys_hash(KnnKeys *keys, Datum value)
{
	return DatumGetUInt32(FunctionCall1Coll(&keys->hash_function, keys->collation, value));
}

static bool
keys_equal(KnnKeys *keys, Datum a, Datum b)
{
	return DatumGetBool(FunctionCall2Coll(&keys->equal_function, keys->collation, a, b));
}

bool
knn_keys_hashable(Oid type)
{
	TypeCacheEntry *entry = lookup_type_cache(type, TYPECACHE_EQ_OPR | TYPECACHE_HASH_PROC);

	return OidIsValid(entry->eq_opr) && OidIsValid(entry->hash_proc);
}

bool
knn_keys_supported(Oid type, Oid opno)
{
	TypeCacheEntry *entry = lookup_type_cache(type, TYPECACHE_EQ_OPR | TYPECACHE_HASH_PROC);

	/* The type cache only gives a hash function that agrees with eq_opr. */
	return OidIsValid(entry->eq_opr) && OidIsValid(entry->hash_proc) &&
		get_negator(entry->eq_opr) == opno;
}

KnnKeys *
knn_keys_create(Oid type, Oid collation)
{
	TypeCacheEntry *entry = lookup_type_cache(type, TYPECACHE_EQ_OPR_FINFO |
											  TYPECACHE_HASH_PROC_FINFO);
	KnnKeys    *keys = palloc0(sizeof(KnnKeys));

	if (!OidIsValid(entry->eq_opr_finfo.fn_oid) || !OidIsValid(entry->hash_proc_finfo.fn_oid))
		elog(ERROR, "KNN Join: type %u has no equality or hash function", type);
	keys->context = CurrentMemoryContext;
	fmgr_info_copy(&keys->hash_function, &entry->hash_proc_finfo, keys->context);
	fmgr_info_copy(&keys->equal_function, &entry->eq_opr_finfo, keys->context);
	keys->collation = collation;
	keys->varlena = entry->typlen == -1;
	keys->byval = entry->typbyval;
	keys->typlen = entry->typlen;
	keys->scratch = AllocSetContextCreate(keys->context, "KNN Join keys",
										  ALLOCSET_SMALL_SIZES);
	keys->table = knn_keys_table_create(keys->context, 1024, keys);
	return keys;
}

/* A value the functions can read cheaply: detoasted once, into context. */
static Datum
plain_value(KnnKeys *keys, Datum value, MemoryContext context)
{
	MemoryContext old;

	if (!keys->varlena)
		return value;
	old = MemoryContextSwitchTo(context);
	value = PointerGetDatum(PG_DETOAST_DATUM_PACKED(value));
	MemoryContextSwitchTo(old);
	return value;
}

/* Runs the hash and equality functions in scratch, reset now and then. */
static MemoryContext
enter_scratch(KnnKeys *keys)
{
	if (++keys->calls >= 1024)
	{
		MemoryContextReset(keys->scratch);
		keys->calls = 0;
	}
	return MemoryContextSwitchTo(keys->scratch);
}

int64
knn_keys_add(KnnKeys *keys, Datum value)
{
	MemoryContext old = enter_scratch(keys);
	Datum		plain = plain_value(keys, value, keys->scratch);
	KnnKeyEntry *entry;
	bool		found;

	entry = knn_keys_table_insert(keys->table, plain, &found);
	if (!found)
	{
		/* The map keeps its own copy: the caller's tuple may go away. */
		if (!keys->byval)
		{
			MemoryContextSwitchTo(keys->context);
			entry->value = datumCopy(plain, false, keys->typlen);
		}
		entry->key = keys->n_keys++;
	}
	MemoryContextSwitchTo(old);
	return entry->key;
}

int64
knn_keys_find(KnnKeys *keys, Datum value)
{
	MemoryContext old = enter_scratch(keys);
	KnnKeyEntry *entry;

	entry = knn_keys_table_lookup(keys->table, plain_value(keys, value, keys->scratch));
	MemoryContextSwitchTo(old);
	return entry != NULL ? entry->key : -1;
}

int64
knn_keys_count(const KnnKeys *keys)
{
	return keys->n_keys;
}
