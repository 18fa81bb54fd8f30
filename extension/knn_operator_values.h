/*
 * knn_operator_values.h -- results ranked by pgvector's own operator.
 *
 * pgvector's distance functions sum in an order of their compiler's choosing
 * (-fassociative-math), so their values can differ in the last bits from the
 * engine's canonical ones (knn_distance.h), and so can the order of near
 * ties. When the user's operator is pgvector's, a join asks the engine for
 * more candidates than k, takes each candidate's value from the operator
 * itself (fmgr) and ranks by that value, then the target row. A proven bound
 * on how far the two values can be apart says when no target outside the
 * candidates can rank among the k best; a query for which it cannot say so is
 * finished against all its eligible targets (canonical distances, cheap and
 * in C, pick those that may rank; the operator decides).
 */
#ifndef KNN_OPERATOR_VALUES_H
#define KNN_OPERATOR_VALUES_H

#include "postgres.h"

#include "fmgr.h"

#include "knn_engine.h"
#include "knn_matrix.h"
#include "knn_run.h"

typedef struct KnnOperatorValues
{
	FmgrInfo	function;		/* pgvector's distance function */
	Oid			collation;
	KnnMetric	metric;
	/* what the last knn_operator_values_rank call did */
	int64		operator_calls;
	int64		queries_completed;	/* finished against all eligible targets */
} KnnOperatorValues;

/*
 * The type whose distance operator SQL resolves between a query column of
 * query_type and a target column of target_type (a domain counts as its
 * base type): their common base type; pgvector's halfvec beside pgvector's
 * vector (its implicit cast vector -> halfvec makes h <-> v a halfvec
 * distance, as the join's rows are halfvec then); pgvector's vector beside
 * real[] or double precision[] (they meet in SQL as arr::vector, whose
 * rounding to float the join's rows have too); else InvalidOid.
 */
extern Oid	knn_operator_values_type(Oid query_type, Oid target_type);

/*
 * Prepares ov for values of typid joined with metric, in rows of element:
 * true when typid is pgvector's vector (float32 rows) or halfvec (float16
 * rows) and metric one of its float metrics; false when the engine's values
 * already are the operator's (knn_gpu's own types, bit strings, arrays).
 */
extern bool knn_operator_values_init(KnnOperatorValues *ov, Oid typid, KnnMetric metric,
									 KnnElement element);

/*
 * Runs problem (whose query and target rows are those of the matrices
 * queries and targets, with the caller's k, metric, method, keys and groups)
 * so that neighbors / distances (k
 * per query) hold the k best targets by the operator's value, ties by target
 * row, with the operator's values. The engine is asked for more candidates
 * than k; the queries whose candidates do not prove their k best are run
 * again, with four times as many, until they do (at worst every eligible
 * target is a candidate). stats are the first engine run's, with the
 * distance computations of all runs.
 */
extern void knn_operator_values_run(KnnOperatorValues *ov, const KnnProblem *problem,
									const KnnMatrix *queries, const KnnMatrix *targets,
									int64 *neighbors, double *distances, KnnStats *stats);

/*
 * Runs range problem (problem->range, max_distance; problem->k the cap per
 * query, 0 = none) so that sink receives exactly the pairs whose operator
 * value is within the radius, each query's ranked by (value, target row)
 * with those values, queries in order. The engine's canonical values pick
 * candidates with a proven margin (knn_operator_values.c); the operator
 * decides each. With a cap, each query's k best by the operator are ranked
 * from the engine's first candidates by canonical value instead (the
 * operator asked only about those within the candidate radius): a few of
 * each query first where a sample says most have few, else about 2 k.
 */
extern void knn_operator_values_range(KnnOperatorValues *ov, const KnnProblem *problem,
									  const KnnMatrix *queries, const KnnMatrix *targets,
									  KnnPairSink sink, void *sink_arg, KnnStats *stats);

#endif							/* KNN_OPERATOR_VALUES_H */
