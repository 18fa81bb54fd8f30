/*
 * knn_matrix.c -- the engine's input matrices (knn_matrix.h).
 *
 * The id sort is a stable least-significant-digit radix sort rather than
 * qsort: it takes linear time, and it checks for interrupts between slices
 * of work, so a cancel during the sort of tens of millions of rows is
 * answered within milliseconds.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/memutils.h"

#include "knn_gpu_service.h"
#include "knn_matrix.h"

/* knn_matrix_append_rows copies this much between its looks for a cancel. */
#define KNN_COPY_SLICE_BYTES ((int64) 64 * 1024 * 1024)

/* Elements (or rows of values) between two looks at the interrupt flags. */
#define KNN_INTERRUPT_SLICE 65536
#define KNN_RADIX_BITS 16
#define KNN_RADIX_BUCKETS (1 << KNN_RADIX_BITS)

void
knn_matrix_init(KnnMatrix *m, const char *set_name, KnnElement element)
{
	memset(m, 0, sizeof(*m));
	m->dim = -1;
	m->element = element;
	m->context = CurrentMemoryContext;
	m->set_name = set_name;
}

/*
 * A matrix's rows in the shared row buffer: a segment that the matrix's
 * memory context frees when it goes (an ERROR included), unless
 * knn_matrix_free did first.
 */
typedef struct KnnMatrixSharedRows
{
	MemoryContextCallback callback;
	KnnSharedRows *rows;
	Size		bytes;			/* writable (backed) bytes of the segment */
} KnnMatrixSharedRows;

/*
 * The shared segment grows by this much at a time, not by doubling as the
 * ids do: its pages are allocated as asked (knn_shared_rows_grow), and the
 * buffer keeps address space ahead so that growing seldom moves rows.
 */
#define KNN_SHARED_ROWS_STEP ((Size) 2 << 20)

static Size
shared_rows_bytes(Size needed)
{
	return (needed + KNN_SHARED_ROWS_STEP - 1) / KNN_SHARED_ROWS_STEP * KNN_SHARED_ROWS_STEP;
}

static void
free_shared_rows(void *arg)
{
	KnnMatrixSharedRows *shared = (KnnMatrixSharedRows *) arg;

	knn_shared_rows_free(shared->rows);
	shared->rows = NULL;
}

/* The first rows' storage in the shared row buffer; false: the caller's own. */
static bool
start_shared_rows(KnnMatrix *m, Size value_bytes)
{
	KnnMatrixSharedRows *shared;

	if (m->grouped || !knn_gpu_service_rows_wanted())
		return false;
	shared = MemoryContextAllocZero(m->context, sizeof(KnnMatrixSharedRows));
	shared->bytes = shared_rows_bytes(value_bytes);
	shared->rows = knn_shared_rows_create(shared->bytes);
	if (shared->rows == NULL)
	{
		pfree(shared);
		return false;
	}
	shared->callback.func = free_shared_rows;
	shared->callback.arg = shared;
	MemoryContextRegisterResetCallback(m->context, &shared->callback);
	m->shared = shared;
	m->values = knn_shared_rows_data(shared->rows);
	return true;
}

/*
 * Room for row n in the shared row buffer, or the rows moved to the
 * caller's memory (capacity rows, as the ids).
 */
static void
grow_shared_rows(KnnMatrix *m, int64 rows)
{
	Size		needed = shared_rows_bytes((Size) rows * m->row_bytes);
	char	   *own;

	if (knn_shared_rows_grow(m->shared->rows, needed))
	{
		m->shared->bytes = needed;
		m->values = knn_shared_rows_data(m->shared->rows);
		return;
	}
	own = MemoryContextAllocHuge(m->context, (Size) m->capacity * m->row_bytes);
	memcpy(own, m->values, (Size) m->n * m->row_bytes);
	free_shared_rows(m->shared);
	m->shared = NULL;
	m->values = own;
}

