/*
 * knn_distance.h -- the one definition of every distance, shared by the SQL
 * operators, the CPU engine and the CUDA engine (host and device), so that
 * all three return bit-identical values for the same pair.
 *
 * Sums run in float, like pgvector's operators, over 8 interleaved lanes
 * (dimension i goes to lane i % 8, each lane summed in index order), folded
 * as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). This fixed order vectorises on
 * the CPU and is followed exactly by one GPU thread; no fused multiply-add
 * may contract it (host code builds with -ffp-contract=off, device code uses
 * the _rn intrinsics). The final step to float8 follows pgvector: sqrt in
 * double for L2, a double quotient for cosine.
 */
#ifndef KNN_DISTANCE_H
#define KNN_DISTANCE_H

#include <math.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#if defined(__CUDACC__)
#define KNN_HD __host__ __device__ __forceinline__
#else
#define KNN_HD static inline
#endif

#define KNN_LANES 8

#if defined(__CUDA_ARCH__)
#define KNN_FADD(a, b) __fadd_rn((a), (b))
#define KNN_FMUL(a, b) __fmul_rn((a), (b))
#else
#define KNN_FADD(a, b) ((a) + (b))
#define KNN_FMUL(a, b) ((a) * (b))
#endif

KNN_HD float
knn_fold_lanes(const float *l)
{
	float		s0 = KNN_FADD(l[0], l[4]);
	float		s1 = KNN_FADD(l[1], l[5]);
	float		s2 = KNN_FADD(l[2], l[6]);
	float		s3 = KNN_FADD(l[3], l[7]);

	return KNN_FADD(KNN_FADD(s0, s2), KNN_FADD(s1, s3));
}

/* sum of (a[i]-b[i])^2 */
KNN_HD float
knn_l2_squared(const float *a, const float *b, int dim)
{
	float		l[KNN_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
	int			i = 0;

	for (; i + KNN_LANES <= dim; i += KNN_LANES)
		for (int j = 0; j < KNN_LANES; j++)
		{
			float		d = a[i + j] - b[i + j];

			l[j] = KNN_FADD(l[j], KNN_FMUL(d, d));
		}
	for (int j = 0; i < dim; i++, j++)
	{
		float		d = a[i] - b[i];

		l[j] = KNN_FADD(l[j], KNN_FMUL(d, d));
	}
	return knn_fold_lanes(l);
}

/* sum of a[i]*b[i] */
KNN_HD float
knn_dot(const float *a, const float *b, int dim)
{
	float		l[KNN_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
	int			i = 0;

	for (; i + KNN_LANES <= dim; i += KNN_LANES)
		for (int j = 0; j < KNN_LANES; j++)
			l[j] = KNN_FADD(l[j], KNN_FMUL(a[i + j], b[i + j]));
	for (int j = 0; i < dim; i++, j++)
		l[j] = KNN_FADD(l[j], KNN_FMUL(a[i], b[i]));
	return knn_fold_lanes(l);
}

/* sum of |a[i]-b[i]| */
KNN_HD float
knn_l1_sum(const float *a, const float *b, int dim)
{
	float		l[KNN_LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
	int			i = 0;

	for (; i + KNN_LANES <= dim; i += KNN_LANES)
		for (int j = 0; j < KNN_LANES; j++)
			l[j] = KNN_FADD(l[j], fabsf(a[i + j] - b[i + j]));
	for (int j = 0; i < dim; i++, j++)
		l[j] = KNN_FADD(l[j], fabsf(a[i] - b[i]));
	return knn_fold_lanes(l);
}

/* The float8 results, exactly as the operators return them. */
KNN_HD double
knn_l2_from_squared(float squared)
{
	return sqrt((double) squared);
}

KNN_HD double
knn_ip_from_dot(float dot)
{
	return -(double) dot;
}

/* norm_a and norm_b are knn_dot(a, a) and knn_dot(b, b). */
KNN_HD double
knn_cosine_from_dot(float dot, float norm_a, float norm_b)
{
	double		similarity = (double) dot / sqrt((double) norm_a * (double) norm_b);

	if (similarity > 1.0)
		similarity = 1.0;
	else if (similarity < -1.0)
		similarity = -1.0;
	return 1.0 - similarity;	/* NaN stays NaN (a zero vector) */
}

/*
 * pgvector's spherical distance (its k-means distance for unit vectors): the
 * angle over pi, the dot product clamped to [-1, 1] so that rounding cannot
 * make acos NaN. Not a join metric.
 */
KNN_HD double
knn_spherical_from_dot(float dot)
{
	double		d = (double) dot;

	if (d > 1.0)
		d = 1.0;
	else if (d < -1.0)
		d = -1.0;
	return acos(d) / M_PI;
}

KNN_HD double
knn_l1_from_sum(float sum)
{
	return (double) sum;
}

/*
 * Ordering of results: smaller distance first, NaN after every number, then
 * smaller target row. Returns true when (da, ia) comes before (db, ib).
 */
KNN_HD bool
knn_result_before(double da, int64_t ia, double db, int64_t ib)
{
	bool		a_nan = da != da;
	bool		b_nan = db != db;

	if (a_nan != b_nan)
		return b_nan;
	if (!a_nan && da != db)
		return da < db;
	return ia < ib;
}

/*
 * A range join's test (KnnProblem::range), as PostgreSQL compares float8:
 * NaN is above every number and equal to itself, so d < NaN holds for
 * every number and d <= NaN for everything. inclusive: <=, else <.
 */
KNN_HD bool
knn_within_radius(double d, double radius, bool inclusive)
{
	bool		d_nan = d != d;
	bool		r_nan = radius != radius;

	if (r_nan)
		return inclusive || !d_nan;
	if (d_nan)
		return false;
	return inclusive ? d <= radius : d < radius;
}

#endif							/* KNN_DISTANCE_H */
