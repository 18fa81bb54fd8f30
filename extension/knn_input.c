/*
 * knn_input.c -- reading vector values (knn_gpu's or pgvector's vector,
 * real[], double precision[]) into one float32 matrix for the engine.
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "knn_gpu.h"
#include "vector.h"

/*
 * Both knn_gpu's and pgvector's type are called "vector" and share one
 * storage layout, so either is read the same way, in whatever schema.
 */
KnnVectorKind
knn_vector_kind(Oid typid)
{
	HeapTuple	tuple;
	KnnVectorKind kind = KNN_VECTOR_UNSUPPORTED;

	typid = getBaseType(typid);
	if (typid == FLOAT4ARRAYOID)
		return KNN_VECTOR_FLOAT4_ARRAY;
	if (typid == FLOAT8ARRAYOID)
		return KNN_VECTOR_FLOAT8_ARRAY;

	tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	if (HeapTupleIsValid(tuple))
	{
		Form_pg_type typ = (Form_pg_type) GETSTRUCT(tuple);

		if (strcmp(NameStr(typ->typname), "vector") == 0 && typ->typlen == -1)
			kind = KNN_VECTOR_TYPE;
		ReleaseSysCache(tuple);
	}
	return kind;
}

static ArrayType *
checked_array(Datum value, Oid element_type)
{
	ArrayType  *array = DatumGetArrayTypeP(value);

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("array must be 1-D")));
	if (ARR_HASNULL(array) && array_contains_nulls(array))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("array must not contain nulls")));
	Assert(ARR_ELEMTYPE(array) == element_type);
	return array;
}

int
knn_vector_datum_dim(Datum value, KnnVectorKind kind)
{
	switch (kind)
	{
		case KNN_VECTOR_TYPE:
			return DatumGetVector(value)->dim;
		case KNN_VECTOR_FLOAT4_ARRAY:
		case KNN_VECTOR_FLOAT8_ARRAY:
			{
				ArrayType  *array = checked_array(value, kind == KNN_VECTOR_FLOAT4_ARRAY ?
												  FLOAT4OID : FLOAT8OID);

				return ARR_NDIM(array) == 0 ? 0 : ARR_DIMS(array)[0];
			}
		default:
			elog(ERROR, "unsupported vector kind %d", (int) kind);
	}
	return 0;
}

static void
reject_non_finite(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_EXCEPTION),
			 errmsg("%s has a NaN or infinite value", what),
			 errhint("Vectors must hold finite numbers.")));
}

void
knn_vector_datum_copy(Datum value, KnnVectorKind kind, int dim, float *out,
					  const char *what)
{
	switch (kind)
	{
		case KNN_VECTOR_TYPE:
			{
				Vector	   *v = DatumGetVector(value);

				for (int i = 0; i < dim; i++)
				{
					if (!isfinite(v->x[i]))
						reject_non_finite(what);
					out[i] = v->x[i];
				}
				break;
			}
		case KNN_VECTOR_FLOAT4_ARRAY:
			{
				float4	   *x = (float4 *) ARR_DATA_PTR(DatumGetArrayTypeP(value));

				for (int i = 0; i < dim; i++)
				{
					if (!isfinite(x[i]))
						reject_non_finite(what);
					out[i] = x[i];
				}
				break;
			}
		case KNN_VECTOR_FLOAT8_ARRAY:
			{
				float8	   *x = (float8 *) ARR_DATA_PTR(DatumGetArrayTypeP(value));

				for (int i = 0; i < dim; i++)
				{
					/* a finite float8 beyond float4's range is no vector either */
					out[i] = (float) x[i];
					if (!isfinite(x[i]) || !isfinite(out[i]))
						reject_non_finite(what);
				}
				break;
			}
		default:
			elog(ERROR, "unsupported vector kind %d", (int) kind);
	}
}

void
knn_matrix_init(KnnMatrix *m, const char *set_name)
{
	memset(m, 0, sizeof(*m));
	m->dim = -1;
	m->context = CurrentMemoryContext;
	m->set_name = set_name;
}

void
knn_matrix_append(KnnMatrix *m, int64 id, Datum value, KnnVectorKind kind)
{
	char		what[96];
	Pointer		raw = DatumGetPointer(value);
	Pointer		detoasted = (Pointer) PG_DETOAST_DATUM(value);
	int			dim;

	/* Detoast once; both helpers below then read the plain value. */
	value = PointerGetDatum(detoasted);
	dim = knn_vector_datum_dim(value, kind);

	snprintf(what, sizeof(what), "%s id " INT64_FORMAT, m->set_name, id);
	if (dim < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("%s has an empty vector", what)));
	if (m->dim < 0)
		m->dim = dim;
	else if (dim != m->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dimension mismatch: %s has %d dimensions, expected %d",
						what, dim, m->dim)));

	if (m->n == m->capacity)
	{
		/* Huge allocations: the matrix may well pass 1 GB. */
		int64		capacity = m->capacity == 0 ? 1024 : m->capacity * 2;
		Size		value_bytes = (Size) capacity * m->dim * sizeof(float);

		if (m->values == NULL)
		{
			m->values = MemoryContextAllocHuge(m->context, value_bytes);
			m->ids = MemoryContextAllocHuge(m->context, capacity * sizeof(int64));
		}
		else
		{
			m->values = repalloc_huge(m->values, value_bytes);
			m->ids = repalloc_huge(m->ids, capacity * sizeof(int64));
		}
		m->capacity = capacity;
	}
	knn_vector_datum_copy(value, kind, dim, m->values + m->n * m->dim, what);
	m->ids[m->n] = id;
	m->n++;
	if (detoasted != raw)
		pfree(detoasted);
}

typedef struct IdOrder
{
	int64		id;
	int64		row;
} IdOrder;

static int
compare_id_order(const void *a, const void *b)
{
	const IdOrder *x = a;
	const IdOrder *y = b;

	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->row < y->row ? -1 : (x->row > y->row ? 1 : 0);
}

void
knn_matrix_sort_by_id(KnnMatrix *m)
{
	IdOrder    *order;
	float	   *values;
	bool		sorted = true;

	for (int64 i = 1; i < m->n && sorted; i++)
		sorted = m->ids[i - 1] <= m->ids[i];
	if (sorted)
		return;

	order = MemoryContextAllocHuge(CurrentMemoryContext, m->n * sizeof(IdOrder));
	for (int64 i = 0; i < m->n; i++)
	{
		order[i].id = m->ids[i];
		order[i].row = i;
	}
	qsort(order, m->n, sizeof(IdOrder), compare_id_order);

	values = MemoryContextAllocHuge(m->context, (Size) m->n * m->dim * sizeof(float));
	for (int64 i = 0; i < m->n; i++)
	{
		memcpy(values + i * m->dim, m->values + order[i].row * m->dim, m->dim * sizeof(float));
		m->ids[i] = order[i].id;
	}
	pfree(m->values);
	pfree(order);
	m->values = values;
	m->capacity = m->n;
}

void
knn_matrix_free(KnnMatrix *m)
{
	if (m->values)
		pfree(m->values);
	if (m->ids)
		pfree(m->ids);
	m->values = NULL;
	m->ids = NULL;
	m->n = m->capacity = 0;
}
