/*
 * knn_operator_values.c -- results ranked by pgvector's own operator
 * (knn_operator_values.h).
 *
 * ---- How far pgvector's value P can be from the canonical value C ----
 * Both compute the same float expression in some order of additions (and
 * maybe with fused multiply-adds). With u = 2^-24 and g = gamma_{d+4} =
 * (d + 4) u / (1 - (d + 4) u), any such evaluation of a sum of d terms, each
 * from at most two roundings, is within g of the exact sum S of the
 * absolute terms, plus tiny = (2d + 16) 2^-149 for gradual underflow:
 *  * L2 (squares): |X - S| <= g S + tiny for X = P^2 and X = C^2, so
 *    P^2 >= C^2 (1 - 2g) - 2 tiny; we use C^2 (1 - 3g) - 3 tiny (also
 *    covering the double square of C).
 *  * L1 (sums of |a - b|): P >= C (1 - 3g) - 3 tiny, likewise.
 *  * inner product: |dot_X - dot| <= g sum |q_i t_i| + tiny <= g |q| |t| +
 *    tiny, so P >= C - 2 (g |q| T + tiny), T the largest target norm.
 *  * cosine: dot and both squared norms are within g relative (of |q||t|,
 *    |q|^2, |t|^2) when no square underflows, so each similarity is within
 *    2g (+ 2^-50 for the double quotient) of the exact one and clamping
 *    keeps that: P >= C - (6g + 2^-40). Where some row's squared norm is
 *    positive but below 2^-100 underflow may dominate: no bound (-inf).
 * Each lower bound L(C) grows with C. A target that is not among a query's
 * candidates has C >= C_last, the last candidate's canonical value, so its
 * operator value is at least L(C_last): when that exceeds the k-th best
 * operator value among the candidates, no such target can rank (ties by row
 * need not be looked at: the inequality is strict). NaN canonical values
 * (zero vectors under cosine) give no bound.
 *
 * ---- Overflow ----
 * The model above holds while no sum overflows. Near FLT_MAX one order of
 * additions may overflow where the other does not: a canonical value of
 * +inf may stand for a finite operator value, so a canonical value that is
 * not finite gives no bound. L2 and L1 add non-negative terms, so a pair
 * whose canonical sum overflowed has an exact sum S >= FLT_MAX (1 - g) and
 * P >= S (1 - g): above the bound of any finite C_last, which keeps the
 * argument for the targets that are not candidates. The inner product and
 * cosine add terms of either sign: where |q| |t| (or a squared norm) may
 * reach FLT_MAX a partial sum may overflow, so no bound there.
 */
#include "postgres.h"

#include <float.h>
#include <math.h>

#include "miscadmin.h"
#include "utils/float.h"
#include "utils/lsyscache.h"

#include "half_float.h"
#include "knn_catalog.h"
#include "knn_distance.h"
#include "knn_operator_values.h"
#include "knn_run.h"
#include "knn_settings.h"
#include "knn_stats.h"

/* Candidates beyond k in the first engine run: max(kExtraMin, k). */
#define KNN_EXTRA_MIN 16
/* The fewest candidates a capped join's first engine run within a radius asks for. */
#define KNN_RADIUS_FIRST_CANDIDATES 32
/* Pairs handed to a range join's sink at a time. */
#define KNN_RANGE_SLICE 4096
/* Slots (queries x k) of one slice of a capped range join. */
#define KNN_CAPPED_SLICE_SLOTS (1 << 20)
/* Queries of a capped range join sampled to choose how it runs (at most). */
#define KNN_CAPPED_SAMPLE 16
/* Squared norms below this (and above 0) make the cosine bound unsafe. */
#define KNN_COSINE_TINY_NORM2 0x1p-100

/* Whether typid (no domain) is pgvector's type of that kind. */
static bool
is_pgvector(Oid typid, KnnVectorKind kind)
{
	return knn_vector_kind(typid) == kind &&
		OidIsValid(knn_pgvector_distance_function(typid, KNN_METRIC_L2));
}

static bool
is_float_array(Oid typid)
{
	KnnVectorKind kind = knn_vector_kind(typid);

	return kind == KNN_VECTOR_FLOAT4_ARRAY || kind == KNN_VECTOR_FLOAT8_ARRAY;
}

Oid
knn_operator_values_type(Oid query_type, Oid target_type)
{
	Oid			q = getBaseType(query_type);
	Oid			t = getBaseType(target_type);

	if (q == t)
		return t;
	/* h <-> v: pgvector's implicit cast vector -> halfvec */
	if (is_pgvector(q, KNN_VECTOR_HALFVEC) && is_pgvector(t, KNN_VECTOR_TYPE))
		return q;
	if (is_pgvector(t, KNN_VECTOR_HALFVEC) && is_pgvector(q, KNN_VECTOR_TYPE))
		return t;
	/* an array meets a vector in SQL only as arr::vector */
	if (is_pgvector(q, KNN_VECTOR_TYPE) && is_float_array(t))
		return q;
	if (is_pgvector(t, KNN_VECTOR_TYPE) && is_float_array(q))
		return t;
	return InvalidOid;
}

