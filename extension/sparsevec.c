/*
 * sparsevec.c -- knn_gpu's sparsevec type, created only when pgvector's is
 * absent (extension/sql/13_sparsevec.sql): the validity rules, text and
 * binary input/output, the typmod sparsevec(n) and its cast.
 *
 * Everything observable matches pgvector's sparsevec: the text form
 * '{i:x,...}/dim' (indices 1-based, in any order, zeros dropped; printed
 * sorted, each value as the shortest decimal of its float), the binary
 * form (int32 dim, nnz, unused, then the 0-based indices, then the values,
 * network order), and the same inputs rejected with the same SQLSTATEs
 * and messages, checked in the same order.
 */
#include "postgres.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "common/shortest_dec.h"
#include "libpq/pqformat.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "sparsevec.h"
#include "vector_checks.h"

PG_FUNCTION_INFO_V1(knn_sparsevec_in);
PG_FUNCTION_INFO_V1(knn_sparsevec_out);
PG_FUNCTION_INFO_V1(knn_sparsevec_typmod_in);
PG_FUNCTION_INFO_V1(knn_sparsevec_recv);
PG_FUNCTION_INFO_V1(knn_sparsevec_send);
PG_FUNCTION_INFO_V1(knn_sparsevec_typmod_cast);

/* ---- validity rules ---- */

void
knn_sparsevec_check_dim(int dim)
{
	if (dim < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("sparsevec must have at least 1 dimension")));
	if (dim > SPARSEVEC_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("sparsevec cannot have more than %d dimensions", SPARSEVEC_MAX_DIM)));
}

void
knn_sparsevec_check_nnz(int nnz, int dim)
{
	if (nnz < 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("sparsevec cannot have negative number of elements")));
	if (nnz > SPARSEVEC_MAX_NNZ)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("sparsevec cannot have more than %d non-zero elements", SPARSEVEC_MAX_NNZ)));
	if (nnz > dim)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("sparsevec cannot have more elements than dimensions")));
}

void
knn_sparsevec_check_element(float value)
{
	if (isnan(value))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("NaN not allowed in sparsevec")));
	if (isinf(value))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("infinite value not allowed in sparsevec")));
}

/*
 * Element i's index, the ones before it already checked: inside 0..dim-1
 * and above its predecessor (pgvector's order of the three messages).
 */
static void
check_index(const int32 *indices, int i, int dim)
{
	if (indices[i] < 0 || indices[i] >= dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("sparsevec index out of bounds")));
	if (i > 0 && indices[i] < indices[i - 1])
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("sparsevec indices must be in ascending order")));
	if (i > 0 && indices[i] == indices[i - 1])
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("sparsevec indices must not contain duplicates")));
}

/* Zero-filled, nnz in 0..SPARSEVEC_MAX_NNZ (the caller's to check). */
static SparseVector *
allocate(int dim, int nnz)
{
	Size		size = SPARSEVEC_SIZE(nnz);
	SparseVector *result = (SparseVector *) palloc0(size);

	SET_VARSIZE(result, size);
	result->dim = dim;
	result->nnz = nnz;
	return result;
}

SparseVector *
knn_sparsevec_new(int dim, int nnz)
{
	knn_sparsevec_check_dim(dim);
	knn_sparsevec_check_nnz(nnz, dim);
	return allocate(dim, nnz);
}

SparseVector *
knn_sparsevec_arg(FunctionCallInfo fcinfo, int n)
{
	SparseVector *v = (SparseVector *) PG_DETOAST_DATUM(PG_GETARG_DATUM(n));
	Size		size = VARSIZE_ANY(v);

	if (size < SPARSEVEC_HEADER_SIZE ||
		v->dim < 1 || v->dim > SPARSEVEC_MAX_DIM ||
		v->nnz < 0 || v->nnz > SPARSEVEC_MAX_NNZ || v->nnz > v->dim ||
		size != SPARSEVEC_SIZE(v->nnz))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("invalid sparsevec value: %u bytes for its number of elements",
						(unsigned int) size)));
	return v;
}

/* ---- text form ---- */

typedef struct SparseElement
{
	int32		index;			/* 0-based */
	float		value;
} SparseElement;

/* The blanks allowed around every token (those of array_in). */
static inline bool
is_sparsevec_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static const char *
skip_blanks(const char *p)
{
	while (is_sparsevec_blank(*p))
		p++;
	return p;
}

