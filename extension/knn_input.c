/*
 * knn_input.c -- the vector readers of knn_input.h.
 *
 * Values reach us from any column a query returns, so nothing in a value
 * is trusted: the dimension in a vector's header is compared with the
 * value's byte length, and an array's header with its length, before any
 * element is read.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/varbit.h"

#include "half_float.h"
#include "halfvec.h"
#include "knn_input.h"
#include "vector.h"

static KnnValueProblem
dimension_problem(int dim)
{
	if (dim < 1)
		return KNN_VALUE_EMPTY;
	if (dim > VECTOR_MAX_DIM)
		return KNN_VALUE_TOO_LONG;
	return KNN_VALUE_OK;
}

static KnnValueProblem
vector_view(struct varlena *value, KnnVectorView *view)
{
	Size		size = VARSIZE_ANY(value);
	Vector	   *v = (Vector *) value;
	KnnValueProblem problem;

	if (VARATT_IS_EXTENDED(value) || size < offsetof(Vector, x))
		return KNN_VALUE_MALFORMED;
	problem = dimension_problem(v->dim);
	if (problem != KNN_VALUE_OK)
		return problem;
	if (size != VECTOR_SIZE(v->dim))
		return KNN_VALUE_MALFORMED;
	view->dim = v->dim;
	view->elements = v->x;
	return KNN_VALUE_OK;
}

/* An array of element_type whose elements are element_size bytes. */
static KnnValueProblem
array_view(struct varlena *value, Oid element_type, int element_size, KnnVectorView *view)
{
	ArrayType  *array = (ArrayType *) value;
	Size		size = VARSIZE_ANY(value);
	Size		data_offset;
	KnnValueProblem problem;
	int			n;

	if (VARATT_IS_EXTENDED(value) || size < sizeof(ArrayType) ||
		ARR_ELEMTYPE(array) != element_type)
		return KNN_VALUE_MALFORMED;
	if (ARR_NDIM(array) == 0)
		return KNN_VALUE_EMPTY;
	if (ARR_NDIM(array) != 1)
		return KNN_VALUE_NOT_1D;
	data_offset = ARR_DATA_OFFSET(array);
	if (data_offset < ARR_OVERHEAD_NONULLS(1) || data_offset > size)
		return KNN_VALUE_MALFORMED;
	n = ARR_DIMS(array)[0];
	problem = dimension_problem(n);
	if (problem != KNN_VALUE_OK)
		return problem;
	if (ARR_HASNULL(array) && array_contains_nulls(array))
		return KNN_VALUE_NULLS;
	if ((Size) n * element_size > size - data_offset)
		return KNN_VALUE_MALFORMED;
	view->dim = n;
	view->elements = ARR_DATA_PTR(array);
	return KNN_VALUE_OK;
}

static KnnValueProblem
float4_array_view(struct varlena *value, KnnVectorView *view)
{
	return array_view(value, FLOAT4OID, sizeof(float4), view);
}

static KnnValueProblem
float8_array_view(struct varlena *value, KnnVectorView *view)
{
	return array_view(value, FLOAT8OID, sizeof(float8), view);
}

/* A halfvec: the same header as vector, binary16 elements. */
static KnnValueProblem
halfvec_view(struct varlena *value, KnnVectorView *view)
{
	Size		size = VARSIZE_ANY(value);
	HalfVector *v = (HalfVector *) value;
	KnnValueProblem problem;

	if (VARATT_IS_EXTENDED(value) || size < offsetof(HalfVector, x))
		return KNN_VALUE_MALFORMED;
	problem = dimension_problem(v->dim);
	if (problem != KNN_VALUE_OK)
		return problem;
	if (size != HALFVEC_SIZE(v->dim))
		return KNN_VALUE_MALFORMED;
	view->dim = v->dim;
	view->elements = v->x;
	return KNN_VALUE_OK;
}

/*
 * A bit string: int32 bit length, then its bytes (bit and bit varying);
 * the length must account for the value's size exactly.
 */
static KnnValueProblem
bit_view(struct varlena *value, KnnVectorView *view)
{
	Size		size = VARSIZE_ANY(value);
	VarBit	   *v = (VarBit *) value;
	int32		bits;

	if (VARATT_IS_EXTENDED(value) || size < VARHDRSZ + VARBITHDRSZ)
		return KNN_VALUE_MALFORMED;
	bits = VARBITLEN(v);
	/* any positive length fits an engine row (int32 bits, int64 bytes) */
	if (bits < 1)
		return bits == 0 ? KNN_VALUE_EMPTY : KNN_VALUE_MALFORMED;
	if (size != VARBITTOTALLEN((Size) bits))
		return KNN_VALUE_MALFORMED;
	view->dim = bits;
	view->elements = VARBITS(v);
	return KNN_VALUE_OK;
}

static bool
copy_float4(const KnnVectorView *view, void *row)
{
	float	   *out = row;
	const float4 *x = view->elements;
	bool		finite = true;

	for (int i = 0; i < view->dim; i++)
	{
		finite &= isfinite(x[i]);
		out[i] = x[i];
	}
	return finite;
}

