/*
 * vector_aggregate.c -- avg(vector)'s transition, combine and final
 * functions, with pgvector's state and results (sum(vector) needs none of
 * its own: its transition and combine function is knn_vector_add). The
 * state's rules serve avg(halfvec) too (halfvec_aggregate.c, through
 * vector_aggregate.h): pgvector keeps the same state for both types, and
 * its halfvec_combine is vector_combine.
 *
 * The state is a float8[] {n, s1, ..., sdim}: the count of values and the
 * element sums in double precision (as float4_accum keeps its sums), so
 * that a long average loses nothing a float sum would. It starts as {0}
 * (INITCOND): no dimension yet; the first vector sets it. Being an
 * ordinary array, the state travels between parallel workers as it is,
 * and the combine function adds two of them. States come from SQL too
 * (the functions can be called directly): every one is checked before
 * its values are read.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/float.h"

#include "vector.h"
#include "vector_aggregate.h"
#include "vector_checks.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_vector_accum);
PG_FUNCTION_INFO_V1(knn_vector_combine);
PG_FUNCTION_INFO_V1(knn_vector_avg);

/*
 * The state's values after checking its shape: one dimension, at least
 * the count, float8, no NULLs. function_name is the SQL name, for the
 * message (pgvector's words; an internal error, as there: a forged state
 * fails as it does with pgvector, which test/pgvector compares).
 */
static float8 *
state_values(ArrayType *state, const char *function_name, int *dim_out)
{
	if (ARR_NDIM(state) != 1 || ARR_DIMS(state)[0] < 1 ||
		ARR_HASNULL(state) || ARR_ELEMTYPE(state) != FLOAT8OID)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("%s: expected state array", function_name)));
	*dim_out = ARR_DIMS(state)[0] - 1;
	return (float8 *) ARR_DATA_PTR(state);
}

static ArrayType *
make_state(float8 n, const float8 *sums, int dim)
{
	Datum	   *elements = palloc(sizeof(Datum) * ((Size) dim + 1));
	ArrayType  *result;

	elements[0] = Float8GetDatum(n);
	for (int i = 0; i < dim; i++)
		elements[i + 1] = Float8GetDatum(sums[i]);
	result = construct_array(elements, dim + 1, FLOAT8OID, sizeof(float8),
							 FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
	pfree(elements);
	return result;
}

/* a + b element by element; an infinite sum is an overflow error. */
static float8 *
add_sums(const float8 *a, const float8 *b, int dim)
{
	float8	   *sums = palloc(sizeof(float8) * Max(dim, 1));

	for (int i = 0; i < dim; i++)
	{
		sums[i] = a[i] + b[i];
		if (isinf(sums[i]))
			float_overflow_error();
	}
	return sums;
}

/* The state after one more value (vector_aggregate.h). */
ArrayType *
knn_avg_state_accum(ArrayType *state, const float *value, int value_dim, const char *function_name)
{
	int			dim;
	float8	   *values = state_values(state, function_name, &dim);
	float8	   *sums;

	if (dim == 0)
	{
		/* the first value: its elements are the sums */
		dim = value_dim;
		sums = palloc(sizeof(float8) * dim);
		for (int i = 0; i < dim; i++)
			sums[i] = value[i];
	}
	else
	{
		float8	   *widened;

		knn_vector_check_typmod(dim, value_dim);
		widened = palloc(sizeof(float8) * dim);
		for (int i = 0; i < dim; i++)
			widened[i] = value[i];
		sums = add_sums(values + 1, widened, dim);
	}
	return make_state(values[0] + 1.0, sums, dim);
}

Datum
knn_vector_accum(PG_FUNCTION_ARGS)
{
	ArrayType  *state = PG_GETARG_ARRAYTYPE_P(0);
	Vector	   *value = knn_vector_arg(fcinfo, 1);

	PG_RETURN_ARRAYTYPE_P(knn_avg_state_accum(state, value->x, value->dim, "vector_accum"));
}

Datum
knn_vector_combine(PG_FUNCTION_ARGS)
{
	ArrayType  *state1 = PG_GETARG_ARRAYTYPE_P(0);
	ArrayType  *state2 = PG_GETARG_ARRAYTYPE_P(1);
	int			dim1;
	int			dim2;
	float8	   *values1 = state_values(state1, "vector_combine", &dim1);
	float8	   *values2 = state_values(state2, "vector_combine", &dim2);
	float8		n = values1[0] + values2[0];

	/* a state without a dimension (no value yet) takes the other's sums */
	if (dim1 == 0 && dim2 == 0)
		PG_RETURN_ARRAYTYPE_P(make_state(n, NULL, 0));
	if (dim2 == 0)
	{
		knn_vector_check_dim(dim1);
		PG_RETURN_ARRAYTYPE_P(make_state(n, values1 + 1, dim1));
	}
	if (dim1 == 0)
	{
		knn_vector_check_dim(dim2);
		PG_RETURN_ARRAYTYPE_P(make_state(n, values2 + 1, dim2));
	}
	knn_vector_check_dim(dim1);
	knn_vector_check_typmod(dim1, dim2);
	PG_RETURN_ARRAYTYPE_P(make_state(n, add_sums(values1 + 1, values2 + 1, dim1), dim1));
}

/* The means, sums over the count, rounded to float (vector_aggregate.h). */
float *
knn_avg_state_means(ArrayType *state, const char *function_name, int *dim_out)
{
	float8	   *values = state_values(state, function_name, dim_out);
	float8		n = values[0];
	float	   *means;

	if (n == 0.0)
		return NULL;
	means = palloc(sizeof(float) * Max(*dim_out, 1));
	for (int i = 0; i < *dim_out; i++)
		means[i] = (float) (values[i + 1] / n);
	return means;
}

/* The means as a vector; NULL for no values (SQL's avg). */
Datum
knn_vector_avg(PG_FUNCTION_ARGS)
{
	int			dim;
	float	   *means = knn_avg_state_means(PG_GETARG_ARRAYTYPE_P(0), "vector_avg", &dim);
	Vector	   *result;

	if (means == NULL)
		PG_RETURN_NULL();
	result = knn_vector_new(dim);
	for (int i = 0; i < dim; i++)
	{
		knn_vector_check_element(means[i]);
		result->x[i] = means[i];
	}
	PG_RETURN_VECTOR_P(result);
}