/* Room for `capacity` rows (more than now). Huge allocations: the matrix may well pass 1 GB. */
static void
grow_to(KnnMatrix *m, int64 capacity)
{
	Size		value_bytes = (Size) capacity * m->row_bytes;

	if (m->values == NULL)
	{
		if (!start_shared_rows(m, value_bytes))
			m->values = MemoryContextAllocHuge(m->context, value_bytes);
		m->ids = MemoryContextAllocHuge(m->context, capacity * sizeof(int64));
		if (m->grouped)
			m->groups = MemoryContextAllocHuge(m->context, capacity * sizeof(int64));
	}
	else
	{
		if (m->shared == NULL)
			m->values = repalloc_huge(m->values, value_bytes);
		m->ids = repalloc_huge(m->ids, capacity * sizeof(int64));
		if (m->grouped)
			m->groups = repalloc_huge(m->groups, capacity * sizeof(int64));
	}
	m->capacity = capacity;
}

static void
grow(KnnMatrix *m)
{
	grow_to(m, m->capacity == 0 ? 1024 : m->capacity * 2);
}

void
knn_matrix_append_rows(KnnMatrix *m, const KnnMatrix *from)
{
	Assert(!m->grouped && m->element == from->element);
	if (from->n == 0)
		return;
	if (m->dim < 0)
	{
		m->dim = from->dim;
		m->row_bytes = knn_row_bytes(m->element, m->dim);
	}
	else if (m->dim != from->dim)
		elog(ERROR, "knn_matrix_append_rows: rows of %d dimensions into %s rows of %d",
			 from->dim, m->set_name, m->dim);
	/* room for them all at once, exactly */
	if (m->capacity < m->n + from->n)
		grow_to(m, m->n + from->n);
	if (m->shared != NULL && (Size) (m->n + from->n) * m->row_bytes > m->shared->bytes)
		grow_shared_rows(m, m->n + from->n);
	memcpy(m->ids + m->n, from->ids, (Size) from->n * sizeof(int64));
	/* in slices: a cancel is seen within one slice's copy */
	for (int64 r = 0; r < from->n;)
	{
		int64		rows = Min(from->n - r, Max(1, KNN_COPY_SLICE_BYTES / (int64) m->row_bytes));

		memcpy(m->values + (Size) (m->n + r) * m->row_bytes, from->values + (Size) r * m->row_bytes,
			   (Size) rows * m->row_bytes);
		r += rows;
		CHECK_FOR_INTERRUPTS();
	}
	m->n += from->n;
}

char *
knn_matrix_reserve_more(KnnMatrix *m, int dim, int64 n)
{
	Assert(!m->grouped && n >= 0);
	if (m->dim < 0)
	{
		m->dim = dim;
		m->row_bytes = knn_row_bytes(m->element, m->dim);
	}
	else if (dim != m->dim)
		elog(ERROR, "knn_matrix_reserve_more: rows of %d dimensions into %s rows of %d",
			 dim, m->set_name, m->dim);
	if (n > (int64) (MaxAllocHugeSize / Max(m->row_bytes, sizeof(int64))) - m->n)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s rows of " INT64_FORMAT " x %zu bytes exceed the largest allocation",
						m->set_name, m->n + n, m->row_bytes)));
	if (m->capacity < m->n + n)
	{
		/* doubling: a remap moves the page tables of the rows held, which is not free either */
		int64		most = (int64) (MaxAllocHugeSize / Max(m->row_bytes, sizeof(int64)));

		grow_to(m, Min(most, Max(m->n + n, m->capacity * 2)));
	}
	if (m->shared != NULL && (Size) (m->n + n) * m->row_bytes > m->shared->bytes)
		grow_shared_rows(m, m->n + n);
	return m->values + (Size) m->n * m->row_bytes;
}

void
knn_matrix_commit_rows(KnnMatrix *m, int64 n)
{
	Assert(n >= 0 && m->n + n <= m->capacity);
	m->n += n;
}

void
knn_matrix_forget_dim(KnnMatrix *m)
{
	Assert(m->n == 0);
	knn_matrix_free(m);
	m->dim = -1;
	m->row_bytes = 0;
}

void
knn_matrix_append_view(KnnMatrix *m, int64 id, const KnnVectorView *view,
					   const KnnVectorReader *reader)
{
	Assert(reader->element == m->element);
	if (m->dim < 0)
	{
		m->dim = view->dim;
		m->row_bytes = knn_row_bytes(m->element, m->dim);
	}
	else if (view->dim != m->dim)
	{
		if (m->element == KNN_ELEMENT_BIT)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("different bit lengths: %s id " INT64_FORMAT " has %d bits, expected %d",
							m->set_name, id, view->dim, m->dim)));
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("dimension mismatch: %s id " INT64_FORMAT " has %d dimensions, expected %d",
						m->set_name, id, view->dim, m->dim)));
	}
	if (m->n == m->capacity)
		grow(m);
	if (m->shared != NULL && (Size) (m->n + 1) * m->row_bytes > m->shared->bytes)
		grow_shared_rows(m, m->n + 1);
	if (!reader->copy(view, m->values + m->n * m->row_bytes))
		knn_vector_problem_error(KNN_VALUE_NOT_FINITE, m->set_name, id);
	m->ids[m->n] = id;
	m->n++;
}

