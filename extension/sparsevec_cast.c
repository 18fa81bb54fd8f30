/*
 * sparsevec_cast.c -- the casts between sparsevec and the dense types,
 * with pgvector's contexts (extension/sql/13_sparsevec.sql) and results:
 *   vector -> sparsevec, halfvec -> sparsevec (implicit),
 *   integer[]/real[]/double precision[]/numeric[] -> sparsevec,
 *   sparsevec -> vector, sparsevec -> halfvec (assignment).
 * A dense value keeps its non-zero elements (-0 is zero); the checks come
 * in pgvector's order: the dimension count for the target type, the
 * typmod, then the elements.
 */
#include "postgres.h"

#include "utils/array.h"

#include "half_float.h"
#include "halfvec.h"
#include "sparsevec.h"
#include "vector.h"
#include "vector_checks.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_vector_to_sparsevec);
PG_FUNCTION_INFO_V1(knn_halfvec_to_sparsevec);
PG_FUNCTION_INFO_V1(knn_array_to_sparsevec);
PG_FUNCTION_INFO_V1(knn_sparsevec_to_vector);
PG_FUNCTION_INFO_V1(knn_sparsevec_to_halfvec);

/*
 * The non-zero elements of x[0..dim-1] as a sparsevec (dim already
 * checked); ERROR beyond SPARSEVEC_MAX_NNZ of them, or for a NaN or an
 * infinity among them (only arrays can hold those).
 */
static SparseVector *
sparsevec_of_dense(const float *x, int dim)
{
	int			nnz = 0;
	int			j = 0;
	SparseVector *result;
	float	   *values;

	for (int i = 0; i < dim; i++)
		nnz += (x[i] != 0);
	result = knn_sparsevec_new(dim, nnz);
	values = SPARSEVEC_VALUES(result);
	for (int i = 0; i < dim; i++)
	{
		if (x[i] != 0)
		{
			result->indices[j] = i;
			values[j] = x[i];
			j++;
		}
	}
	for (int i = 0; i < nnz; i++)
		knn_sparsevec_check_element(values[i]);
	return result;
}

/* SQL: vector_to_sparsevec(vector, typmod, explicit) */
Datum
knn_vector_to_sparsevec(PG_FUNCTION_ARGS)
{
	Vector	   *v = knn_vector_arg(fcinfo, 0);

	knn_sparsevec_check_dim(v->dim);
	knn_vector_check_typmod(PG_GETARG_INT32(1), v->dim);
	PG_RETURN_POINTER(sparsevec_of_dense(v->x, v->dim));
}

/* SQL: halfvec_to_sparsevec(halfvec, typmod, explicit) */
Datum
knn_halfvec_to_sparsevec(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);	/* size-checked */
	float	   *widened;

	knn_sparsevec_check_dim(v->dim);
	knn_vector_check_typmod(PG_GETARG_INT32(1), v->dim);
	widened = palloc(sizeof(float) * v->dim);
	knn_halfvec_widen(v, widened);
	PG_RETURN_POINTER(sparsevec_of_dense(widened, v->dim));
}

/* SQL: array_to_sparsevec(integer[]/real[]/float8[]/numeric[], typmod, explicit) */
Datum
knn_array_to_sparsevec(PG_FUNCTION_ARGS)
{
	ArrayType  *array = PG_GETARG_ARRAYTYPE_P(0);
	Oid			element_type = ARR_ELEMTYPE(array);
	int			n;
	Datum	   *elements = knn_array_elements(array, PG_INT32_MAX, &n);
	float	   *x;

	/* an empty array has no dimension at all, hence n == 0 */
	knn_sparsevec_check_dim(n);
	knn_vector_check_typmod(PG_GETARG_INT32(1), n);
	x = palloc(sizeof(float) * n);
	for (int i = 0; i < n; i++)
		x[i] = knn_array_element_to_float(elements[i], element_type, "sparsevec");
	pfree(elements);
	PG_RETURN_POINTER(sparsevec_of_dense(x, n));
}

/*
 * Element i's index as a position in a dense value of dim elements. Every
 * way to make a sparsevec checks its indices; one that is out of range
 * here comes from a damaged datum, and is never used to write.
 */
static inline int32
dense_position(const SparseVector *v, int i)
{
	if (v->indices[i] < 0 || v->indices[i] >= v->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("invalid sparsevec value: index %d out of bounds", v->indices[i])));
	return v->indices[i];
}

/* SQL: sparsevec_to_vector(sparsevec, typmod, explicit) */
Datum
knn_sparsevec_to_vector(PG_FUNCTION_ARGS)
{
	SparseVector *v = knn_sparsevec_arg(fcinfo, 0);
	const float *values = SPARSEVEC_VALUES(v);
	Vector	   *result;

	knn_vector_check_dim(v->dim);
	knn_vector_check_typmod(PG_GETARG_INT32(1), v->dim);
	result = knn_vector_new(v->dim);
	for (int i = 0; i < v->nnz; i++)
		result->x[dense_position(v, i)] = values[i];
	PG_RETURN_POINTER(result);
}

/* SQL: sparsevec_to_halfvec(sparsevec, typmod, explicit) */
Datum
knn_sparsevec_to_halfvec(PG_FUNCTION_ARGS)
{
	SparseVector *v = knn_sparsevec_arg(fcinfo, 0);
	const float *values = SPARSEVEC_VALUES(v);
	HalfVector *result;

	/* halfvec's dimension check (in knn_halfvec_new) before the typmod's */
	result = knn_halfvec_new(v->dim);
	knn_halfvec_check_typmod(PG_GETARG_INT32(1), v->dim);
	for (int i = 0; i < v->nnz; i++)
		result->x[dense_position(v, i)] = knn_halfvec_element(values[i]);
	PG_RETURN_POINTER(result);
}
