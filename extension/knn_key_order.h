/*
 * knn_key_order.h -- knn_join's keys of any type with a default btree
 * ordering (uuid, text, a named composite...): the values of both sets are
 * put in the type's default btree order under one collation, and each value
 * gets an int64 rank shared by both sets, so that the engine's integer ids
 * keep the order (ties broken by key) and are equal across the sets exactly
 * when the keys are equal (exclude_self).
 */
#ifndef KNN_KEY_ORDER_H
#define KNN_KEY_ORDER_H

#include "postgres.h"

/* The key values of one set, in the order they were read. */
typedef struct KnnKeyColumn
{
	Oid			type;			/* base type of the values */
	Oid			collation;
	int16		typlen;
	bool		typbyval;
	const char *set_name;		/* "queries" or "targets", for messages */
	Datum	   *values;
	int64		n;
	int64		capacity;
	MemoryContext context;		/* where values and their copies live */
	Datum	   *by_rank;		/* after knn_key_columns_rank: value of each rank */
} KnnKeyColumn;

/*
 * Does the type have a default btree ordering (type cache)? ERROR
 * (SQLSTATE 42883) naming set_name when not.
 */
extern void knn_key_check_type(Oid type, const char *set_name);

/* An empty column in the current memory context. */
extern void knn_key_column_init(KnnKeyColumn *column, Oid type, Oid collation,
								const char *set_name);

/* Copies a non-NULL value into the column; returns its row number. */
extern int64 knn_key_column_add(KnnKeyColumn *column, Datum value);

/*
 * Replaces each ids[i] (a row number of its column) with the rank of its
 * value, in the type's default btree order over both columns (targets may
 * be NULL when the queries are the targets too), and fills each column's
 * by_rank. ERROR (SQLSTATE 23505) when a column holds two equal values.
 * Checks for interrupts as it goes.
 */
extern void knn_key_columns_rank(KnnKeyColumn *queries, int64 *query_ids,
								 KnnKeyColumn *targets, int64 *target_ids);

#endif							/* KNN_KEY_ORDER_H */
