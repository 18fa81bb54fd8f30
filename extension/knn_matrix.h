/*
 * knn_matrix.h -- a growing matrix of rows of one element type (float32,
 * float16 or bits: knn_engine.h) with their ids, built row by row for the
 * engine, and put in id order.
 */
#ifndef KNN_MATRIX_H
#define KNN_MATRIX_H

#include "postgres.h"

#include "knn_engine.h"
#include "knn_input.h"

typedef struct KnnMatrix
{
	int64		n;				/* rows so far */
	int64		capacity;
	int32		dim;			/* -1 until the first row */
	KnnElement	element;		/* of every row */
	Size		row_bytes;		/* knn_row_bytes(element, dim), once dim is set */
	char	   *values;			/* n rows of row_bytes (huge allocation) */
	int64	   *ids;
	int64	   *groups;			/* per-row group keys, or NULL (knn_matrix_use_groups) */
	bool		grouped;
	const char *set_name;		/* "query" or "target", for messages */
	MemoryContext context;		/* where the arrays live (the caller's at init) */
	/* values in the GPU service's shared row buffer (knn_matrix.c), or NULL */
	struct KnnMatrixSharedRows *shared;
} KnnMatrix;

/*
 * With the GPU service on (knn_gpu_service_rows_wanted), the rows of an
 * ungrouped matrix go into the engine's shared row buffer
 * (knn_shared_rows_create), which a join sends to the service as it is;
 * freed with the matrix or its memory context.
 */
extern void knn_matrix_init(KnnMatrix *m, const char *set_name, KnnElement element);

/*
 * Appends one non-null value (detoasted here, once) through a reader of the
 * matrix's element type; ERROR for a malformed, empty or non-finite value
 * or a dimension (bit length) mismatch, naming the id.
 */
extern void knn_matrix_append(KnnMatrix *m, int64 id, Datum value,
							  const KnnVectorReader *reader);

/*
 * Makes the matrix keep a group key per row (before the first row); rows
 * are then appended with knn_matrix_append_grouped.
 */
extern void knn_matrix_use_groups(KnnMatrix *m);
extern void knn_matrix_append_grouped(KnnMatrix *m, int64 id, int64 group, Datum value,
									  const KnnVectorReader *reader);

/* The same for a value already checked by reader->view. */
extern void knn_matrix_append_view(KnnMatrix *m, int64 id, const KnnVectorView *view,
								   const KnnVectorReader *reader);

/*
 * For a caller that writes a row's elements itself, checked as the
 * matrix's reader would (finite, the matrix's element type): the next
 * row's room for `dim` elements, or NULL when the matrix holds rows of
 * another dimension (then append through knn_matrix_append_view, which
 * raises the mismatch). knn_matrix_commit_row then counts the row written.
 */
extern void *knn_matrix_reserve_row(KnnMatrix *m, int dim);
extern void knn_matrix_commit_row(KnnMatrix *m, int64 id);

/*
 * For a caller that places rows itself, in any order: an empty matrix
 * becomes n rows of dim elements whose ids and elements the caller then
 * writes, every one (m->ids[i], and row i at m->values + i * row_bytes).
 * One allocation each, none of it touched here: a count the caller was
 * told but has not seen costs address space, not memory.
 */
extern void knn_matrix_reserve_rows(KnnMatrix *m, int dim, int64 n);

/*
 * The same with ids only: n rows of dim elements whose ids the caller
 * writes, and no values (NULL): for rows that go elsewhere as they came
 * (knn_shard_relay.h), of which only the ids are needed here. Such a
 * matrix can be sorted by id, checked for distinct ids and freed.
 */
extern void knn_matrix_reserve_ids(KnnMatrix *m, int dim, int64 n);

/*
 * For a caller that writes rows in blocks (knn_shard_receive_held_rows):
 * room for `n` more rows of `dim` elements (the matrix's dimension, set
 * here when it has none), the ids at m->ids + m->n and the rows at the
 * returned address, counted by knn_matrix_commit_rows once written. The
 * arrays grow by doubling through repalloc_huge (a huge chunk is its own
 * malloc'd block: glibc's realloc remaps it, copying and touching
 * nothing), the shared row buffer by knn_shared_rows_grow (or the rows
 * move to the matrix's own memory, as any growth of it does).
 */
