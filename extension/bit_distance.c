/*
 * bit_distance.c -- hamming_distance and jaccard_distance on PostgreSQL's
 * bit (the operators <~> and <%>), knn_gpu's own when pgvector's are
 * absent: pgvector's definitions, on the same popcounts as the CPU bit
 * engine (kernels/cpu/bit_join.h), so the operators and the joins agree.
 */
#include "postgres.h"

#include "fmgr.h"
#include "port/pg_bitutils.h"
#include "utils/varbit.h"

PG_FUNCTION_INFO_V1(knn_bit_hamming_distance);
PG_FUNCTION_INFO_V1(knn_bit_jaccard_distance);

static void
check_same_length(const VarBit *a, const VarBit *b)
{
	if (VARBITLEN(a) != VARBITLEN(b))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different bit lengths %u and %u", VARBITLEN(a), VARBITLEN(b))));
}

Datum
knn_bit_hamming_distance(PG_FUNCTION_ARGS)
{
	VarBit	   *a = PG_GETARG_VARBIT_P(0);
	VarBit	   *b = PG_GETARG_VARBIT_P(1);
	const bits8 *x = VARBITS(a);
	const bits8 *y = VARBITS(b);
	uint64		differing = 0;

	check_same_length(a, b);
	for (int i = 0; i < VARBITBYTES(a); i++)
		differing += pg_number_of_ones[x[i] ^ y[i]];
	PG_RETURN_FLOAT8((double) differing);
}

/* 1 - |a&b| / |a|b|, and 1 when a&b is empty (two all-zero strings too). */
Datum
knn_bit_jaccard_distance(PG_FUNCTION_ARGS)
{
	VarBit	   *a = PG_GETARG_VARBIT_P(0);
	VarBit	   *b = PG_GETARG_VARBIT_P(1);
	const bits8 *x = VARBITS(a);
	const bits8 *y = VARBITS(b);
	uint64		ab = 0;
	uint64		aa = 0;
	uint64		bb = 0;

	check_same_length(a, b);
	for (int i = 0; i < VARBITBYTES(a); i++)
	{
		ab += pg_number_of_ones[x[i] & y[i]];
		aa += pg_number_of_ones[x[i]];
		bb += pg_number_of_ones[y[i]];
	}
	if (ab == 0)
		PG_RETURN_FLOAT8(1);
	PG_RETURN_FLOAT8(1 - ((double) ab / (double) (aa + bb - ab)));
}
