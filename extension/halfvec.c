/*
 * halfvec.c -- knn_gpu's halfvec type, created only when pgvector's is
 * absent (extension/sql/12_halfvec.sql): text and binary input/output, the
 * typmod halfvec(n), vector_dims, and the casts pgvector has
 *   halfvec -> halfvec(n) (implicit), vector -> halfvec (implicit),
 *   halfvec -> vector, halfvec -> real[], integer[]/real[]/double
 *   precision[]/numeric[] -> halfvec (assignment).
 *
 * Everything observable matches pgvector's halfvec: the text form is that
 * of vector (elements printed as the shortest decimal of the widened
 * float), values are rounded to nearest even, and the same values are
 * rejected with the same SQLSTATEs and messages.
 */
#include "postgres.h"

#include <errno.h>
#include <math.h>

#include "catalog/pg_type.h"
#include "common/shortest_dec.h"
#include "libpq/pqformat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "half_float.h"
#include "halfvec.h"
#include "vector.h"
#include "vector_checks.h"

PG_FUNCTION_INFO_V1(knn_halfvec_in);
PG_FUNCTION_INFO_V1(knn_halfvec_out);
PG_FUNCTION_INFO_V1(knn_halfvec_typmod_in);
PG_FUNCTION_INFO_V1(knn_halfvec_recv);
PG_FUNCTION_INFO_V1(knn_halfvec_send);
PG_FUNCTION_INFO_V1(knn_halfvec_typmod_cast);
PG_FUNCTION_INFO_V1(knn_halfvec_dims);
PG_FUNCTION_INFO_V1(knn_halfvec_to_vector);
PG_FUNCTION_INFO_V1(knn_vector_to_halfvec);
PG_FUNCTION_INFO_V1(knn_halfvec_to_float4);
PG_FUNCTION_INFO_V1(knn_array_to_halfvec);

/* ---- validity rules ---- */

static void
check_dim(int dim)
{
	if (dim < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("halfvec must have at least 1 dimension")));
	if (dim > HALFVEC_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("halfvec cannot have more than %d dimensions", HALFVEC_MAX_DIM)));
}

void
knn_halfvec_check_typmod(int32 typmod, int dim)
{
	if (typmod != -1 && typmod != dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("expected %d dimensions, not %d", typmod, dim)));
}

/* A stored (or received) element: no NaN, no infinity. */
static void
check_half(uint16 h)
{
	if ((h & 0x7C00) == 0x7C00)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 (h & 0x3FF) != 0 ? errmsg("NaN not allowed in halfvec")
				 : errmsg("infinite value not allowed in halfvec")));
}

static void report_out_of_range(float value) pg_attribute_noreturn();

static void
report_out_of_range(float value)
{
	char		buf[FLOAT_SHORTEST_DECIMAL_LEN];

	float_to_shortest_decimal_buf(value, buf);
	ereport(ERROR,
			(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
			 errmsg("\"%s\" is out of range for type halfvec", buf)));
}

uint16
knn_halfvec_element(float value)
{
	uint16		h = knn_float_to_half(value);

	if (!knn_half_is_finite(h) && isfinite(value))
		report_out_of_range(value);
	check_half(h);
	return h;
}

HalfVector *
knn_halfvec_arg(FunctionCallInfo fcinfo, int n)
{
	HalfVector *v = DatumGetHalfVector(PG_GETARG_DATUM(n));

	if (VARSIZE_ANY(v) < offsetof(HalfVector, x) ||
		v->dim < 1 || v->dim > HALFVEC_MAX_DIM ||
		VARSIZE_ANY(v) != HALFVEC_SIZE(v->dim))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("invalid halfvec value: %u bytes for its dimension count",
						(unsigned int) VARSIZE_ANY(v))));
	return v;
}

void
knn_halfvec_check_same_dims(const HalfVector *a, const HalfVector *b)
{
	if (a->dim != b->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different halfvec dimensions %d and %d", a->dim, b->dim)));
}

HalfVector *
knn_halfvec_new(int dim)
{
	Size		size;
	HalfVector *result;

	check_dim(dim);
	size = HALFVEC_SIZE(dim);
	result = (HalfVector *) palloc0(size);
	SET_VARSIZE(result, size);
	result->dim = (int16) dim;
	return result;
}

void
knn_halfvec_widen(const HalfVector *v, float *out)
{
	for (int i = 0; i < v->dim; i++)
		out[i] = knn_half_to_float(v->x[i]);
}

/* ---- text form ---- */

/*
 * A number of the text form: strtof, as float4in, then rounded to half (the
 * text rounds once to float, then to half, as pgvector's halfvec_in); only
 * a finite value can overflow (NaN and infinities are refused by check_half).
 */
static void
check_halfvec_text_element(float value, const char *number, int number_len)
{
	uint16		h = knn_float_to_half(value);

	if ((h & 0x7FFF) == 0x7C00 && !isinf(value))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("\"%s\" is out of range for type halfvec", pnstrdup(number, number_len))));
	check_half(h);
}

Datum
knn_halfvec_in(PG_FUNCTION_ARGS)
{
	const char *literal = PG_GETARG_CSTRING(0);
	int32		typmod = PG_GETARG_INT32(2);
	int			dim;
	float	   *values = knn_parse_vector_text(literal, "halfvec", HALFVEC_MAX_DIM,
											   check_halfvec_text_element, &dim);
	HalfVector *result;

	knn_halfvec_check_typmod(typmod, dim);
	result = knn_halfvec_new(dim);
	for (int i = 0; i < dim; i++)
		result->x[i] = knn_float_to_half(values[i]);
	pfree(values);
	PG_RETURN_HALFVEC_P(result);
}

