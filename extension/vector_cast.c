/*
 * vector_cast.c -- the casts between vector and arrays, as pgvector has them:
 *   integer[], real[], double precision[], numeric[] -> vector  (assignment)
 *   vector -> real[]                                          (implicit)
 * An array becomes a vector only when it is one-dimensional, has no NULL,
 * 1..VECTOR_MAX_DIM elements, and every element is a finite float; the
 * target's typmod vector(n) is checked here too, since PostgreSQL passes it
 * to the cast function instead of applying the vector -> vector(n) cast.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "vector.h"
#include "vector_checks.h"

PG_FUNCTION_INFO_V1(knn_array_to_vector);
PG_FUNCTION_INFO_V1(knn_vector_to_float4);

/*
 * An array element as a float, rounded to nearest like a cast to real
 * (vector_checks.h); type_name names the target in the error.
 */
float
knn_array_element_to_float(Datum element, Oid element_type, const char *type_name)
{
	switch (element_type)
	{
		case INT4OID:
			return (float) DatumGetInt32(element);
		case FLOAT4OID:
			return DatumGetFloat4(element);
		case FLOAT8OID:
			return (float) DatumGetFloat8(element);
		case NUMERICOID:
			/* numeric_float4 reports values beyond the float range itself */
			return DatumGetFloat4(DirectFunctionCall1(numeric_float4, element));
		default:
			elog(ERROR, "cannot cast an array of type %s to %s",
				 format_type_be(element_type), type_name);
			return 0;			/* keep the compiler quiet */
	}
}

/* The elements of a 1-D array without NULLs (vector_checks.h). */
Datum *
knn_array_elements(ArrayType *array, int max_elements, int *n_out)
{
	Oid			element_type = ARR_ELEMTYPE(array);
	int16		element_len;
	bool		element_byval;
	char		element_align;
	Datum	   *elements;

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("array must be 1-D")));
	if (array_contains_nulls(array))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("array must not contain nulls")));
	*n_out = ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
	if (*n_out > max_elements)
		return NULL;

	get_typlenbyvalalign(element_type, &element_len, &element_byval, &element_align);
	deconstruct_array(array, element_type, element_len, element_byval, element_align,
					  &elements, NULL, n_out);
	return elements;
}

/* SQL: knn_array_to_vector(anyof integer[]/real[]/float8[]/numeric[], typmod, explicit) */
Datum
knn_array_to_vector(PG_FUNCTION_ARGS)
{
	ArrayType  *array = PG_GETARG_ARRAYTYPE_P(0);
	int32		typmod = PG_GETARG_INT32(1);
	Oid			element_type = ARR_ELEMTYPE(array);
	int			n;
	Datum	   *elements = knn_array_elements(array, VECTOR_MAX_DIM, &n);
	Vector	   *result;

	/* an empty array has no dimension at all, hence n == 0 */
	knn_vector_check_dim(n);
	knn_vector_check_typmod(typmod, n);

	result = knn_vector_new(n);
	for (int i = 0; i < n; i++)
	{
		result->x[i] = knn_array_element_to_float(elements[i], element_type, "vector");
		knn_vector_check_element(result->x[i]);
	}
	pfree(elements);
	PG_RETURN_VECTOR_P(result);
}

/* SQL: knn_vector_to_float4(vector, typmod, explicit) -> real[] */
Datum
knn_vector_to_float4(PG_FUNCTION_ARGS)
{
	Vector	   *vector = PG_GETARG_VECTOR_P(0);
	Datum	   *elements = palloc(sizeof(Datum) * vector->dim);
	ArrayType  *result;

	for (int i = 0; i < vector->dim; i++)
		elements[i] = Float4GetDatum(vector->x[i]);
	/* float4 is passed by value and int-aligned */
	result = construct_array(elements, vector->dim, FLOAT4OID,
							 sizeof(float4), true, TYPALIGN_INT);
	pfree(elements);
	PG_RETURN_ARRAYTYPE_P(result);
}