extern char *knn_matrix_reserve_more(KnnMatrix *m, int dim, int64 n);
extern void knn_matrix_commit_rows(KnnMatrix *m, int64 n);

/* An empty matrix gives back its arrays and its dimension (a block that failed fixed it). */
extern void knn_matrix_forget_dim(KnnMatrix *m);

/* Appends every row of `from` (the same element and dimension, neither grouped), in one copy. */
extern void knn_matrix_append_rows(KnnMatrix *m, const KnnMatrix *from);

/*
 * Sorts rows by id (stable), so that row order breaks ties by id. Checks
 * for interrupts as it goes.
 */
extern void knn_matrix_sort_by_id(KnnMatrix *m);

/*
 * Are the ids distinct? Moves no row (a caller may check before the rows
 * go anywhere, and sort later). Checks for interrupts as it goes.
 */
extern bool knn_matrix_ids_distinct(const KnnMatrix *m);
extern void knn_matrix_free(KnnMatrix *m);

/* Do both hold the same rows, bit for bit, in the same order? */
extern bool knn_matrix_same_values(const KnnMatrix *a, const KnnMatrix *b);

/*
 * A problem of k neighbours of the queries' rows among the targets' rows;
 * per group when both matrices keep group keys.
 */
extern void knn_matrix_problem(KnnProblem *problem, const KnnMatrix *queries,
							   const KnnMatrix *targets, int32 k);

/*
 * knn_matrix_problem's problem of a join call: its metric and method, and
 * with exclude_self the rows' ids as the keys a query may not meet.
 */
extern void knn_matrix_join_problem(KnnProblem *problem, const KnnMatrix *queries,
									const KnnMatrix *targets, int32 k, KnnMetric metric,
									KnnMethod method, bool exclude_self);

/*
 * *sub: problem p for its query rows `which` (n of them) only, whose
 * values, keys and groups are gathered into new arrays (row_bytes each
 * row), for running some queries again; knn_problem_free_gathered frees
 * them.
 */
extern void knn_problem_gather_queries(KnnProblem *sub, const KnnProblem *p, Size row_bytes,
									   const int64 *which, int64 n);
extern void knn_problem_free_gathered(KnnProblem *sub);

/*
 * Asks for the cache line at p (a hint: nothing happens where the compiler
 * has no prefetch). Always inlined, as are its callers: GCC drops calls to
 * a function whose only effect is a prefetch.
 */
static pg_attribute_always_inline void
knn_prefetch(const void *p)
{
#if defined(__GNUC__) || defined(__clang__)
	__builtin_prefetch(p);
#endif
}

/*
 * The engine's result lists rows by target row, and returning them reads
 * the target ids (and keys) in that order, all over their arrays: a cache
 * miss for nearly every row of a large join. Called for result slot `at`
 * of `end`, this asks now for the id KNN_PREFETCH_AHEAD slots later, and
 * for the key (target_keys, or NULL) of the slot half as far, whose id has
 * been asked for already.
 */
#define KNN_PREFETCH_AHEAD 16

static pg_attribute_always_inline void
knn_prefetch_target(const int64 *target_ids, const Datum *target_keys, const int64 *neighbors,
					int64 at, int64 end)
{
	if (at + KNN_PREFETCH_AHEAD < end && neighbors[at + KNN_PREFETCH_AHEAD] >= 0)
		knn_prefetch(&target_ids[neighbors[at + KNN_PREFETCH_AHEAD]]);
	if (target_keys != NULL && at + KNN_PREFETCH_AHEAD / 2 < end &&
		neighbors[at + KNN_PREFETCH_AHEAD / 2] >= 0)
		knn_prefetch(&target_keys[target_ids[neighbors[at + KNN_PREFETCH_AHEAD / 2]]]);
}

#endif							/* KNN_MATRIX_H */