bool
knn_operator_values_init(KnnOperatorValues *ov, Oid typid, KnnMetric metric,
						 KnnElement element)
{
	KnnVectorKind kind = knn_vector_kind(typid);
	Oid			function;

	memset(ov, 0, sizeof(*ov));
	if (metric != KNN_METRIC_L2 && metric != KNN_METRIC_COSINE && metric != KNN_METRIC_IP &&
		metric != KNN_METRIC_L1)
		return false;
	if (!((kind == KNN_VECTOR_TYPE && element == KNN_ELEMENT_FLOAT32) ||
		  (kind == KNN_VECTOR_HALFVEC && element == KNN_ELEMENT_FLOAT16)))
		return false;
	function = knn_pgvector_distance_function(typid, metric);
	if (!OidIsValid(function))
		return false;
	fmgr_info(function, &ov->function);
	ov->collation = InvalidOid;
	ov->metric = metric;
	return true;
}

/* What the bound needs beyond the metric (see the top of this file). */
typedef struct ValueBound
{
	KnnMetric	metric;
	double		g;
	double		tiny;
	double		max_target_norm;	/* inner product */
	bool		unsafe;			/* cosine: a target norm tiny, or its square may overflow */
} ValueBound;

/* Whether a float sum of terms whose absolute values add up to s may overflow. */
static bool
may_overflow(const ValueBound *b, double s)
{
	return !(s * (1 + 4 * b->g) < FLT_MAX);
}

/* A row as floats: the matrix's own for float32 rows, else widened. */
static const float *
row_floats(const KnnMatrix *m, int64 row, float *buffer)
{
	const char *p = m->values + (Size) row * m->row_bytes;

	if (m->element == KNN_ELEMENT_FLOAT32)
		return (const float *) p;
	for (int i = 0; i < m->dim; i++)
		buffer[i] = knn_half_to_float(((const uint16 *) p)[i]);
	return buffer;
}

static double
squared_norm(const float *x, int dim)
{
	double		s = 0;

	for (int i = 0; i < dim; i++)
		s += (double) x[i] * x[i];
	return s;
}

static void
bound_init(ValueBound *b, KnnMetric metric, const KnnMatrix *targets)
{
	const double d = targets->dim;
	float	   *buffer = palloc(sizeof(float) * Max(1, targets->dim));

	b->metric = metric;
	b->g = (d + 4) * 0x1p-24 / (1 - (d + 4) * 0x1p-24);
	b->tiny = (2 * d + 16) * 0x1p-149;
	b->max_target_norm = 0;
	b->unsafe = false;
	if (metric == KNN_METRIC_IP || metric == KNN_METRIC_COSINE)
	{
		for (int64 t = 0; t < targets->n; t++)
		{
			double		n2 = squared_norm(row_floats(targets, t, buffer), targets->dim);

			if ((t & 4095) == 0)
				CHECK_FOR_INTERRUPTS();
			b->max_target_norm = Max(b->max_target_norm, sqrt(n2));
			if (n2 > 0 && n2 < KNN_COSINE_TINY_NORM2)
				b->unsafe = true;
			/* a target's own squared norm (cosine) may overflow */
			if (metric == KNN_METRIC_COSINE && may_overflow(b, n2))
				b->unsafe = true;
		}
		/* the double sums' own rounding */
		b->max_target_norm *= 1 + 0x1p-30;
	}
	pfree(buffer);
}

/*
 * The least operator value of a pair whose canonical value is c (query norm
 * qn for the inner product, squared norm qn2 for cosine); -inf when unknown.
 */
static double
lowest_operator_value(const ValueBound *b, double c, double qn, double qn2)
{
	double		low;

	if (!isfinite(c))
		return -INFINITY;
	switch (b->metric)
	{
		case KNN_METRIC_L2:
			low = c * c * (1 - 3 * b->g) - 3 * b->tiny;
			return low > 0 ? sqrt(low) * (1 - 0x1p-40) : 0;
		case KNN_METRIC_L1:
			return c * (1 - 3 * b->g) - 3 * b->tiny;
		case KNN_METRIC_IP:
			if (may_overflow(b, qn * b->max_target_norm))
				return -INFINITY;
			return c - 2 * (b->g * qn * b->max_target_norm + b->tiny) * (1 + 0x1p-20);
		case KNN_METRIC_COSINE:
			if (b->unsafe || (qn2 > 0 && qn2 < KNN_COSINE_TINY_NORM2) || may_overflow(b, qn2) ||
				may_overflow(b, qn * b->max_target_norm))
				return -INFINITY;
			return c - (6 * b->g + 0x1p-40);
		default:
			return -INFINITY;
	}
}

/* pgvector's layout of vector and halfvec: varlena header, dim, unused, elements. */
typedef struct OperatorArgument
{
	char	   *bytes;
} OperatorArgument;

