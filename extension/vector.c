/*
 * vector.c -- the vector type itself: text and binary input/output, the
 * typmod vector(n), and the two functions about a single value (vector_dims,
 * vector_norm).
 *
 * Everything observable matches pgvector, so that a value, a text literal or
 * a COPY BINARY file moves between the two extensions unchanged:
 *   text    '[1,2.5,-3]'; blanks allowed around numbers and brackets;
 *           elements printed as the shortest decimal that reads back exactly.
 *   binary  int16 dim, int16 unused (0), dim float4, all in network order.
 *   storage see vector.h.
 */
#include "postgres.h"

#include <errno.h>
#include <math.h>

#include "common/shortest_dec.h"
#include "libpq/pqformat.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "vector.h"
#include "vector_checks.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_vector_in);
PG_FUNCTION_INFO_V1(knn_vector_out);
PG_FUNCTION_INFO_V1(knn_vector_typmod_in);
PG_FUNCTION_INFO_V1(knn_vector_typmod_out);
PG_FUNCTION_INFO_V1(knn_vector_recv);
PG_FUNCTION_INFO_V1(knn_vector_send);
PG_FUNCTION_INFO_V1(knn_vector_typmod_cast);
PG_FUNCTION_INFO_V1(knn_vector_dims);
PG_FUNCTION_INFO_V1(knn_vector_norm);

/* ---- validity rules (vector_checks.h) ---- */

void
knn_vector_check_dim(int dim)
{
	if (dim < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("vector must have at least 1 dimension")));
	if (dim > VECTOR_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("vector cannot have more than %d dimensions",
						VECTOR_MAX_DIM)));
}

void
knn_vector_check_typmod(int32 typmod, int dim)
{
	if (typmod != -1 && typmod != dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("expected %d dimensions, not %d", typmod, dim)));
}

void
knn_vector_check_element(float value)
{
	if (isnan(value))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("NaN not allowed in vector")));
	if (isinf(value))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("infinite value not allowed in vector")));
}

/* A zero-filled vector of dim dimensions (checked) in the current context. */
Vector *
knn_vector_new(int dim)
{
	Size		size;
	Vector	   *result;

	knn_vector_check_dim(dim);
	size = VECTOR_SIZE(dim);
	result = (Vector *) palloc0(size);
	SET_VARSIZE(result, size);
	result->dim = (int16) dim;
	result->unused = 0;
	return result;
}

/* ---- text form ---- */

/* The blanks allowed around numbers and brackets (those of array_in). */
static inline bool
is_vector_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static inline const char *
skip_blanks(const char *p)
{
	while (is_vector_blank(*p))
		p++;
	return p;
}

static void report_invalid_syntax(const char *type_name, const char *literal,
								  const char *detail) pg_attribute_noreturn();

static void
report_invalid_syntax(const char *type_name, const char *literal, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
			 errmsg("invalid input syntax for type %s: \"%s\"", type_name, literal),
			 detail ? errdetail("%s", detail) : 0));
}

/*
 * Parses '[x1, x2, ...]', the text form of vector and halfvec, into a
 * palloc'd array of floats; *dim_out gets the count. Each number is read
 * with strtof, like float4in, so that the text '0.1' gives the same float
 * as '0.1'::real (no rounding through double); check_element then vets it
 * in place (number points at its text, of number_len bytes), so a bad
 * value is reported before any later syntax error, as pgvector does.
 */
float *
knn_parse_vector_text(const char *literal, const char *type_name, int max_dim,
					  KnnTextElementCheck check_element, int *dim_out)
{
	const char *p = skip_blanks(literal);
	int			capacity = 16;
	int			dim = 0;
	float	   *values;

	if (*p != '[')
		report_invalid_syntax(type_name, literal, "Vector contents must start with \"[\".");
	p = skip_blanks(p + 1);
	if (*p == ']')
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("%s must have at least 1 dimension", type_name)));

	values = palloc(sizeof(float) * capacity);
	for (;;)
	{
		char	   *end;
		float		value;

		if (dim == max_dim)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("%s cannot have more than %d dimensions", type_name, max_dim)));

		/* a number: strtof would skip blanks itself, but not stop at '\0' */
		p = skip_blanks(p);
		if (*p == '\0')
			report_invalid_syntax(type_name, literal, NULL);
		errno = 0;
		value = strtof(p, &end);
		if (end == p)
			report_invalid_syntax(type_name, literal, NULL);
		if (errno == ERANGE && isinf(value))
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("\"%s\" is out of range for type %s",
							pnstrdup(p, end - p), type_name)));
		check_element(value, p, (int) (end - p));

		if (dim == capacity)
		{
			capacity = Min(capacity * 2, max_dim);
			values = repalloc(values, sizeof(float) * capacity);
		}
		values[dim++] = value;

		/* then ',' and another number, or the closing ']' */
		p = skip_blanks(end);
		if (*p == ',')
			p++;
		else if (*p == ']')
		{
			p++;
			break;
		}
		else
			report_invalid_syntax(type_name, literal, NULL);
	}

	if (*skip_blanks(p) != '\0')
		report_invalid_syntax(type_name, literal, "Junk after closing right brace.");

	*dim_out = dim;
	return values;
}

