/*
 * knn_scan_ties.c -- the engine's rows for "FETCH FIRST n ROWS WITH TIES"
 * in the KNN Join's subquery.
 *
 * WITH TIES returns the first n rows and every following row that equals
 * the n-th on all ORDER BY keys. The distance is the first key, and rows of
 * equal distance come from the engine in target row order, which is the
 * order of the other keys (the inner scan is sorted by them): so the rows
 * the executor may need are the first n and every further row whose
 * distance equals the n-th's; it then compares the other keys
 * (knn_scan_exec.c). How many rows tie is known only from the results, so
 * the engine is asked for n + 1 rows, and the queries whose last row still
 * ties with the n-th are run again with twice as many, until the last row
 * differs or every eligible target came back. The engine's order is exact
 * (distance, then target row), so a larger run's first rows are the smaller
 * one's.
 */
#include "postgres.h"

#include <math.h>

#include "miscadmin.h"

#include "knn_scan.h"

/* Equal as float8's "=" has them (NaN equals NaN), so tied on the distance. */
static bool
same_distance(double a, double b)
{
	return a == b || (isnan(a) && isnan(b));
}

void
knn_scan_run_with_ties(const KnnProblem *problem, const KnnMatrix *queries, int64 wanted,
					   KnnTopKRun run, void *run_arg, KnnPairSink sink, void *sink_arg,
					   KnnStats *stats)
{
	int64	   *open = palloc(sizeof(int64) * Max(1, problem->n_queries));
	int64		n_open = problem->n_queries;
	int64		k = Min(wanted + 1, problem->n_targets);
	bool		first = true;

	Assert(wanted >= 1);
	for (int64 i = 0; i < n_open; i++)
		open[i] = i;
	while (n_open > 0 && k > 0)
	{
		KnnProblem	sub = *problem;
		KnnMatrix	sub_queries = *queries;
		KnnStats	run_stats;
		int64	   *neighbors;
		double	   *distances;
		int64	   *query_rows;
		int64		still_open = 0;

		if (!first)
		{
			/* only the open queries, as a matrix of their own rows */
			knn_problem_gather_queries(&sub, problem, queries->row_bytes, open, n_open);
			sub_queries.values = (char *) sub.queries;
			sub_queries.n = n_open;
			sub_queries.ids = NULL;
			sub_queries.groups = (int64 *) sub.query_groups;
		}
		sub.k = (int32) k;
		neighbors = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * n_open * k);
		distances = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(double) * n_open * k);
		query_rows = palloc(sizeof(int64) * k);
		run(run_arg, &sub, &sub_queries, neighbors, distances, &run_stats);
		if (first)
			*stats = run_stats;
		else
			stats->distance_computations += run_stats.distance_computations;

		for (int64 i = 0; i < n_open; i++)
		{
			const int64 *rows = neighbors + i * k;
			const double *d = distances + i * k;
			int64		n = 0;
			int64		end;

			if ((i & 1023) == 0)
				CHECK_FOR_INTERRUPTS();
			while (n < k && rows[n] >= 0)
				n++;
			/* the last row ties with the wanted-th: more may follow */
			if (n > wanted && n == k && k < problem->n_targets &&
				same_distance(d[wanted - 1], d[k - 1]))
			{
				open[still_open++] = open[i];
				continue;
			}
			end = Min(n, wanted);
			while (end < n && same_distance(d[end], d[wanted - 1]))
				end++;
			for (int64 r = 0; r < end; r++)
				query_rows[r] = open[i];
			sink(sink_arg, query_rows, rows, d, end);
		}
		pfree(neighbors);
		pfree(distances);
		pfree(query_rows);
		if (!first)
			knn_problem_free_gathered(&sub);
		n_open = still_open;
		if (n_open > 0 && k >= PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("KNN Join supports at most %d tied rows per outer row", PG_INT32_MAX)));
		k = Min(k * 2, Min(problem->n_targets, (int64) PG_INT32_MAX));
		first = false;
	}
	pfree(open);
}