static void
argument_init(OperatorArgument *a, const KnnMatrix *m)
{
	Size		size = 8 + m->row_bytes;

	a->bytes = palloc0(size);
	SET_VARSIZE(a->bytes, size);
	*(int16 *) (a->bytes + 4) = (int16) m->dim;
	*(int16 *) (a->bytes + 6) = 0;
}

static Datum
argument_row(OperatorArgument *a, const KnnMatrix *m, int64 row)
{
	memcpy(a->bytes + 8, m->values + (Size) row * m->row_bytes, m->row_bytes);
	return PointerGetDatum(a->bytes);
}

typedef struct RankedTarget
{
	double		value;
	int64		row;
} RankedTarget;

static int
ranked_compare(const void *pa, const void *pb)
{
	const RankedTarget *a = pa;
	const RankedTarget *b = pb;

	if (knn_result_before(a->value, a->row, b->value, b->row))
		return -1;
	if (knn_result_before(b->value, b->row, a->value, a->row))
		return 1;
	return 0;
}

/*
 * Whether a candidate's canonical value c is within the candidate radius of
 * a capped range join (knn_operator_values_range below; NaN: there is none,
 * every candidate is), as the uncapped one selects its candidates (C <= r').
 * A NaN c is not: where r' is finite, no norm is tiny and no sum may
 * overflow, so c is NaN only for a zero vector under cosine, whose operator
 * value is NaN too, within no finite radius. (Counting those would leave
 * each zero query unproven, its candidates all NaN, until every target had
 * been ranked: queries x targets slots.)
 */
static bool
within_candidate_radius(double c, double candidate_radius)
{
	return isnan(candidate_radius) || c <= candidate_radius;
}

/*
 * Ranks the candidates of one query by the operator into out_rows /
 * out_values (k slots); returns true when they are proven to be its k best.
 * With a candidate radius (not NaN; a capped range join's, see below) only
 * the candidates within it are ranked: the k best within the radius are
 * then proven when a candidate beyond it was handed over.
 */