Datum
knn_halfvec_out(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);
	char	   *text = palloc((Size) v->dim * FLOAT_SHORTEST_DECIMAL_LEN + 2);
	char	   *p = text;

	*p++ = '[';
	for (int i = 0; i < v->dim; i++)
	{
		if (i > 0)
			*p++ = ',';
		p += float_to_shortest_decimal_bufn(knn_half_to_float(v->x[i]), p);
	}
	*p++ = ']';
	*p = '\0';
	PG_FREE_IF_COPY(v, 0);
	PG_RETURN_CSTRING(text);
}

/* ---- typmod: halfvec(n); its output is the default "(n)" ---- */

Datum
knn_halfvec_typmod_in(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(knn_dimensions_typmod(PG_GETARG_ARRAYTYPE_P(0), "halfvec", HALFVEC_MAX_DIM));
}

Datum
knn_halfvec_typmod_cast(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);

	knn_halfvec_check_typmod(PG_GETARG_INT32(1), v->dim);
	PG_RETURN_HALFVEC_P(v);
}

/* ---- binary form: int16 dim, int16 unused, dim uint16, network order ---- */

Datum
knn_halfvec_recv(PG_FUNCTION_ARGS)
{
	StringInfo	message = (StringInfo) PG_GETARG_POINTER(0);
	int32		typmod = PG_GETARG_INT32(2);
	int			dim = (int) pq_getmsgint(message, sizeof(int16));
	int			unused = (int) pq_getmsgint(message, sizeof(int16));
	HalfVector *result;

	check_dim(dim);
	knn_halfvec_check_typmod(typmod, dim);
	if (unused != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("expected unused to be 0, not %d", unused)));
	result = knn_halfvec_new(dim);
	for (int i = 0; i < dim; i++)
	{
		result->x[i] = (uint16) pq_getmsgint(message, sizeof(uint16));
		check_half(result->x[i]);
	}
	PG_RETURN_HALFVEC_P(result);
}

Datum
knn_halfvec_send(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);
	StringInfoData message;

	pq_begintypsend(&message);
	pq_sendint16(&message, (uint16) v->dim);
	pq_sendint16(&message, (uint16) v->unused);
	for (int i = 0; i < v->dim; i++)
		pq_sendint16(&message, v->x[i]);
	PG_RETURN_BYTEA_P(pq_endtypsend(&message));
}

Datum
knn_halfvec_dims(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);

	PG_RETURN_INT32(v->dim);
}

/* ---- casts ---- */

Datum
knn_halfvec_to_vector(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);
	Vector	   *result;

	knn_halfvec_check_typmod(PG_GETARG_INT32(1), v->dim);
	result = knn_vector_new(v->dim);
	knn_halfvec_widen(v, result->x);
	PG_RETURN_POINTER(result);
}

Datum
knn_vector_to_halfvec(PG_FUNCTION_ARGS)
{
	Vector	   *v = PG_GETARG_VECTOR_P(0);	/* size-checked */
	HalfVector *result;

	check_dim(v->dim);
	knn_halfvec_check_typmod(PG_GETARG_INT32(1), v->dim);
	result = knn_halfvec_new(v->dim);
	for (int i = 0; i < v->dim; i++)
		result->x[i] = knn_halfvec_element(v->x[i]);
	PG_RETURN_HALFVEC_P(result);
}

Datum
knn_halfvec_to_float4(PG_FUNCTION_ARGS)
{
	HalfVector *v = PG_GETARG_HALFVEC_P(0);
	Datum	   *elements = palloc(sizeof(Datum) * v->dim);
	ArrayType  *result;

	for (int i = 0; i < v->dim; i++)
		elements[i] = Float4GetDatum(knn_half_to_float(v->x[i]));
	result = construct_array(elements, v->dim, FLOAT4OID, sizeof(float4), true, TYPALIGN_INT);
	pfree(elements);
	PG_RETURN_ARRAYTYPE_P(result);
}

/* SQL: knn_array_to_halfvec(integer[]/real[]/float8[]/numeric[], typmod, explicit) */
Datum
knn_array_to_halfvec(PG_FUNCTION_ARGS)
{
	ArrayType  *array = PG_GETARG_ARRAYTYPE_P(0);
	int32		typmod = PG_GETARG_INT32(1);
	Oid			element_type = ARR_ELEMTYPE(array);
	int			n;
	Datum	   *elements = knn_array_elements(array, HALFVEC_MAX_DIM, &n);
	HalfVector *result;

	check_dim(n);
	knn_halfvec_check_typmod(typmod, n);
	result = knn_halfvec_new(n);
	/* pgvector: every element's range first, then NaN and infinities */
	for (int i = 0; i < n; i++)
	{
		float		value = knn_array_element_to_float(elements[i], element_type, "halfvec");

		result->x[i] = knn_float_to_half(value);
		if (!knn_half_is_finite(result->x[i]) && isfinite(value))
			report_out_of_range(value);
	}
	for (int i = 0; i < n; i++)
		check_half(result->x[i]);
	pfree(elements);
	PG_RETURN_HALFVEC_P(result);
}