static bool
copy_float8(const KnnVectorView *view, void *row)
{
	float	   *out = row;
	const float8 *x = view->elements;
	bool		finite = true;

	for (int i = 0; i < view->dim; i++)
	{
		/* a finite float8 beyond float4's range is no vector either */
		out[i] = (float) x[i];
		finite &= isfinite(x[i]) && isfinite(out[i]);
	}
	return finite;
}

/* The raw binary16 bits, no widening (the engine widens). */
static bool
copy_half(const KnnVectorView *view, void *row)
{
	uint16	   *out = row;
	const uint16 *x = view->elements;
	bool		finite = true;

	for (int i = 0; i < view->dim; i++)
	{
		finite &= knn_half_is_finite(x[i]);
		out[i] = x[i];
	}
	return finite;
}

/*
 * A vector's float4 values rounded to binary16, as pgvector's implicit
 * cast vector -> halfvec does; a value beyond binary16's range is no
 * halfvec (that cast raises "out of range").
 */
static bool
copy_float4_as_half(const KnnVectorView *view, void *row)
{
	uint16	   *out = row;
	const float4 *x = view->elements;
	bool		finite = true;

	for (int i = 0; i < view->dim; i++)
	{
		out[i] = knn_float_to_half(x[i]);
		finite &= knn_half_is_finite(out[i]);
	}
	return finite;
}

/* The bytes as they are; the padding bits past dim are zero in a bit value. */
static bool
copy_bits(const KnnVectorView *view, void *row)
{
	memcpy(row, view->elements, knn_row_bytes(KNN_ELEMENT_BIT, view->dim));
	return true;
}

/* The first reader of a kind is the one of its own element type. */
static const KnnVectorReader readers[] = {
	{KNN_VECTOR_TYPE, KNN_ELEMENT_FLOAT32, vector_view, copy_float4},
	{KNN_VECTOR_FLOAT4_ARRAY, KNN_ELEMENT_FLOAT32, float4_array_view, copy_float4},
	{KNN_VECTOR_FLOAT8_ARRAY, KNN_ELEMENT_FLOAT32, float8_array_view, copy_float8},
	{KNN_VECTOR_HALFVEC, KNN_ELEMENT_FLOAT16, halfvec_view, copy_half},
	{KNN_VECTOR_BIT, KNN_ELEMENT_BIT, bit_view, copy_bits},
	{KNN_VECTOR_TYPE, KNN_ELEMENT_FLOAT16, vector_view, copy_float4_as_half},
};

const KnnVectorReader *
knn_vector_reader_for(KnnVectorKind kind, KnnElement element)
{
	for (int i = 0; i < (int) lengthof(readers); i++)
		if (readers[i].kind == kind && readers[i].element == element)
			return &readers[i];
	return NULL;
}

KnnElement
knn_vector_kind_element(KnnVectorKind kind)
{
	for (int i = 0; i < (int) lengthof(readers); i++)
		if (readers[i].kind == kind)
			return readers[i].element;
	return KNN_ELEMENT_FLOAT32;
}

const KnnVectorReader *
knn_vector_reader(KnnVectorKind kind)
{
	const KnnVectorReader *reader = knn_vector_reader_for(kind, knn_vector_kind_element(kind));

	if (reader == NULL)
		elog(ERROR, "unsupported vector kind %d", (int) kind);
	return reader;
}

Size
knn_row_bytes(KnnElement element, int dim)
{
	switch (element)
	{
		case KNN_ELEMENT_FLOAT16:
			return (Size) dim * sizeof(uint16);
		case KNN_ELEMENT_BIT:
			return ((Size) dim + 7) / 8;
		case KNN_ELEMENT_FLOAT32:
		default:
			return (Size) dim * sizeof(float);
	}
}

void
knn_vector_problem_error(KnnValueProblem problem, const char *set_name, int64 id)
{
	switch (problem)
	{
		case KNN_VALUE_EMPTY:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("%s id " INT64_FORMAT " has an empty vector", set_name, id)));
			break;
		case KNN_VALUE_TOO_LONG:
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("%s id " INT64_FORMAT " has more than %d dimensions",
							set_name, id, VECTOR_MAX_DIM)));
			break;
		case KNN_VALUE_NOT_1D:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("%s id " INT64_FORMAT " has a multidimensional array", set_name, id),
					 errhint("Vectors given as arrays must be one-dimensional.")));
			break;
		case KNN_VALUE_NULLS:
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s id " INT64_FORMAT " has an array with NULL elements", set_name, id),
					 errhint("A NULL vector is skipped; a vector must not contain NULLs.")));
			break;
		case KNN_VALUE_NOT_FINITE:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("%s id " INT64_FORMAT " has a NaN or infinite value", set_name, id),
					 errhint("Vectors must hold finite numbers (a vector joined with halfvec values must fit in halfvec).")));
			break;
		case KNN_VALUE_MALFORMED:
			break;
		case KNN_VALUE_OK:
			elog(ERROR, "no problem to report for %s id " INT64_FORMAT, set_name, id);
			break;
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("%s id " INT64_FORMAT " has a malformed value", set_name, id),
			 errdetail("Its length does not match its header.")));
}