static bool
rank_query(KnnOperatorValues *ov, const ValueBound *bound, OperatorArgument *qarg,
		   OperatorArgument *targ, const KnnMatrix *queries, int64 q, const KnnMatrix *targets,
		   int32 candidates, const int64 *rows, const double *canonical,
		   double candidate_radius, int32 k, RankedTarget *scratch, int64 *out_rows,
		   double *out_values, float *qbuffer)
{
	Datum		qdatum = argument_row(qarg, queries, q);
	int32		real = 0;
	double		kth;
	double		qn2 = 0;

	/* (candidates come by canonical value: those after one beyond are beyond) */
	for (int32 c = 0; c < candidates && rows[c] >= 0 &&
		 within_candidate_radius(canonical[c], candidate_radius); c++)
	{
		Datum		v = FunctionCall2Coll(&ov->function, ov->collation, qdatum,
										  argument_row(targ, targets, rows[c]));

		scratch[real].value = DatumGetFloat8(v);
		scratch[real].row = rows[c];
		real++;
		/* counted across queries: one query may have every target as a candidate */
		if ((++ov->operator_calls & 4095) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	qsort(scratch, real, sizeof(RankedTarget), ranked_compare);
	for (int32 r = 0; r < k; r++)
	{
		out_rows[r] = r < real ? scratch[r].row : -1;
		out_values[r] = r < real ? scratch[r].value : get_float8_nan();
	}
	/*
	 * Fewer than asked for: every eligible target (within the candidate
	 * radius) was a candidate.
	 */
	if (real < candidates)
		return true;
	/* fewer candidates than k (a first run within a radius): more are needed */
	if (real < k)
		return false;
	kth = scratch[k - 1].value;
	if (bound->metric == KNN_METRIC_IP || bound->metric == KNN_METRIC_COSINE)
		qn2 = squared_norm(row_floats(queries, q, qbuffer), queries->dim);
	return lowest_operator_value(bound, canonical[candidates - 1], sqrt(qn2) * (1 + 0x1p-30),
								 qn2) > kth;
}

/* How many candidates per query the first engine run ranks. */
static int64
first_candidates(int32 k, const KnnMatrix *targets)
{
	return Min(targets->n, (int64) k + Max(KNN_EXTRA_MIN, k));
}

/*
 * knn_operator_values_run from a first engine run of `candidates` a query
 * (fewer than first_candidates only with a candidate radius), ranking only
 * the candidates within candidate_radius when it is not NaN. Adds to ov's
 * counts.
 */
static void
rank_by_operator(KnnOperatorValues *ov, const KnnProblem *problem, const KnnMatrix *queries,
				 const KnnMatrix *targets, double candidate_radius, int64 candidates,
				 int64 *neighbors, double *distances, KnnStats *stats)
{
	const int32 k = problem->k;
	ValueBound	bound;
	OperatorArgument qarg;
	OperatorArgument targ;
	int64	   *open = palloc(sizeof(int64) * Max(1, queries->n));	/* unproven query rows */
	int64		n_open = queries->n;
	const int64 ranked = first_candidates(k, targets);
	float	   *qbuffer = palloc(sizeof(float) * Max(1, queries->dim));
	bool		first = true;

	bound_init(&bound, ov->metric, targets);
	argument_init(&qarg, queries);
	argument_init(&targ, targets);
	for (int64 i = 0; i < queries->n; i++)
		open[i] = i;

	while (n_open > 0)
	{
		/*
		 * Those run again go as many at a time as knn_gpu.max_result_memory
		 * holds their candidates: a query among duplicates is proven only
		 * once every target is a candidate, and all such queries at once
		 * would take queries x targets slots.
		 */
		const int64 per_run = first ? n_open :
			Min(n_open, knn_result_rows_per_run((int32) candidates));
		RankedTarget *scratch = palloc(sizeof(RankedTarget) * candidates);
		int64		still_open = 0;
		const bool complete = candidates >= targets->n;

		for (int64 from = 0; from < n_open; from += per_run)
		{
			const int64 m = Min(per_run, n_open - from);
			KnnProblem	run = *problem;
			KnnStats	run_stats;
			int64	   *rows;
			double	   *canonical;

			if (!first)
				knn_problem_gather_queries(&run, problem, queries->row_bytes, open + from, m);
			run.k = (int32) candidates;
			rows = MemoryContextAllocHuge(CurrentMemoryContext, (Size) m * candidates * sizeof(int64));
			canonical = MemoryContextAllocHuge(CurrentMemoryContext, (Size) m * candidates * sizeof(double));
			knn_run_problem(&run, rows, canonical, &run_stats);
			if (first)
				*stats = run_stats;
			else
				stats->distance_computations += run_stats.distance_computations;

			/* (still_open <= from + i: the open rows not yet read stay in place) */
			for (int64 i = 0; i < m; i++)
			{
				const int64 q = open[from + i];

				if ((i & 255) == 0)
					CHECK_FOR_INTERRUPTS();
				if (!rank_query(ov, &bound, &qarg, &targ, queries, q, targets, (int32) candidates,
								rows + i * candidates, canonical + i * candidates,
								candidate_radius, k, scratch, neighbors + q * k,
								distances + q * k, qbuffer) &&
					!complete)
					open[still_open++] = q;
				else if (!first)
					ov->queries_completed++;
			}
			pfree(rows);
			pfree(canonical);
			if (!first)
				knn_problem_free_gathered(&run);
		}
		pfree(scratch);
		n_open = still_open;
		/* four times as many, the first ranking's number on the way */
		candidates = candidates < ranked ? Min(ranked, candidates * 4) :
			Min(targets->n, candidates * 4);
		first = false;
	}
	pfree(open);
	pfree(qbuffer);
	pfree(qarg.bytes);
	pfree(targ.bytes);
}

void
knn_operator_values_run(KnnOperatorValues *ov, const KnnProblem *problem,
						const KnnMatrix *queries, const KnnMatrix *targets,
						int64 *neighbors, double *distances, KnnStats *stats)
{
	ov->operator_calls = 0;
	ov->queries_completed = 0;
	rank_by_operator(ov, problem, queries, targets, get_float8_nan(),
					 first_candidates(problem->k, targets), neighbors, distances, stats);
	elog(DEBUG1, "knn_gpu: ranked by pgvector's operator: %lld operator calls, %lld queries run again with more candidates",
		 (long long) ov->operator_calls, (long long) ov->queries_completed);
}

/*
 * ---- Range joins by the operator's values ----
 * A pair belongs to the result when its operator value P is within the
 * radius r. The engine selects pairs by the canonical value C, so it is
 * asked for every pair with C <= r' (the candidates), r' chosen so that
 * L(r') > r: a pair with C > r' has P >= L(C) >= L(r') > r (L grows with C,
 * as computed too: each of its operations rounds monotonically), so no pair
 * within the radius is missed; each candidate is then decided on P itself,
 * so none is extra. For the inner product L depends on the query's norm
 * (the largest is used: the widest margin); cosine with a tiny norm, and a
 * radius that is not finite, have no such r': every pair is a candidate.
 * With a cap of k pairs per query the first k by P within the radius are
 * the first k by P of all (those within it come first), so each query's k
 * best by the operator are ranked (rank_query) and filtered: the operator
 * is asked only about the engine's candidates with C <= r' (the others
 * are outside the radius), and a query with a candidate beyond r' has all
 * its pairs within the radius among those (capped_range).
 */

/*
 * The canonical radius r' of the candidates (see above), NaN when every
 * pair must be one.
 */
static double
candidate_radius(const ValueBound *b, const KnnMatrix *queries, double radius)
{
	float	   *buffer = palloc(sizeof(float) * Max(1, queries->dim));
	double		max_query_norm = 0;
	double		r;
	double		step;

	if (!isfinite(radius) || b->unsafe)
		return get_float8_nan();
	if (b->metric == KNN_METRIC_IP || b->metric == KNN_METRIC_COSINE)
	{
		for (int64 q = 0; q < queries->n; q++)
		{
			double		n2 = squared_norm(row_floats(queries, q, buffer), queries->dim);

			if ((q & 4095) == 0)
				CHECK_FOR_INTERRUPTS();
			if (b->metric == KNN_METRIC_COSINE && n2 > 0 && n2 < KNN_COSINE_TINY_NORM2)
				return get_float8_nan();
			max_query_norm = Max(max_query_norm, sqrt(n2) * (1 + 0x1p-30));
		}
	}
	pfree(buffer);
	/* L2 and L1 values are never negative (and L2's L grows only from 0) */
	r = (b->metric == KNN_METRIC_L2 || b->metric == KNN_METRIC_L1) ? Max(radius, 0) : radius;
	/* a query's squared norm that may overflow (cosine): no bound */
	if (b->metric == KNN_METRIC_COSINE && may_overflow(b, max_query_norm * max_query_norm))
		return get_float8_nan();
	step = Max(fabs(r) * 0x1p-30, 0x1p-1000);
	for (int i = 0; i < 2200 && isfinite(r); i++)
	{
		/* qn2 = 1: a query's tiny norm was looked at above */
		if (lowest_operator_value(b, r, max_query_norm, 1.0) > radius)
		{
			/*
			 * Pairs whose canonical sum overflowed (+inf) may be within the
			 * radius where r' is that large (see Overflow above): all pairs.
			 */
			if ((b->metric == KNN_METRIC_L1 && may_overflow(b, r)) ||
				(b->metric == KNN_METRIC_L2 && may_overflow(b, r * r)))
				return get_float8_nan();
			return r;
		}
		r += step;
		step *= 2;
	}
	return get_float8_nan();
}

/* Where the candidates of a range join go: one query's at a time. */
typedef struct RangeByOperator
{
	KnnOperatorValues *ov;
	const KnnMatrix *queries;
	const KnnMatrix *targets;
	OperatorArgument qarg;
	OperatorArgument targ;
	double		radius;
	bool		inclusive;
	int64		cap;			/* pairs per query, 0 = all */
	KnnPairSink sink;
	void	   *sink_arg;
	int64		query;			/* the buffered pairs' query, -1 = none yet */
	RankedTarget *pairs;		/* those within the radius, by P */
	int64		n_pairs;
	int64		capacity;
	int64	   *query_rows;		/* scratch for the sink */
	int64	   *target_rows;
	double	   *values;
} RangeByOperator;

/* Hands the buffered query's pairs on, ranked by (P, target row), capped. */
static void
flush_query(RangeByOperator *r)
{
	int64		n = r->cap > 0 ? Min(r->n_pairs, r->cap) : r->n_pairs;

	if (r->n_pairs == 0)
		return;
	qsort(r->pairs, r->n_pairs, sizeof(RankedTarget), ranked_compare);
	for (int64 first = 0; first < n; first += KNN_RANGE_SLICE)
	{
		int64		m = Min(KNN_RANGE_SLICE, n - first);

		for (int64 i = 0; i < m; i++)
		{
			r->query_rows[i] = r->query;
			r->target_rows[i] = r->pairs[first + i].row;
			r->values[i] = r->pairs[first + i].value;
		}
		r->sink(r->sink_arg, r->query_rows, r->target_rows, r->values, m);
	}
	r->n_pairs = 0;
}

/* KnnPairSink of the candidates: each one's operator value decides. */
static void
take_candidates(void *arg, const int64 *query_rows, const int64 *target_rows,
				const double *distances, int64 n)
{
	RangeByOperator *r = (RangeByOperator *) arg;

	for (int64 i = 0; i < n; i++)
	{
		int64		q = query_rows[i];
		double		value;

		if (q != r->query)
		{
			/* the engine hands a query's pairs over together, queries ascending */
			if (q < r->query || q >= r->queries->n)
				elog(ERROR, "knn_gpu: the engine returned a query row out of order");
			flush_query(r);
			r->query = q;
			argument_row(&r->qarg, r->queries, q);
		}
		if (target_rows[i] < 0 || target_rows[i] >= r->targets->n)
			elog(ERROR, "knn_gpu: the engine returned a target row out of range");
		value = DatumGetFloat8(FunctionCall2Coll(&r->ov->function, r->ov->collation,
												 PointerGetDatum(r->qarg.bytes),
												 argument_row(&r->targ, r->targets,
															  target_rows[i])));
		r->ov->operator_calls++;
		if ((r->ov->operator_calls & 4095) == 0)
			CHECK_FOR_INTERRUPTS();
		if (!knn_within_radius(value, r->radius, r->inclusive))
			continue;
		if (r->n_pairs == r->capacity)
		{
			r->capacity *= 2;
			r->pairs = repalloc_huge(r->pairs, sizeof(RankedTarget) * r->capacity);
		}
		r->pairs[r->n_pairs].value = value;
		r->pairs[r->n_pairs].row = target_rows[i];
		r->n_pairs++;
	}
}

/*
 * How many candidates of each query a capped range join's first engine run
 * asks for, where fewer than a ranking's (ranked) suffice: those within the
 * candidate radius of a sample of queries spread over all are counted (the
 * engine ranks the sample's first candidates, a small part of what ranking
 * every query costs; its statistics into sample_stats, *sampled set), and
 * the first run asks for more than the most of them (32 times a power of 4),
 * so that most queries have all theirs at once. 0 where that is over half
 * of ranked, or without a candidate radius or a sample (fewer than 4 times
 * its queries): every query's k best are ranked.
 */
static int64
first_run_candidates(const KnnProblem *problem, const KnnMatrix *queries,
					 const KnnMatrix *targets, double candidate_radius, int64 ranked,
					 KnnStats *sample_stats, bool *sampled)
{
	const int64 n = Min(KNN_CAPPED_SAMPLE, Max(1, KNN_CAPPED_SLICE_SLOTS / ranked));
	KnnProblem	sample;
	int64	   *which;
	int64	   *rows;
	double	   *canonical;
	int64		most = 0;
	int64		few = KNN_RADIUS_FIRST_CANDIDATES;

	if (isnan(candidate_radius) || queries->n < 4 * n || ranked < 2 * few)
		return 0;
	which = palloc(sizeof(int64) * n);
	for (int64 i = 0; i < n; i++)
		which[i] = i * queries->n / n;
	knn_problem_gather_queries(&sample, problem, queries->row_bytes, which, n);
	sample.range = KNN_RANGE_NONE;
	sample.max_distance = 0;
	sample.k = (int32) ranked;
	/* a few queries: clustering the targets would cost more than it saves */
	sample.method = KNN_METHOD_BRUTE;
	rows = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * n * ranked);
	canonical = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(double) * n * ranked);
	knn_run_problem(&sample, rows, canonical, sample_stats);
	*sampled = true;
	for (int64 i = 0; i < n; i++)
	{
		const int64 *r = rows + i * ranked;
		const double *c = canonical + i * ranked;
		int64		within = 0;

		/* candidates in (canonical value, row) order */
		while (within < ranked && r[within] >= 0 && within_candidate_radius(c[within], candidate_radius))
			within++;
		most = Max(most, within);
	}
	knn_problem_free_gathered(&sample);
	pfree(which);
	pfree(rows);
	pfree(canonical);
	while (few <= most)
		few *= 4;
	return 2 * few <= ranked ? few : 0;
}