static void report_syntax(const char *literal, const char *detail) pg_attribute_noreturn();

static void
report_syntax(const char *literal, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
			 errmsg("invalid input syntax for type sparsevec: \"%s\"", literal),
			 detail ? errdetail("%s", detail) : 0));
}

/*
 * A decimal integer at *p (strtol: optional sign, any number of digits),
 * clamped to low..high so that a huge one still gets the range message of
 * its field; *p is moved past it. A syntax error when there is none.
 */
static long
read_integer(const char **p, long low, long high, const char *literal)
{
	char	   *end;
	long		value = strtol(*p, &end, 10);

	if (end == *p)
		report_syntax(literal, NULL);
	*p = end;
	return Min(Max(value, low), high);
}

static int
compare_elements(const void *a, const void *b)
{
	int32		x = ((const SparseElement *) a)->index;
	int32		y = ((const SparseElement *) b)->index;

	return (x > y) - (x < y);
}

/*
 * '{i:x, ...}/dim', blanks around every token. The checks come in
 * pgvector's order: the number of commas against the element limit first,
 * then the syntax and each value as it is read (strtof as float4in: a
 * range error, NaN or an infinity), then dim and the typmod, then the
 * indices once sorted.
 */
Datum
knn_sparsevec_in(PG_FUNCTION_ARGS)
{
	const char *literal = PG_GETARG_CSTRING(0);
	int32		typmod = PG_GETARG_INT32(2);
	int			max_nnz = 1;
	int			nnz = 0;
	int			dim;
	SparseElement *elements;
	const char *p;
	SparseVector *result;
	float	   *values;

	for (p = literal; *p != '\0'; p++)
		max_nnz += (*p == ',');
	if (max_nnz > SPARSEVEC_MAX_NNZ)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("sparsevec cannot have more than %d non-zero elements", SPARSEVEC_MAX_NNZ)));
	elements = palloc(sizeof(SparseElement) * max_nnz);

	p = skip_blanks(literal);
	if (*p != '{')
		report_syntax(literal, "Vector contents must start with \"{\".");
	p = skip_blanks(p + 1);
	if (*p == '}')
		p++;
	else
	{
		for (;;)
		{
			long		index;
			float		value;
			char	   *end;

			/* every element but the last is followed by a comma */
			if (nnz >= max_nnz)
				elog(ERROR, "sparsevec input: more elements than commas");
			p = skip_blanks(p);
			if (*p == '\0')
				report_syntax(literal, NULL);
			index = read_integer(&p, (long) INT_MIN + 1, INT_MAX, literal);
			p = skip_blanks(p);
			if (*p != ':')
				report_syntax(literal, NULL);
			p = skip_blanks(p + 1);

			/* strtof as float4in (one rounding); LC_NUMERIC is C */
			errno = 0;
			value = strtof(p, &end);
			if (end == p)
				report_syntax(literal, NULL);
			if (errno == ERANGE && (value == 0 || isinf(value)))
				ereport(ERROR,
						(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
						 errmsg("\"%s\" is out of range for type sparsevec",
								pnstrdup(p, end - p))));
			knn_sparsevec_check_element(value);
			if (value != 0)
			{
				elements[nnz].index = (int32) (index - 1);
				elements[nnz].value = value;
				nnz++;
			}

			p = skip_blanks(end);
			if (*p == '}')
			{
				p++;
				break;
			}
			if (*p != ',')
				report_syntax(literal, NULL);
			p++;
		}
	}

	p = skip_blanks(p);
	if (*p != '/')
		report_syntax(literal, "Unexpected end of input.");
	p = skip_blanks(p + 1);
	dim = (int) read_integer(&p, INT_MIN, INT_MAX, literal);
	p = skip_blanks(p);
	if (*p != '\0')
		report_syntax(literal, "Junk after closing.");

	knn_sparsevec_check_dim(dim);
	knn_vector_check_typmod(typmod, dim);

	/*
	 * More elements than dimensions is an index out of bounds or a
	 * duplicate, as pgvector reports it: no element count check here.
	 */
	qsort(elements, nnz, sizeof(SparseElement), compare_elements);
	result = allocate(dim, nnz);
	values = SPARSEVEC_VALUES(result);
	for (int i = 0; i < nnz; i++)
	{
		result->indices[i] = elements[i].index;
		values[i] = elements[i].value;
		check_index(result->indices, i, dim);
	}
	pfree(elements);
	PG_RETURN_POINTER(result);
}

