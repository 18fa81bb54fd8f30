/*
 * knn_join_params.h -- bind parameters of knn_join's query texts: the
 * params argument (text[]) gives $1, $2, ... as text; each is converted to
 * the type the text's use of it implies, as PREPARE without types would
 * infer it (variable parameters); a $n whose use implies no type (or that
 * one text does not use) is text.
 */
#ifndef KNN_JOIN_PARAMS_H
#define KNN_JOIN_PARAMS_H

#include "postgres.h"

#include "executor/spi.h"
#include "nodes/parsenodes.h"
#include "utils/array.h"

typedef struct KnnJoinParams
{
	int			n;				/* values given */
	char	  **texts;			/* NULL for a NULL element */
} KnnJoinParams;

/*
 * Analyses and rewrites one parsed statement, inferring the types of its
 * $n into *types (InvalidOid or unknown for a $n without one).
 */
extern List *knn_join_params_analyze(RawStmt *raw, const char *sql, Oid **types,
									 int *n_types);

/* The values of a params array (one dimension, or empty); ERROR otherwise. */
extern void knn_join_params_read(ArrayType *array, KnnJoinParams *params);

/*
 * Prepares one query text (inside SPI) with the types its use of $1 .. $n
 * implies, and converts the given values to them into *values / *nulls
 * (SPI_execute_plan's form). ERROR (42P02) when the text uses a $n past the
 * values given; a value that does not convert fails as its type's input.
 */
extern SPIPlanPtr knn_join_params_prepare(const char *sql, const char *arg,
										  const KnnJoinParams *params,
										  Datum **values, char **nulls);

#endif							/* KNN_JOIN_PARAMS_H */