/* A view of the queries first .. first + n - 1 of problem (rows, keys, groups). */
static void
query_view(KnnProblem *sub, KnnMatrix *sub_queries, const KnnProblem *problem,
		   const KnnMatrix *queries, int64 first, int64 n)
{
	*sub = *problem;
	*sub_queries = *queries;
	sub_queries->n = n;
	sub_queries->values += (Size) first * queries->row_bytes;
	sub_queries->ids += first;
	if (sub_queries->groups != NULL)
		sub_queries->groups += first;
	sub->queries = (const char *) problem->queries + (Size) first * queries->row_bytes;
	sub->n_queries = n;
	if (sub->query_keys != NULL)
		sub->query_keys += first;
	if (sub->query_groups != NULL)
		sub->query_groups += first;
}

/* How many of n ranked slots, from the first, hold pairs within the radius. */
static int32
ranked_within(const int64 *rows, const double *values, int32 n, double radius, bool inclusive)
{
	int32		within = 0;

	while (within < n && rows[within] >= 0 && knn_within_radius(values[within], radius, inclusive))
		within++;
	return within;
}

/* Hands query's first n ranked pairs to the sink (query_rows: scratch of n). */
static void
hand_back(KnnPairSink sink, void *sink_arg, int64 query, const int64 *rows,
		  const double *values, int32 n, int64 *query_rows)
{
	/* (the sink only stores the rows: queries x k of them may take long) */
	CHECK_FOR_INTERRUPTS();
	if (n == 0)
		return;
	for (int32 i = 0; i < n; i++)
		query_rows[i] = query;
	sink(sink_arg, query_rows, rows, values, n);
}