void *
knn_matrix_reserve_row(KnnMatrix *m, int dim)
{
	Assert(!m->grouped);
	if (m->dim < 0)
	{
		m->dim = dim;
		m->row_bytes = knn_row_bytes(m->element, m->dim);
	}
	else if (dim != m->dim)
		return NULL;
	if (m->n == m->capacity)
		grow(m);
	if (m->shared != NULL && (Size) (m->n + 1) * m->row_bytes > m->shared->bytes)
		grow_shared_rows(m, m->n + 1);
	return m->values + m->n * m->row_bytes;
}

void
knn_matrix_reserve_rows(KnnMatrix *m, int dim, int64 n)
{
	Size		value_bytes;

	Assert(!m->grouped);
	if (m->n != 0 || m->values != NULL)
		elog(ERROR, "knn_matrix_reserve_rows: the %s matrix is not empty", m->set_name);
	if (n <= 0)
		return;
	m->dim = dim;
	m->row_bytes = knn_row_bytes(m->element, m->dim);
	if ((Size) n > MaxAllocHugeSize / Max(m->row_bytes, sizeof(int64)))
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s rows of " INT64_FORMAT " x %zu bytes exceed the largest allocation",
						m->set_name, n, m->row_bytes)));
	value_bytes = (Size) n * m->row_bytes;
	if (!start_shared_rows(m, value_bytes))
		m->values = MemoryContextAllocHuge(m->context, value_bytes);
	m->ids = MemoryContextAllocHuge(m->context, (Size) n * sizeof(int64));
	m->capacity = n;
	m->n = n;
}

void
knn_matrix_reserve_ids(KnnMatrix *m, int dim, int64 n)
{
	Assert(!m->grouped);
	if (m->n != 0 || m->values != NULL)
		elog(ERROR, "knn_matrix_reserve_ids: the %s matrix is not empty", m->set_name);
	if (n <= 0)
		return;
	m->dim = dim;
	m->row_bytes = knn_row_bytes(m->element, m->dim);
	if ((Size) n > MaxAllocHugeSize / sizeof(int64))
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg(INT64_FORMAT " %s ids exceed the largest allocation", n, m->set_name)));
	m->ids = MemoryContextAllocHuge(m->context, (Size) n * sizeof(int64));
	m->capacity = n;
	m->n = n;
}

void
knn_matrix_commit_row(KnnMatrix *m, int64 id)
{
	Assert(m->n < m->capacity);
	m->ids[m->n] = id;
	m->n++;
}

void
knn_matrix_append(KnnMatrix *m, int64 id, Datum value, const KnnVectorReader *reader)
{
	struct varlena *raw = (struct varlena *) DatumGetPointer(value);
	struct varlena *detoasted = PG_DETOAST_DATUM(value);
	KnnVectorView view;
	KnnValueProblem problem = reader->view(detoasted, &view);

	if (problem != KNN_VALUE_OK)
		knn_vector_problem_error(problem, m->set_name, id);
	knn_matrix_append_view(m, id, &view, reader);
	if (detoasted != raw)
		pfree(detoasted);
}

void
knn_matrix_use_groups(KnnMatrix *m)
{
	Assert(m->n == 0 && m->values == NULL);
	m->grouped = true;
}

void
knn_matrix_append_grouped(KnnMatrix *m, int64 id, int64 group, Datum value,
						  const KnnVectorReader *reader)
{
	Assert(m->grouped);
	knn_matrix_append(m, id, value, reader);
	m->groups[m->n - 1] = group;
}

typedef struct IdRow
{
	uint64		key;			/* the id with its sign bit flipped: unsigned order */
	int64		row;
} IdRow;

