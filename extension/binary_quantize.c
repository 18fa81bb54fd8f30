/*
 * binary_quantize.c -- binary_quantize(vector) and binary_quantize(halfvec)
 * -> bit, knn_gpu's own when pgvector's are absent (created with knn_gpu's
 * types: extension/sql/14_bit.sql): bit i is set when element i is > 0, as
 * pgvector has it. The first stage of a binary-quantised search (README).
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/varbit.h"

#include "half_float.h"
#include "halfvec.h"
#include "vector.h"

PG_FUNCTION_INFO_V1(knn_vector_binary_quantize);
PG_FUNCTION_INFO_V1(knn_halfvec_binary_quantize);

/* A zeroed bit(dim), its padding bits zero as PostgreSQL requires. */
static VarBit *
new_bits(int dim)
{
	Size		size = VARBITTOTALLEN(dim);
	VarBit	   *result = (VarBit *) palloc0(size);

	SET_VARSIZE(result, size);
	VARBITLEN(result) = dim;
	return result;
}

Datum
knn_vector_binary_quantize(PG_FUNCTION_ARGS)
{
	Vector	   *v = PG_GETARG_VECTOR_P(0);
	VarBit	   *result = new_bits(v->dim);
	bits8	   *out = VARBITS(result);

	for (int i = 0; i < v->dim; i++)
		if (v->x[i] > 0)
			out[i / 8] |= (bits8) (0x80 >> (i % 8));
	PG_RETURN_VARBIT_P(result);
}

Datum
knn_halfvec_binary_quantize(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);
	VarBit	   *result = new_bits(v->dim);
	bits8	   *out = VARBITS(result);

	for (int i = 0; i < v->dim; i++)
		if (knn_half_to_float(v->x[i]) > 0)
			out[i / 8] |= (bits8) (0x80 >> (i % 8));
	PG_RETURN_VARBIT_P(result);
}