/*
 * A capped range join ranked in slices: each query's k best by the operator
 * (rank_by_operator), those within the radius. The k best of all queries at
 * once would take queries x k slots (several times over, in the engine and
 * here) whatever the radius: slices of the queries keep that bounded.
 */
static void
capped_in_slices(KnnOperatorValues *ov, const KnnProblem *problem, const KnnMatrix *queries,
				 const KnnMatrix *targets, int32 k, double candidate_radius, KnnPairSink sink,
				 void *sink_arg, KnnStats *stats)
{
	const bool	inclusive = problem->range == KNN_RANGE_AT_MOST;
	const int64 per_slice = Min(queries->n, Max(1, KNN_CAPPED_SLICE_SLOTS / k));
	int64	   *rows = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * per_slice * k);
	double	   *values = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(double) * per_slice * k);
	int64	   *query_rows = palloc(sizeof(int64) * k);

	for (int64 first = 0; first < queries->n; first += per_slice)
	{
		KnnProblem	top;
		KnnMatrix	slice;
		KnnStats	slice_stats;

		query_view(&top, &slice, problem, queries, first, Min(per_slice, queries->n - first));
		top.range = KNN_RANGE_NONE;
		top.max_distance = 0;
		top.k = k;
		rank_by_operator(ov, &top, &slice, targets, candidate_radius,
						 first_candidates(k, targets), rows, values, &slice_stats);
		knn_stats_add(stats, &slice_stats, first == 0);
		for (int64 q = 0; q < slice.n; q++)
			hand_back(sink, sink_arg, first + q, rows + q * k, values + q * k,
					  ranked_within(rows + q * k, values + q * k, k, problem->max_distance,
									inclusive),
					  query_rows);
	}
	pfree(rows);
	pfree(values);
	pfree(query_rows);
}

