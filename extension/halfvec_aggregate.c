/*
 * halfvec_aggregate.c -- avg(halfvec)'s transition and final functions
 * (halfvec_accum, halfvec_avg), created only with knn_gpu's own halfvec
 * (extension/sql/18_halfvec_functions.sql). The state is avg(vector)'s
 * (vector_aggregate.h): the count and the sums of the widened elements in
 * double precision, so that the combine function is vector_combine's, as
 * in pgvector. sum(halfvec) needs none of its own: its transition and
 * combine function is halfvec_add.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/array.h"

#include "halfvec.h"
#include "vector_aggregate.h"

PG_FUNCTION_INFO_V1(knn_halfvec_accum);
PG_FUNCTION_INFO_V1(knn_halfvec_avg);

Datum
knn_halfvec_accum(PG_FUNCTION_ARGS)
{
	ArrayType  *state = PG_GETARG_ARRAYTYPE_P(0);
	HalfVector *value = knn_halfvec_arg(fcinfo, 1);
	float	   *widened = palloc(sizeof(float) * value->dim);
	ArrayType  *result;

	knn_halfvec_widen(value, widened);
	result = knn_avg_state_accum(state, widened, value->dim, "halfvec_accum");
	pfree(widened);
	PG_RETURN_ARRAYTYPE_P(result);
}

/*
 * The means rounded to float and then to half ("out of range for type
 * halfvec" beyond binary16); NULL for no values (SQL's avg).
 */
Datum
knn_halfvec_avg(PG_FUNCTION_ARGS)
{
	int			dim;
	float	   *means = knn_avg_state_means(PG_GETARG_ARRAYTYPE_P(0), "halfvec_avg", &dim);
	HalfVector *result;

	if (means == NULL)
		PG_RETURN_NULL();
	result = knn_halfvec_new(dim);
	for (int i = 0; i < dim; i++)
		result->x[i] = knn_halfvec_element(means[i]);
	PG_RETURN_HALFVEC_P(result);
}