static void
check_vector_text_element(float value, const char *number, int number_len)
{
	knn_vector_check_element(value);
}

Datum
knn_vector_in(PG_FUNCTION_ARGS)
{
	const char *literal = PG_GETARG_CSTRING(0);
	int32		typmod = PG_GETARG_INT32(2);
	int			dim;
	float	   *values = knn_parse_vector_text(literal, "vector", VECTOR_MAX_DIM,
												 check_vector_text_element, &dim);
	Vector	   *result;

	knn_vector_check_typmod(typmod, dim);
	result = knn_vector_new(dim);
	memcpy(result->x, values, sizeof(float) * dim);
	pfree(values);
	PG_RETURN_VECTOR_P(result);
}

Datum
knn_vector_out(PG_FUNCTION_ARGS)
{
	Vector	   *vector = PG_GETARG_VECTOR_P(0);
	int			dim = vector->dim;
	char	   *text;
	char	   *p;

	/*
	 * Each element takes at most FLOAT_SHORTEST_DECIMAL_LEN - 1 characters
	 * plus one for the ',' before it (or the '[' before the first one); then
	 * ']' and the terminating '\0'.
	 */
	text = palloc((Size) dim * FLOAT_SHORTEST_DECIMAL_LEN + 2);
	p = text;
	*p++ = '[';
	for (int i = 0; i < dim; i++)
	{
		if (i > 0)
			*p++ = ',';
		p += float_to_shortest_decimal_bufn(vector->x[i], p);
	}
	*p++ = ']';
	*p = '\0';

	PG_FREE_IF_COPY(vector, 0);
	PG_RETURN_CSTRING(text);
}

/* ---- typmod: vector(n) ---- */

int32
knn_dimensions_typmod(ArrayType *modifiers, const char *type_name, int max_dim)
{
	int32	   *values;
	int			n;

	values = ArrayGetIntegerTypmods(modifiers, &n);
	if (n != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid type modifier")));
	if (values[0] < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dimensions for type %s must be at least 1", type_name)));
	if (values[0] > max_dim)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dimensions for type %s cannot exceed %d", type_name, max_dim)));
	return values[0];
}

Datum
knn_vector_typmod_in(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(knn_dimensions_typmod(PG_GETARG_ARRAYTYPE_P(0), "vector", VECTOR_MAX_DIM));
}

Datum
knn_vector_typmod_out(PG_FUNCTION_ARGS)
{
	int32		typmod = PG_GETARG_INT32(0);

	PG_RETURN_CSTRING(typmod >= 0 ? psprintf("(%d)", typmod) : pstrdup(""));
}

/*
 * The cast vector -> vector(n) that PostgreSQL applies when a value meets a
 * typmod (assignment to a vector(n) column, an explicit ::vector(n)). The
 * third argument (explicit cast or not) makes no difference: a vector is
 * never truncated or padded.
 */
Datum
knn_vector_typmod_cast(PG_FUNCTION_ARGS)
{
	Vector	   *vector = PG_GETARG_VECTOR_P(0);
	int32		typmod = PG_GETARG_INT32(1);

	knn_vector_check_typmod(typmod, vector->dim);
	PG_RETURN_VECTOR_P(vector);
}

/* ---- binary form (COPY BINARY, binary protocol) ---- */

Datum
knn_vector_recv(PG_FUNCTION_ARGS)
{
	StringInfo	message = (StringInfo) PG_GETARG_POINTER(0);
	int32		typmod = PG_GETARG_INT32(2);
	int			dim;
	int			unused;
	Vector	   *result;

	dim = (int) pq_getmsgint(message, sizeof(int16));
	unused = (int) pq_getmsgint(message, sizeof(int16));

	knn_vector_check_dim(dim);
	knn_vector_check_typmod(typmod, dim);
	if (unused != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("expected unused to be 0, not %d", unused)));

	result = knn_vector_new(dim);
	for (int i = 0; i < dim; i++)
	{
		result->x[i] = pq_getmsgfloat4(message);
		knn_vector_check_element(result->x[i]);
	}
	PG_RETURN_VECTOR_P(result);
}

Datum
knn_vector_send(PG_FUNCTION_ARGS)
{
	Vector	   *vector = PG_GETARG_VECTOR_P(0);
	StringInfoData message;

	pq_begintypsend(&message);
	pq_sendint16(&message, (uint16) vector->dim);
	pq_sendint16(&message, (uint16) vector->unused);
	for (int i = 0; i < vector->dim; i++)
		pq_sendfloat4(&message, vector->x[i]);
	PG_RETURN_BYTEA_P(pq_endtypsend(&message));
}

/* ---- functions of one value ---- */

Datum
knn_vector_dims(PG_FUNCTION_ARGS)
{
	Vector	   *vector = PG_GETARG_VECTOR_P(0);

	PG_RETURN_INT32(vector->dim);
}

/* Euclidean norm in double precision, as pgvector's (vector_math.h). */
Datum
knn_vector_norm(PG_FUNCTION_ARGS)
{
	Vector	   *vector = PG_GETARG_VECTOR_P(0);

	PG_RETURN_FLOAT8(knn_vector_norm_of(vector));
}