/*
 * A capped range join whose queries have few pairs within the (finite)
 * candidate radius: a first engine run asks for `few` candidates of each
 * query (fewer than k), in windows of many queries (their slots are few).
 * A query whose candidates end beyond the candidate radius, or before the
 * number asked for, has all its pairs within the radius among them; the
 * others (open) are ranked with more (rank_by_operator), in slices of k
 * slots a query, and every query's pairs are handed back in order. Returns
 * how many were open.
 */
static int64
capped_few_first(KnnOperatorValues *ov, const KnnProblem *problem, const KnnMatrix *queries,
				 const KnnMatrix *targets, int32 k, double candidate_radius, int64 few,
				 KnnPairSink sink, void *sink_arg, KnnStats *stats)
{
	const bool	inclusive = problem->range == KNN_RANGE_AT_MOST;
	const int64 ranked = first_candidates(k, targets);
	const int64 per_window = Min(queries->n, Max(1, KNN_CAPPED_SLICE_SLOTS / few));
	const int64 per_slice = Min(per_window, Max(1, KNN_CAPPED_SLICE_SLOTS / k));
	int64	   *rows = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * per_window * few);
	double	   *canonical = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(double) * per_window * few);
	int64	   *few_rows = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * per_window * few);
	double	   *few_values = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(double) * per_window * few);
	int32	   *counts = palloc(sizeof(int32) * per_window);	/* -1: open */
	int64	   *open = palloc(sizeof(int64) * per_window);
	int64	   *k_rows = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(int64) * per_slice * k);
	double	   *k_values = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(double) * per_slice * k);
	int64	   *query_rows = palloc(sizeof(int64) * k);
	RankedTarget *scratch = palloc(sizeof(RankedTarget) * few);
	float	   *qbuffer = palloc(sizeof(float) * Max(1, queries->dim));
	OperatorArgument qarg;
	OperatorArgument targ;
	ValueBound	bound;
	int64		opened = 0;

	bound_init(&bound, ov->metric, targets);
	argument_init(&qarg, queries);
	argument_init(&targ, targets);
	for (int64 first = 0; first < queries->n; first += per_window)
	{
		KnnProblem	window;
		KnnMatrix	window_queries;
		KnnStats	run_stats;
		int64		n_open = 0;
		int64		next = 0;	/* the window's next query to hand back */

		query_view(&window, &window_queries, problem, queries, first,
				   Min(per_window, queries->n - first));
		window.range = KNN_RANGE_NONE;
		window.max_distance = 0;
		window.k = (int32) few;
		knn_run_problem(&window, rows, canonical, &run_stats);
		knn_stats_add(stats, &run_stats, first == 0);
		for (int64 q = 0; q < window_queries.n; q++)
		{
			const int64 last = q * few + few - 1;

			if ((q & 255) == 0)
				CHECK_FOR_INTERRUPTS();
			if (rows[last] >= 0 && within_candidate_radius(canonical[last], candidate_radius))
			{
				counts[q] = -1;
				open[n_open++] = q;
				opened++;
				continue;
			}
			(void) rank_query(ov, &bound, &qarg, &targ, &window_queries, q, targets,
							  (int32) few, rows + q * few, canonical + q * few,
							  candidate_radius, (int32) few, scratch, few_rows + q * few,
							  few_values + q * few, qbuffer);
			counts[q] = Min(k, ranked_within(few_rows + q * few, few_values + q * few,
											 (int32) few, problem->max_distance, inclusive));
		}

		/* the open queries a slice at a time, the window handed back up to each */
		for (int64 o = 0; o <= n_open; o += per_slice)
		{
			const int64 m = Min(per_slice, n_open - o);
			const int64 up_to = o + m < n_open ? open[o + m - 1] + 1 : window_queries.n;

			if (m > 0)
			{
				KnnProblem	gathered;
				KnnMatrix	gathered_queries = window_queries;

				knn_problem_gather_queries(&gathered, &window, queries->row_bytes, open + o, m);
				gathered.k = k;
				gathered_queries.values = (char *) gathered.queries;
				gathered_queries.n = m;
				gathered_queries.ids = NULL;
				gathered_queries.groups = NULL;
				rank_by_operator(ov, &gathered, &gathered_queries, targets, candidate_radius,
								 Min(ranked, 4 * few), k_rows, k_values, &run_stats);
				stats->distance_computations += run_stats.distance_computations;
				knn_problem_free_gathered(&gathered);
			}
			for (int64 j = o; next < up_to; next++)
			{
				if (counts[next] >= 0)
					hand_back(sink, sink_arg, first + next, few_rows + next * few,
							  few_values + next * few, counts[next], query_rows);
				else
				{
					hand_back(sink, sink_arg, first + next, k_rows + (j - o) * k,
							  k_values + (j - o) * k,
							  ranked_within(k_rows + (j - o) * k, k_values + (j - o) * k, k,
											problem->max_distance, inclusive),
							  query_rows);
					j++;
				}
			}
		}
	}
	pfree(rows);
	pfree(canonical);
	pfree(few_rows);
	pfree(few_values);
	pfree(counts);
	pfree(open);
	pfree(k_rows);
	pfree(k_values);
	pfree(query_rows);
	pfree(scratch);
	pfree(qbuffer);
	pfree(qarg.bytes);
	pfree(targ.bytes);
	return opened;
}