Datum
knn_sparsevec_out(PG_FUNCTION_ARGS)
{
	SparseVector *v = knn_sparsevec_arg(fcinfo, 0);
	const float *values = SPARSEVEC_VALUES(v);
	/* per element: ',' + an int32 (11) + ':' + a float; then "{}/" + dim + '\0' */
	char	   *text = palloc((Size) v->nnz * (13 + FLOAT_SHORTEST_DECIMAL_LEN) + 16);
	char	   *p = text;

	*p++ = '{';
	for (int i = 0; i < v->nnz; i++)
	{
		if (i > 0)
			*p++ = ',';
		p += pg_ltoa(v->indices[i] + 1, p);
		*p++ = ':';
		p += float_to_shortest_decimal_bufn(values[i], p);
	}
	*p++ = '}';
	*p++ = '/';
	p += pg_ltoa(v->dim, p);
	*p = '\0';
	PG_FREE_IF_COPY(v, 0);
	PG_RETURN_CSTRING(text);
}

/* ---- typmod: sparsevec(n); its output is the default "(n)" ---- */

Datum
knn_sparsevec_typmod_in(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(knn_dimensions_typmod(PG_GETARG_ARRAYTYPE_P(0), "sparsevec", SPARSEVEC_MAX_DIM));
}

/* SQL: sparsevec(sparsevec, typmod, explicit), the cast to sparsevec(n) */
Datum
knn_sparsevec_typmod_cast(PG_FUNCTION_ARGS)
{
	SparseVector *v = knn_sparsevec_arg(fcinfo, 0);

	knn_vector_check_typmod(PG_GETARG_INT32(1), v->dim);
	PG_RETURN_POINTER(v);
}

/* ---- binary form ---- */

/*
 * The header's three int32 (each read checks that the message holds it),
 * checked before anything is allocated; then every index, each checked as
 * it is read; then every value (finite, not zero: the binary form holds
 * only stored elements). Bytes left over are COPY's error (22P03).
 */
Datum
knn_sparsevec_recv(PG_FUNCTION_ARGS)
{
	StringInfo	message = (StringInfo) PG_GETARG_POINTER(0);
	int32		typmod = PG_GETARG_INT32(2);
	int32		dim = (int32) pq_getmsgint(message, sizeof(int32));
	int32		nnz = (int32) pq_getmsgint(message, sizeof(int32));
	int32		unused = (int32) pq_getmsgint(message, sizeof(int32));
	SparseVector *result;
	float	   *values;

	knn_sparsevec_check_dim(dim);
	knn_sparsevec_check_nnz(nnz, dim);
	knn_vector_check_typmod(typmod, dim);
	if (unused != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("expected unused to be 0, not %d", unused)));

	result = knn_sparsevec_new(dim, nnz);
	values = SPARSEVEC_VALUES(result);
	for (int i = 0; i < nnz; i++)
	{
		result->indices[i] = (int32) pq_getmsgint(message, sizeof(int32));
		check_index(result->indices, i, dim);
	}
	for (int i = 0; i < nnz; i++)
	{
		values[i] = pq_getmsgfloat4(message);
		knn_sparsevec_check_element(values[i]);
		if (values[i] == 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("binary representation of sparsevec cannot contain zero values")));
	}
	PG_RETURN_POINTER(result);
}

Datum
knn_sparsevec_send(PG_FUNCTION_ARGS)
{
	SparseVector *v = knn_sparsevec_arg(fcinfo, 0);
	const float *values = SPARSEVEC_VALUES(v);
	StringInfoData message;

	pq_begintypsend(&message);
	pq_sendint32(&message, (uint32) v->dim);
	pq_sendint32(&message, (uint32) v->nnz);
	pq_sendint32(&message, (uint32) v->unused);
	for (int i = 0; i < v->nnz; i++)
		pq_sendint32(&message, (uint32) v->indices[i]);
	for (int i = 0; i < v->nnz; i++)
		pq_sendfloat4(&message, values[i]);
	PG_RETURN_BYTEA_P(pq_endtypsend(&message));
}