/* One stable counting pass over the digit at shift; false if all share it. */
static bool
radix_pass(const IdRow *from, IdRow *to, int64 n, int shift, int64 *count)
{
	memset(count, 0, sizeof(int64) * KNN_RADIX_BUCKETS);
	for (int64 i = 0; i < n; i++)
	{
		count[(from[i].key >> shift) & (KNN_RADIX_BUCKETS - 1)]++;
		if ((i & (KNN_INTERRUPT_SLICE - 1)) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	if (count[(from[0].key >> shift) & (KNN_RADIX_BUCKETS - 1)] == n)
		return false;
	for (int64 b = 0, start = 0; b < KNN_RADIX_BUCKETS; b++)
	{
		int64		c = count[b];

		count[b] = start;
		start += c;
	}
	for (int64 i = 0; i < n; i++)
	{
		to[count[(from[i].key >> shift) & (KNN_RADIX_BUCKETS - 1)]++] = from[i];
		if ((i & (KNN_INTERRUPT_SLICE - 1)) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	return true;
}

/* The rows in stable id order. */
static IdRow *
sorted_rows(const KnnMatrix *m)
{
	IdRow	   *a = MemoryContextAllocHuge(CurrentMemoryContext, m->n * sizeof(IdRow));
	IdRow	   *b = MemoryContextAllocHuge(CurrentMemoryContext, m->n * sizeof(IdRow));
	int64	   *count = palloc(sizeof(int64) * KNN_RADIX_BUCKETS);

	for (int64 i = 0; i < m->n; i++)
	{
		a[i].key = (uint64) m->ids[i] ^ (UINT64CONST(1) << 63);
		a[i].row = i;
		if ((i & (KNN_INTERRUPT_SLICE - 1)) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	for (int shift = 0; shift < 64; shift += KNN_RADIX_BITS)
	{
		if (radix_pass(a, b, m->n, shift, count))
		{
			IdRow	   *swap = a;

			a = b;
			b = swap;
		}
	}
	pfree(b);
	pfree(count);
	return a;
}

/*
 * Puts row i where order[i] says it comes from, in place (rows in the
 * shared row buffer stay there): cycle by cycle, one row held aside.
 */
static void
permute_rows_in_place(KnnMatrix *m, const IdRow *order, int64 rows_per_slice)
{
	bool	   *done = MemoryContextAllocHuge(CurrentMemoryContext, Max(1, (Size) m->n));
	char	   *held = palloc(m->row_bytes);
	int64		moved = 0;

	memset(done, 0, Max(1, (Size) m->n));
	for (int64 start = 0; start < m->n; start++)
	{
		int64		j = start;

		/* Rows in place cost no copy; a nearly sorted matrix is mostly them. */
		if (start % rows_per_slice == 0)
			CHECK_FOR_INTERRUPTS();
		if (done[start] || order[start].row == start)
			continue;
		memcpy(held, m->values + start * m->row_bytes, m->row_bytes);
		for (;;)
		{
			int64		from = order[j].row;

			done[j] = true;
			if (from == start)
			{
				memcpy(m->values + j * m->row_bytes, held, m->row_bytes);
				break;
			}
			memcpy(m->values + j * m->row_bytes, m->values + from * m->row_bytes, m->row_bytes);
			j = from;
			if (++moved % rows_per_slice == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
	pfree(held);
	pfree(done);
}

void
knn_matrix_sort_by_id(KnnMatrix *m)
{
	IdRow	   *order;
	int64	   *groups;
	bool		sorted = true;
	int64		rows_per_slice = Max(1, KNN_INTERRUPT_SLICE / Max(1, (int64) m->row_bytes / 4));

	for (int64 i = 1; i < m->n && sorted; i++)
		sorted = m->ids[i - 1] <= m->ids[i];
	if (sorted)
		return;

	/*
	 * Rows move in place (the shared row buffer stays where it is, and a
	 * large matrix is not copied); the id and group arrays are small.
	 */
	order = sorted_rows(m);
	/* (a matrix of ids only, knn_matrix_reserve_ids, has no rows to move) */
	if (m->values != NULL || m->shared != NULL)
		permute_rows_in_place(m, order, rows_per_slice);
	groups = m->grouped ? MemoryContextAllocHuge(m->context, (Size) m->capacity * sizeof(int64)) : NULL;
	for (int64 i = 0; i < m->n; i++)
	{
		m->ids[i] = (int64) (order[i].key ^ (UINT64CONST(1) << 63));
		if (groups)
			groups[i] = m->groups[order[i].row];
		if (i % rows_per_slice == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(order);
	if (groups)
	{
		pfree(m->groups);
		m->groups = groups;
	}
}

bool
knn_matrix_ids_distinct(const KnnMatrix *m)
{
	IdRow	   *order;
	bool		sorted = true;
	bool		distinct = true;

	for (int64 i = 1; i < m->n && sorted; i++)
		sorted = m->ids[i - 1] < m->ids[i];
	if (sorted)
		return true;
	/* the ids in order (only ids and row numbers move): neighbours compared */
	order = sorted_rows(m);
	for (int64 i = 1; i < m->n && distinct; i++)
	{
		distinct = order[i - 1].key != order[i].key;
		if ((i & (KNN_INTERRUPT_SLICE - 1)) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(order);
	return distinct;
}

void
knn_matrix_free(KnnMatrix *m)
{
	if (m->shared != NULL)
	{
		free_shared_rows(m->shared);
		m->shared = NULL;
	}
	else if (m->values)
		pfree(m->values);
	if (m->ids)
		pfree(m->ids);
	if (m->groups)
		pfree(m->groups);
	m->values = NULL;
	m->ids = NULL;
	m->groups = NULL;
	m->n = m->capacity = 0;
}

void
knn_matrix_problem(KnnProblem *problem, const KnnMatrix *queries, const KnnMatrix *targets,
				   int32 k)
{
	memset(problem, 0, sizeof(*problem));
	problem->element = queries->element;
	problem->queries = queries->values;
	problem->n_queries = queries->n;
	problem->targets = targets->values;
	problem->n_targets = targets->n;
	problem->dim = queries->dim;
	problem->k = k;
	if (queries->grouped && targets->grouped)
	{
		problem->query_groups = queries->groups;
		problem->target_groups = targets->groups;
	}
}

void
knn_matrix_join_problem(KnnProblem *problem, const KnnMatrix *queries, const KnnMatrix *targets,
						int32 k, KnnMetric metric, KnnMethod method, bool exclude_self)
{
	knn_matrix_problem(problem, queries, targets, k);
	problem->metric = metric;
	problem->method = method;
	if (exclude_self)
	{
		problem->query_keys = queries->ids;
		problem->target_keys = targets->ids;
	}
}

bool
knn_matrix_same_values(const KnnMatrix *a, const KnnMatrix *b)
{
	int64		rows_per_slice = Max(1, KNN_INTERRUPT_SLICE / Max(1, (int64) a->row_bytes / 4));

	if (a->n != b->n || a->dim != b->dim || a->element != b->element)
		return false;
	for (int64 first = 0; first < a->n; first += rows_per_slice)
	{
		int64		rows = Min(rows_per_slice, a->n - first);

		CHECK_FOR_INTERRUPTS();
		if (memcmp(a->values + first * a->row_bytes, b->values + first * b->row_bytes,
				   (Size) rows * a->row_bytes) != 0)
			return false;
	}
	return true;
}

void
knn_problem_gather_queries(KnnProblem *sub, const KnnProblem *p, Size row_bytes,
						   const int64 *which, int64 n)
{
	char	   *values = MemoryContextAllocHuge(CurrentMemoryContext, Max(1, (Size) n * row_bytes));
	int64	   *keys = p->query_keys != NULL ? palloc(sizeof(int64) * Max(1, n)) : NULL;
	int64	   *groups = p->query_groups != NULL ? palloc(sizeof(int64) * Max(1, n)) : NULL;

	for (int64 i = 0; i < n; i++)
	{
		memcpy(values + (Size) i * row_bytes,
			   (const char *) p->queries + (Size) which[i] * row_bytes, row_bytes);
		if (keys != NULL)
			keys[i] = p->query_keys[which[i]];
		if (groups != NULL)
			groups[i] = p->query_groups[which[i]];
		if ((i & 4095) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	*sub = *p;
	sub->queries = values;
	sub->n_queries = n;
	sub->query_keys = keys;
	sub->query_groups = groups;
}

void
knn_problem_free_gathered(KnnProblem *sub)
{
	pfree((void *) sub->queries);
	if (sub->query_keys != NULL)
		pfree((void *) sub->query_keys);
	if (sub->query_groups != NULL)
		pfree((void *) sub->query_groups);
}