/*
 * A capped range join: the first k pairs by the operator within the radius
 * (see the range joins above). Where a sample says that few candidates of
 * each query are within the candidate radius the engine is asked for that
 * many first (capped_few_first); otherwise each query's k best are ranked
 * (capped_in_slices). Both ask the operator only about the candidates
 * within the candidate radius.
 */
static void
capped_range(KnnOperatorValues *ov, const KnnProblem *problem, const KnnMatrix *queries,
			 const KnnMatrix *targets, KnnPairSink sink, void *sink_arg, KnnStats *stats)
{
	const int32 k = (int32) Min((int64) problem->k, targets->n);
	ValueBound	bound;
	double		radius;
	KnnStats	sample_stats;
	bool		sampled = false;
	int64		few;
	int64		opened = 0;

	bound_init(&bound, ov->metric, targets);
	radius = candidate_radius(&bound, queries, problem->max_distance);
	few = first_run_candidates(problem, queries, targets, radius, first_candidates(k, targets),
							   &sample_stats, &sampled);
	if (few > 0)
		opened = capped_few_first(ov, problem, queries, targets, k, radius, few, sink, sink_arg,
								  stats);
	else
		capped_in_slices(ov, problem, queries, targets, k, radius, sink, sink_arg, stats);
	if (sampled)
		knn_stats_add(stats, &sample_stats, false);
	if (few > 0)
		elog(DEBUG1, "knn_gpu: capped radius by pgvector's operator: %lld candidates of each query first, candidates within %g, %lld operator calls, %lld queries ranked with more",
			 (long long) few, radius, (long long) ov->operator_calls, (long long) opened);
	else
		elog(DEBUG1, "knn_gpu: capped radius by pgvector's operator: each query's k best ranked, candidates within %g, %lld operator calls, %lld queries run again with more candidates",
			 radius, (long long) ov->operator_calls, (long long) ov->queries_completed);
}

void
knn_operator_values_range(KnnOperatorValues *ov, const KnnProblem *problem,
						  const KnnMatrix *queries, const KnnMatrix *targets,
						  KnnPairSink sink, void *sink_arg, KnnStats *stats)
{
	KnnProblem	candidates = *problem;
	ValueBound	bound;
	RangeByOperator r;
	double		radius;

	Assert(problem->range != KNN_RANGE_NONE);
	ov->operator_calls = 0;
	ov->queries_completed = 0;
	if (targets->n == 0 || queries->n == 0)
	{
		memset(stats, 0, sizeof(*stats));
		return;
	}
	if (problem->k > 0)
	{
		capped_range(ov, problem, queries, targets, sink, sink_arg, stats);
		return;
	}
	bound_init(&bound, ov->metric, targets);
	radius = candidate_radius(&bound, queries, problem->max_distance);
	candidates.range = KNN_RANGE_AT_MOST;
	candidates.max_distance = radius;
	candidates.k = 0;

	memset(&r, 0, sizeof(r));
	r.ov = ov;
	r.queries = queries;
	r.targets = targets;
	argument_init(&r.qarg, queries);
	argument_init(&r.targ, targets);
	r.radius = problem->max_distance;
	r.inclusive = problem->range == KNN_RANGE_AT_MOST;
	r.sink = sink;
	r.sink_arg = sink_arg;
	r.query = -1;
	r.capacity = 1024;
	r.pairs = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(RankedTarget) * r.capacity);
	r.query_rows = palloc(sizeof(int64) * KNN_RANGE_SLICE);
	r.target_rows = palloc(sizeof(int64) * KNN_RANGE_SLICE);
	r.values = palloc(sizeof(double) * KNN_RANGE_SLICE);
	knn_run_range_problem(&candidates, take_candidates, &r, stats);
	flush_query(&r);
	elog(DEBUG1, "knn_gpu: radius by pgvector's operator: candidates within %g, %lld operator calls",
		 radius, (long long) ov->operator_calls);
	pfree(r.pairs);
	pfree(r.query_rows);
	pfree(r.target_rows);
	pfree(r.values);
	pfree(r.qarg.bytes);
	pfree(r.targ.bytes);
}
