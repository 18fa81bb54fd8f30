/*
 * knn_shard_receive.c -- query rows shipped to a shard in blocks, held in
 * this backend's memory for its join (knn_shard_receive.h).
 *
 * Why not a temporary table: the binary COPY path writes every query row
 * into a heap (and its WAL-free buffers), then the join reads it back
 * through SPI; here each row goes straight from the message into the
 * matrix the join uses, and the receiving overlaps the coordinator's
 * encoding of the next block. What a caller can do with it is what
 * knn_join lets it do: fill its own backend's memory with query rows
 * (checked like any other: the type's receive function, then knn_input's
 * reader) and join them with a targets text it runs with its own rights.
 *
 * The send forms of vector and halfvec are decoded here rather than through
 * the receive function (decode_send_form): that function's StringInfo copy,
 * palloc'd value and call per element were most of a shard's shipping time
 * (about 330 MB/s). Only where the type's receive function is still its
 * extension's own C function (knn_vector_known_receive_kind: catalog
 * identity, as knn_catalog.c knows types), so that the decoding here is
 * what that function would do; anything else goes through the function.
 */
#include "postgres.h"

#include <math.h>

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/ilist.h"
#include "lib/stringinfo.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/varbit.h"

#include "halfvec.h"
#include "knn_shard_receive.h"
#include "knn_stats.h"
#include "vector.h"

/* A row's fixed part: int32 8, int64 id, int32 vector length. */
#define ROW_HEADER_BYTES 16
#define ROWS_PER_INTERRUPT_CHECK 1024

/*
 * What one role holds in this backend for its coordinator's calls: a
 * received set, or targets read ahead. Each role has its own, found by its
 * calls alone: another role's calls (after SET ROLE, inside a SECURITY
 * DEFINER function) neither join nor read it (its rows, joined with a
 * targets text of that role's choosing, would give their distances to any
 * vector, that is, the rows themselves), nor add to, replace or drop it (a
 * set dropped between two blocks, then begun again by the next, would
 * leave its role's join the later blocks' queries only: wrong rows, not an
 * error). The first member of ReceivedSet and HeldTargets.
 */
typedef struct RoleHeld
{
	dlist_node	node;			/* in received_sets or held_target_reads */
	Oid			role;			/* the role that made it: only its calls find it */
	MemoryContext context;		/* holds all of it; under TopTransactionContext */
	int			level;			/* deepest (sub)transaction that added rows */
} RoleHeld;

typedef struct ReceivedSet
{
	RoleHeld	hold;			/* first: whose, its memory, its level */
	int64		set;
	Oid			vector_type;
	const KnnVectorReader *reader;	/* the type's own element */
	FmgrInfo	receive;
	Oid			receive_ioparam;
	/* KNN_VECTOR_TYPE / _HALFVEC: the send form is decoded here (decode_send_form) */
	KnnVectorKind decoded_kind;
	char	   *decoded_row;	/* room for one row of the largest dimension */
	KnnMatrix	matrix;
	int64		blocks;			/* received, and the time spent reading them (DEBUG1) */
	double		seconds;
} ReceivedSet;

/*
 * The targets of a set's join, read before its queries arrive
 * (knn_shard_prefetch_targets), with the text they were read by: the join
 * of that set and text takes them instead of reading it again. Same life
 * as the received set: the transaction, or a subtransaction that read them.
 */
typedef struct HeldTargets
{
	RoleHeld	hold;			/* first: whose (the role that read them), their memory, their level */
	int64		set;
	char	   *targets_sql;
	Oid			vector_type;	/* of the text's vector column */
	KnnMatrix	matrix;
	/*
	 * Rows of the other shards relayed after them (knn_shard_receive_held_rows):
	 * the matrix's last `relayed` rows, not targets; and the blocks and the
	 * time they took (DEBUG1).
	 */
	int64		relayed;
	int64		relay_blocks;
	double		relay_seconds;
	double		relay_slowest;	/* the slowest block's (one that grew the matrix: no copy, no page touched) */
	uint64		generation;		/* which begin made it (knn_held_targets_unchanged) */
} HeldTargets;

/* Each role's one received set and one read of targets, at most (few roles: a list). */
static dlist_head received_sets = DLIST_STATIC_INIT(received_sets);
static dlist_head held_target_reads = DLIST_STATIC_INIT(held_target_reads);
static uint64 held_generation = 0;
/* rows are being read into the held targets (knn_held_targets_filling): they must stay */
static bool held_filling = false;

/* This role's entry of `list`, or NULL. */
static RoleHeld *
role_held(dlist_head *list)
{
	dlist_iter	iter;

	dlist_foreach(iter, list)
	{
		RoleHeld   *h = dlist_container(RoleHeld, node, iter.cur);

		if (h->role == GetUserId())
			return h;
	}
	return NULL;
}

/* `h`, made in `context` at this (sub)transaction level, held in `list` as this role's. */
static void
role_held_add(dlist_head *list, RoleHeld *h, MemoryContext context)
{
	h->role = GetUserId();
	h->context = context;
	h->level = GetCurrentTransactionNestLevel();
	dlist_push_tail(list, &h->node);
}

/* No longer held: taken by a join, whose memory its rows now are ... */
static void
role_held_forget(RoleHeld *h)
{
	dlist_delete(&h->node);
}

/* ... or dropped, its memory freed. */
static void
role_held_drop(RoleHeld *h)
{
	dlist_delete(&h->node);
	MemoryContextDelete(h->context);
}

/* This role's received set, or NULL. */
static ReceivedSet *
own_received_set(void)
{
	return (ReceivedSet *) role_held(&received_sets);
}

/* Set `set`, received by this role, or NULL. */
static ReceivedSet *
received_set(int64 set)
{
	ReceivedSet *s = own_received_set();

	return s != NULL && s->set == set ? s : NULL;
}

/* The targets this role holds (of whatever set, kept or still being read), or NULL. */
static HeldTargets *
own_held_targets(void)
{
	return (HeldTargets *) role_held(&held_target_reads);
}

/* A targets text that, while it is read, would drop or replace the matrix it is read into: ERROR. */
static void
refuse_while_filling(void)
{
	if (held_filling)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("held targets cannot be dropped or read again while targets are read into them")));
}

void
knn_held_targets_filling(bool filling)
{
	held_filling = filling;
}

/* Everything of `list` dropped (every role's: the transaction is prepared). */
static void
drop_all(dlist_head *list)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, list)
		role_held_drop(dlist_container(RoleHeld, node, iter.cur));
}

/* The transaction's end deletes TopTransactionContext, and the sets with it. */
static void
received_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			dlist_init(&received_sets);
			dlist_init(&held_target_reads);
			held_filling = false;
			break;
		case XACT_EVENT_PRE_PREPARE:
			drop_all(&received_sets);
			drop_all(&held_target_reads);
			break;
		default:
			break;
	}
}

/*
 * A subtransaction that added rows and aborts takes the set with it (a
 * coordinator rolled back to its savepoint there); one that commits hands
 * them to its parent. Every role's: the (sub)transaction is the session's.
 */
static void
subxact_end(dlist_head *list, SubXactEvent event, int level)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, list)
	{
		RoleHeld   *h = dlist_container(RoleHeld, node, iter.cur);

		if (h->level < level)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			role_held_drop(h);
		else if (event == SUBXACT_EVENT_COMMIT_SUB)
			h->level = level - 1;
	}
}

static void
received_subxact_callback(SubXactEvent event, SubTransactionId sub, SubTransactionId parent,
						  void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	subxact_end(&received_sets, event, level);
	subxact_end(&held_target_reads, event, level);
}

static void
register_callbacks(void)
{
	static bool registered = false;

	if (registered)
		return;
	RegisterXactCallback(received_xact_callback, NULL);
	RegisterSubXactCallback(received_subxact_callback, NULL);
	registered = true;
}

void
knn_shard_check_type_exists(Oid type, const char *function)
{
	if (!SearchSysCacheExists1(TYPEOID, ObjectIdGetDatum(type)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("%s: type with OID %u does not exist", function, type)));
}

/* The vector types a set may hold: base types of the kinds knn_join ships. */
static const KnnVectorReader *
received_type_reader(Oid type)
{
	KnnVectorKind kind = knn_vector_kind(type);

	if (getBaseType(type) != type ||
		(kind != KNN_VECTOR_TYPE && kind != KNN_VECTOR_HALFVEC && kind != KNN_VECTOR_BIT))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("knn_shard_receive_queries receives vector, halfvec or bit values, not %s",
						format_type_be(type))));
	return knn_vector_reader(kind);
}

static ReceivedSet *
start_set(int64 set, Oid type)
{
	const KnnVectorReader *reader;
	Oid			receive;
	Oid			receive_ioparam;
	MemoryContext context;
	MemoryContext old;
	ReceivedSet *s;

	/* checked before the set's memory exists, which a failed check would leave behind */
	knn_shard_check_type_exists(type, "knn_shard_receive_queries");
	reader = received_type_reader(type);
	getTypeBinaryInputInfo(type, &receive, &receive_ioparam);

	context = AllocSetContextCreate(TopTransactionContext, "knn_gpu received queries",
									ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(context);
	s = palloc0(sizeof(ReceivedSet));
	s->set = set;
	s->vector_type = type;
	s->reader = reader;
	s->receive_ioparam = receive_ioparam;
	fmgr_info_cxt(receive, &s->receive, context);
	s->decoded_kind = knn_vector_known_receive_kind(type);
	if (s->decoded_kind != KNN_VECTOR_UNSUPPORTED)
		s->decoded_row = palloc(Max(VECTOR_MAX_DIM * sizeof(float), HALFVEC_MAX_DIM * sizeof(uint16)));
	knn_matrix_init(&s->matrix, "query", s->reader->element);
	MemoryContextSwitchTo(old);
	role_held_add(&received_sets, &s->hold, context);
	ereport(DEBUG1,
			(errmsg_internal("knn_shard_receive_queries: set " INT64_FORMAT " of %s read %s",
							 set, format_type_be(type),
							 s->decoded_kind != KNN_VECTOR_UNSUPPORTED ?
							 "from its send form here" : "through its receive function")));
	return s;
}

static void
malformed(int64 row, const char *what, int64 detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
			 errmsg("knn_shard_receive_queries: malformed block: row " INT64_FORMAT " %s (" INT64_FORMAT ")",
					row, what, detail),
			 errdetail("A block holds rows of (int32 8, int64 id, int32 n, n bytes of the vector's send form).")));
}

/* What pq_getmsgint and its kin raise when a message ends too soon. */
static void
send_form_cut_short(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROTOCOL_VIOLATION),
			 errmsg("insufficient data left in message")));
}

/*
 * Appends one row given in the send form of knn_gpu's or pgvector's vector
 * (halfvec) (int16 dim, int16 unused, dim float4 (binary16) in network
 * order), which those types' receive functions (vector.c, halfvec.c; the
 * same in pgvector) read with typmod -1: the same checks in the same
 * order, with the same errors, and the same bits, without a StringInfo
 * copy, a palloc'd value or a call per element. The elements are decoded
 * in one pass, which also notes a non-finite one; the error names the
 * first, as the receive function, reading in order, would.
 */
static void
decode_send_form(ReceivedSet *s, int64 row, int64 id, const char *data, int n)
{
	bool		half = s->decoded_kind == KNN_VECTOR_HALFVEC;
	const char *type_name = half ? "halfvec" : "vector";
	int			size = half ? sizeof(uint16) : sizeof(float);
	int			max_dim = half ? HALFVEC_MAX_DIM : VECTOR_MAX_DIM;
	uint16		dim16;
	uint16		unused16;
	int			dim;
	int			present;		/* whole elements in the value, up to dim */
	uint32		not_finite = 0;
	char	   *dest;
	KnnVectorView view;

	if (n < 4)
		send_form_cut_short();
	memcpy(&dim16, data, sizeof(dim16));
	memcpy(&unused16, data + 2, sizeof(unused16));
	dim = pg_ntoh16(dim16);
	if (dim < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("%s must have at least 1 dimension", type_name)));
	if (dim > max_dim)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s cannot have more than %d dimensions", type_name, max_dim)));
	if (pg_ntoh16(unused16) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("expected unused to be 0, not %d", (int) pg_ntoh16(unused16))));

	data += 4;
	present = Min(dim, (n - 4) / size);

	/*
	 * Straight into the matrix's next row (the bits the matrix's reader,
	 * which copies the elements as they are, would put there), counted only
	 * once every check passed; into decoded_row where the dimension is not
	 * the matrix's (knn_matrix_append_view then raises the mismatch).
	 */
	dest = knn_matrix_reserve_row(&s->matrix, dim);
	if (dest == NULL)
		dest = s->decoded_row;
	if (half)
	{
		uint16	   *out = (uint16 *) dest;

		for (int i = 0; i < present; i++)
		{
			uint16		h;

			memcpy(&h, data + 2 * (Size) i, sizeof(h));
			h = pg_ntoh16(h);
			not_finite |= (h & 0x7C00) == 0x7C00;
			out[i] = h;
		}
	}
	else
	{
		uint32	   *out = (uint32 *) dest;

		for (int i = 0; i < present; i++)
		{
			uint32		f;

			memcpy(&f, data + 4 * (Size) i, sizeof(f));
			f = pg_ntoh32(f);
			not_finite |= (f & 0x7F800000) == 0x7F800000;
			out[i] = f;
		}
	}
	if (not_finite)
	{
		/* the first element the receive function would refuse */
		for (int i = 0; i < present; i++)
		{
			bool		nan;

			if (half)
			{
				uint16		h = ((uint16 *) dest)[i];

				if ((h & 0x7C00) != 0x7C00)
					continue;
				nan = (h & 0x3FF) != 0;
			}
			else
			{
				float		f = ((float *) dest)[i];

				if (isfinite(f))
					continue;
				nan = isnan(f);
			}
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 nan ? errmsg("NaN not allowed in %s", type_name)
					 : errmsg("infinite value not allowed in %s", type_name)));
		}
	}
	if (present < dim)
		send_form_cut_short();
	if (n != 4 + size * dim)
		malformed(row, "has bytes after its vector's send form", n - 4 - size * dim);

	if (dest != s->decoded_row)
	{
		knn_matrix_commit_row(&s->matrix, id);
		return;
	}
	view.dim = dim;
	view.elements = s->decoded_row;
	knn_matrix_append_view(&s->matrix, id, &view, s->reader);
}

/*
 * knn_shard_receive_queries(set bigint, vector_type regtype, block bytea):
 * appends the block's rows to this role's received set `set` (a new set
 * number drops its set held); the rows held.
 */
PG_FUNCTION_INFO_V1(knn_shard_receive_queries);
Datum
knn_shard_receive_queries(PG_FUNCTION_ARGS)
{
	int64		set = PG_GETARG_INT64(0);
	Oid			type = PG_GETARG_OID(1);
	bytea	   *block = PG_GETARG_BYTEA_PP(2);
	ReceivedSet *received;
	StringInfoData rows;		/* the block, read as a message */
	int64		row = 0;
	MemoryContext row_context;
	StringInfoData value;
	instr_time	start;

	register_callbacks();
	/* a new set number: this role's old set dropped, a new set begun (another role's stays) */
	received = own_received_set();
	if (received != NULL && received->set != set)
	{
		role_held_drop(&received->hold);
		received = NULL;
	}
	if (received == NULL)
		received = start_set(set, type);
	else if (received->vector_type != type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("received query set " INT64_FORMAT " holds %s values, not %s",
						set, format_type_be(received->vector_type), format_type_be(type))));
	/* before any row: a subtransaction that fails from here on takes the set */
	received->hold.level = Max(received->hold.level, GetCurrentTransactionNestLevel());

	INSTR_TIME_SET_CURRENT(start);
	row_context = AllocSetContextCreate(CurrentMemoryContext, "knn_gpu received row",
										ALLOCSET_DEFAULT_SIZES);
	initStringInfo(&value);
	rows.data = VARDATA_ANY(block);
	rows.len = VARSIZE_ANY_EXHDR(block);
	rows.maxlen = rows.len;
	rows.cursor = 0;
	while (rows.cursor < rows.len)
	{
		int32		id_length;
		int64		id;
		int32		n;
		Datum		vector;
		MemoryContext old;

		if (rows.len - rows.cursor < ROW_HEADER_BYTES)
			malformed(row, "is cut short: bytes left", rows.len - rows.cursor);
		id_length = (int32) pq_getmsgint(&rows, 4);
		if (id_length != 8)
			malformed(row, "has an id field that is not 8 bytes long", id_length);
		id = pq_getmsgint64(&rows);
		n = (int32) pq_getmsgint(&rows, 4);
		if (n < 0 || n > rows.len - rows.cursor)
			malformed(row, "has a vector length past the block's end", n);

		if (received->decoded_kind != KNN_VECTOR_UNSUPPORTED)
			decode_send_form(received, row, id, pq_getmsgbytes(&rows, n), n);
		else
		{
			/* a receive function reads a StringInfo ending in '\0', as COPY gives it */
			resetStringInfo(&value);
			appendBinaryStringInfo(&value, pq_getmsgbytes(&rows, n), n);
			old = MemoryContextSwitchTo(row_context);
			vector = ReceiveFunctionCall(&received->receive, &value, received->receive_ioparam, -1);
			MemoryContextSwitchTo(old);
			if (value.cursor != value.len)
				malformed(row, "has bytes after its vector's send form", value.len - value.cursor);
			knn_matrix_append(&received->matrix, id, vector, received->reader);
			MemoryContextReset(row_context);
		}
		if (++row % ROWS_PER_INTERRUPT_CHECK == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(value.data);
	MemoryContextDelete(row_context);
	received->blocks++;
	received->seconds += knn_seconds_since(start);
	PG_RETURN_INT64(received->matrix.n);
}

/* This role's set `set`, or ERROR. */
static ReceivedSet *
received_set_of(int64 set)
{
	ReceivedSet *s = received_set(set);

	if (s == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("no received query set " INT64_FORMAT " in this transaction", set),
				 errhint("knn_shard_receive_queries() ships the rows first, in the same transaction.")));
	return s;
}

Oid
knn_received_queries_type(int64 set)
{
	return received_set_of(set)->vector_type;
}

void
knn_received_queries_take(int64 set, KnnMatrix *queries)
{
	ReceivedSet *s = received_set_of(set);
	const KnnVectorReader *reader;

	role_held_forget(&s->hold);
	ereport(DEBUG1,
			(errmsg_internal("knn_shard_receive_queries: set " INT64_FORMAT ": " INT64_FORMAT " rows in " INT64_FORMAT " blocks read in %.3f s",
							 set, s->matrix.n, s->blocks, s->seconds)));
	if (queries->element == s->matrix.element)
	{
		/* the rows as received: their memory now lives as long as the matrix's */
		MemoryContextSetParent(s->hold.context, queries->context);
		*queries = s->matrix;
		return;
	}

	/*
	 * Read as another element (vector rows as halfvec): each received row
	 * is the vector's elements as its receive function gave them, so the
	 * reader sees what it would see in the value.
	 */
	reader = knn_vector_reader_for(knn_vector_kind(s->vector_type), queries->element);
	if (reader == NULL)
	{
		MemoryContextDelete(s->hold.context);
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("received %s query values cannot join as this join's element type",
						format_type_be(s->vector_type))));
	}
	PG_TRY();
	{
		for (int64 r = 0; r < s->matrix.n; r++)
		{
			KnnVectorView view;

			view.dim = s->matrix.dim;
			view.elements = s->matrix.values + (Size) r * s->matrix.row_bytes;
			knn_matrix_append_view(queries, s->matrix.ids[r], &view, reader);
			if (r % ROWS_PER_INTERRUPT_CHECK == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
	PG_FINALLY();
	{
		MemoryContextDelete(s->hold.context);
	}
	PG_END_TRY();
}

/* ---- targets read ahead of the join ---- */

MemoryContext
knn_held_targets_begin(int64 set)
{
	MemoryContext context;
	HeldTargets *h;

	register_callbacks();
	refuse_while_filling();
	/* this role's targets held before: dropped (another role's stay) */
	h = own_held_targets();
	if (h != NULL)
		role_held_drop(&h->hold);
	context = AllocSetContextCreate(TopTransactionContext, "knn_gpu prefetched targets",
									ALLOCSET_DEFAULT_SIZES);
	h = MemoryContextAllocZero(context, sizeof(HeldTargets));
	h->set = set;
	h->generation = ++held_generation;
	role_held_add(&held_target_reads, &h->hold, context);
	return context;
}

uint64
knn_held_targets_generation(void)
{
	HeldTargets *h = own_held_targets();

	return h != NULL ? h->generation : 0;
}

bool
knn_held_targets_unchanged(int64 set, uint64 generation)
{
	HeldTargets *h = own_held_targets();

	return h != NULL && h->set == set && h->generation == generation;
}

void
knn_held_targets_keep(int64 set, const char *targets_sql, Oid vector_type, const KnnMatrix *matrix)
{
	HeldTargets *h = own_held_targets();

	if (h == NULL || h->set != set)
		elog(ERROR, "knn_held_targets_keep: set " INT64_FORMAT " was not begun", set);
	h->targets_sql = MemoryContextStrdup(h->hold.context, targets_sql);
	h->vector_type = vector_type;
	h->matrix = *matrix;
}

bool
knn_held_targets_take(int64 set, const char *targets_sql, Oid vector_type, KnnMatrix *targets)
{
	HeldTargets *h = own_held_targets();

	/*
	 * None of this role's (another role's are not this one's to take:
	 * SET ROLE since, a SECURITY DEFINER function), or begun but not kept
	 * (its read failed in a subtransaction that went on): not usable.
	 */
	if (h == NULL || h->set != set || h->targets_sql == NULL)
		return false;
	if (strcmp(h->targets_sql, targets_sql) != 0 || h->vector_type != vector_type ||
		h->matrix.element != targets->element)
	{
		role_held_drop(&h->hold);
		return false;
	}
	role_held_forget(&h->hold);
	/* the rows as read: their memory now lives as long as the matrix's */
	MemoryContextSetParent(h->hold.context, targets->context);
	{
		/* (a self-join's read ahead named its rows queries, in its messages) */
		const char *set_name = targets->set_name;

		*targets = h->matrix;
		targets->set_name = set_name;
	}
	/* rows relayed after them (knn_shard_receive_held_rows) are queries, not targets */
	targets->n -= h->relayed;
	return true;
}

/* Set `set`'s held targets, read by this role, or ERROR. */
static HeldTargets *
held_targets_of(int64 set)
{
	HeldTargets *h = own_held_targets();

	if (h == NULL || h->set != set || h->targets_sql == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("no targets of set " INT64_FORMAT " held in this transaction", set),
				 errhint("knn_shard_prefetch_self_join() reads them first, in the same transaction.")));
	return h;
}

Oid
knn_held_queries_type(int64 set)
{
	HeldTargets *h = held_targets_of(set);
	ReceivedSet *received = received_set(set);

	/* (bit strings are shipped as bit varying, a bit column's rows held as bit: one kind) */
	if (received == NULL)
		return h->vector_type;
	if (knn_vector_kind(received->vector_type) != knn_vector_kind(h->vector_type))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("received %s query values with held %s rows",
						format_type_be(received->vector_type), format_type_be(h->vector_type))));
	return received->vector_type;
}

void
knn_held_queries_take(int64 set, KnnMatrix *queries)
{
	const KnnMatrix *own = &held_targets_of(set)->matrix;
	instr_time	start;

	if (received_set(set) != NULL)
		knn_received_queries_take(set, queries);
	if (own->n == 0)
		return;
	if (own->element != queries->element)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("held rows cannot join as this join's element type with the received query rows")));
	if (queries->dim >= 0 && queries->dim != own->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("held rows of %d dimensions cannot join with the received query rows of %d",
						own->dim, queries->dim)));
	INSTR_TIME_SET_CURRENT(start);
	knn_matrix_append_rows(queries, own);
	ereport(DEBUG1,
			(errmsg_internal("knn_held_queries_take: set " INT64_FORMAT ": " INT64_FORMAT " held rows copied after " INT64_FORMAT " received in %.3f s",
							 set, own->n, queries->n - own->n, knn_seconds_since(start))));
}

void
knn_held_targets_drop(int64 set)
{
	HeldTargets *h = own_held_targets();

	if (h != NULL && h->set == set)
	{
		refuse_while_filling();
		role_held_drop(&h->hold);
	}
}

int64
knn_held_targets_rows(void)
{
	HeldTargets *h = own_held_targets();

	return h != NULL && h->targets_sql != NULL ? h->matrix.n - h->relayed : -1;
}

/* ---- held targets sent back as a self-join's queries ---- */

bool
knn_rows_swap_order(char *dest, const char *src, Size n_bytes, KnnElement element)
{
	bool		not_finite = false;

	if (element == KNN_ELEMENT_FLOAT32)
		for (Size i = 0; i < n_bytes; i += 4)
		{
			uint32		w;

			memcpy(&w, src + i, 4);
			w = pg_ntoh32(w);
			not_finite |= (w & 0x7F800000) == 0x7F800000;
			memcpy(dest + i, &w, 4);
		}
	else if (element == KNN_ELEMENT_FLOAT16)
		for (Size i = 0; i < n_bytes; i += 2)
		{
			uint16		w;

			memcpy(&w, src + i, 2);
			w = pg_ntoh16(w);
			not_finite |= (w & 0x7C00) == 0x7C00;
			memcpy(dest + i, &w, 2);
		}
	else
		memcpy(dest, src, n_bytes);
	return not_finite;
}

#define KNN_HELD_BLOCK_BYTES (1024 * 1024)

int64
knn_held_block_rows(const KnnMatrix *m)
{
	return Max((int64) (KNN_HELD_BLOCK_BYTES / (sizeof(int64) + m->row_bytes)), 1);
}

bytea *
knn_held_block(const KnnMatrix *m, int64 first, int64 rows)
{
	Size		bytes = 12 + (Size) rows * (sizeof(int64) + m->row_bytes);
	bytea	   *block = (bytea *) palloc(VARHDRSZ + bytes);
	char	   *p = VARDATA(block);
	uint32		header[3] = {pg_hton32((uint32) m->element), pg_hton32((uint32) m->dim),
	pg_hton32((uint32) rows)};

	SET_VARSIZE(block, VARHDRSZ + bytes);
	memcpy(p, header, sizeof(header));
	p += sizeof(header);
	for (int64 r = 0; r < rows; r++)
	{
		uint64		id = pg_hton64((uint64) m->ids[first + r]);

		memcpy(p, &id, sizeof(id));
		p += sizeof(id);
	}
	(void) knn_rows_swap_order(p, m->values + (Size) first * m->row_bytes,
							   (Size) rows * m->row_bytes, m->element);
	return block;
}

/*
 * knn_shard_held_target_blocks(set bigint): the held targets of set `set`
 * (still held for its join) in blocks of about KNN_HELD_BLOCK_BYTES:
 * int32 element, int32 dim, int32 rows, then the rows' int64 ids, then
 * their elements as the matrix holds them (float32 and float16 as 32- and
 * 16-bit words), all in network byte order. Value per call from the
 * target list: each block goes to the coordinator as it is made.
 */

PG_FUNCTION_INFO_V1(knn_shard_held_target_blocks);
Datum
knn_shard_held_target_blocks(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;
	int64		set = PG_GETARG_INT64(0);
	HeldTargets *h;
	int64	   *next;
	const KnnMatrix *m;
	int64		rows;
	bytea	   *block;

	if (SRF_IS_FIRSTCALL())
	{
		funcctx = SRF_FIRSTCALL_INIT();
		h = own_held_targets();
		if (h == NULL || h->set != set || h->targets_sql == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("no targets held for query set " INT64_FORMAT " in this transaction", set),
					 errhint("knn_shard_prefetch_self_join() reads them first, in the same transaction.")));
		funcctx->user_fctx = MemoryContextAllocZero(funcctx->multi_call_memory_ctx, sizeof(int64));
	}
	funcctx = SRF_PERCALL_SETUP();
	next = (int64 *) funcctx->user_fctx;
	/* the set must still be held between calls (nothing else runs on this connection meanwhile) */
	h = own_held_targets();
	if (h == NULL || h->set != set)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the targets held for query set " INT64_FORMAT " were dropped", set)));
	m = &h->matrix;
	/* this server's rows only, not those relayed after them */
	if (*next >= m->n - h->relayed)
		SRF_RETURN_DONE(funcctx);
	CHECK_FOR_INTERRUPTS();
	rows = Min(knn_held_block_rows(m), m->n - h->relayed - *next);
	block = knn_held_block(m, *next, rows);
	*next += rows;
	SRF_RETURN_NEXT(funcctx, PointerGetDatum(block));
}

/* ---- the other shards' held rows, relayed by the coordinator ---- */

static const char *
element_name(int32 element)
{
	switch (element)
	{
		case KNN_ELEMENT_FLOAT32:
			return "float32";
		case KNN_ELEMENT_FLOAT16:
			return "float16";
		case KNN_ELEMENT_BIT:
			return "bit";
		default:
			return "unknown";
	}
}

static void
malformed_held_block(const char *what, int64 detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
			 errmsg("knn_shard_receive_held_rows: malformed block: %s (" INT64_FORMAT ")", what, detail),
			 errdetail("A block holds int32 element, int32 dim, int32 rows, then the rows' int64 ids, then their elements, in network byte order, as knn_shard_held_target_blocks() makes it.")));
}

/* The most elements (bits) a row of the held rows' type may have. */
static int64
held_type_max_dim(Oid type)
{
	switch (knn_vector_kind(type))
	{
		case KNN_VECTOR_TYPE:
			return VECTOR_MAX_DIM;
		case KNN_VECTOR_HALFVEC:
			return HALFVEC_MAX_DIM;
		default:
			return VARBITMAXLEN;
	}
}

/* A row of the block with a non-finite element (rows in this server's order at `rows`): ERROR. */
static void
report_not_finite(const KnnMatrix *m, const char *rows, const int64 *ids, int32 count,
				  int64 first_row)
{
	for (int32 r = 0; r < count; r++)
	{
		const char *row = rows + (Size) r * m->row_bytes;

		for (int i = 0; i < m->dim; i++)
		{
			bool		nan;

			if (m->element == KNN_ELEMENT_FLOAT16)
			{
				uint16		h;

				memcpy(&h, row + 2 * (Size) i, sizeof(h));
				if ((h & 0x7C00) != 0x7C00)
					continue;
				nan = (h & 0x3FF) != 0;
			}
			else
			{
				float		f;

				memcpy(&f, row + 4 * (Size) i, sizeof(f));
				if (isfinite(f))
					continue;
				nan = isnan(f);
			}
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("knn_shard_receive_held_rows: %s in row " INT64_FORMAT " of the block (id " INT64_FORMAT ")",
							nan ? "NaN" : "infinite value", first_row + r, ids[r])));
		}
	}
}

/*
 * The block's rows (its ids at `ids`, its elements at `elements`, checked
 * to fit) into the matrix's room past its last row (`dest`, and
 * m->ids + m->n): ids and elements swapped into this server's order and
 * checked in the same pass, in slices with a look for a cancel between.
 * Counts nothing: the caller commits the rows once all passed.
 */
static void
fill_held_rows(const KnnMatrix *m, const char *ids, const char *elements, int32 rows, char *dest)
{
	int64	   *id_dest = m->ids + m->n;
	int			tail_bits = m->element == KNN_ELEMENT_BIT ? m->dim % 8 : 0;

	for (int32 first = 0; first < rows; first += ROWS_PER_INTERRUPT_CHECK)
	{
		int32		count = Min(ROWS_PER_INTERRUPT_CHECK, rows - first);
		char	   *out = dest + (Size) first * m->row_bytes;

		CHECK_FOR_INTERRUPTS();
		for (int32 r = first; r < first + count; r++)
		{
			uint64		id;

			memcpy(&id, ids + (Size) r * sizeof(int64), sizeof(id));
			id_dest[r] = (int64) pg_ntoh64(id);
		}
		if (knn_rows_swap_order(out, elements + (Size) first * m->row_bytes,
								(Size) count * m->row_bytes, m->element))
			report_not_finite(m, out, id_dest + first, count, first);
		/* a bit string's last byte: the bits past its length are zero, as in a value */
		if (tail_bits != 0)
			for (int32 r = 0; r < count; r++)
				if ((uint8) out[(Size) r * m->row_bytes + m->row_bytes - 1] & (0xFF >> tail_bits))
					malformed_held_block("row has bits set past its bit length", first + r);
	}
}

/*
 * knn_shard_receive_held_rows(set bigint, vector_type regtype, block
 * bytea): a block another shard's knn_shard_held_target_blocks made,
 * relayed unchanged by the coordinator of a sharded self-join, appended
 * after the rows this backend holds as set `set`'s targets; the rows
 * relayed so far.
 */
PG_FUNCTION_INFO_V1(knn_shard_receive_held_rows);
Datum
knn_shard_receive_held_rows(PG_FUNCTION_ARGS)
{
	int64		set = PG_GETARG_INT64(0);
	Oid			type = PG_GETARG_OID(1);
	bytea	   *block = PG_GETARG_BYTEA_PP(2);
	const char *data = VARDATA_ANY(block);
	int64		length = VARSIZE_ANY_EXHDR(block);
	HeldTargets *h = held_targets_of(set);
	KnnMatrix  *m = &h->matrix;
	uint32		header[3];
	int32		element;
	int32		dim;
	int32		rows;
	bool		fixes_dim;
	instr_time	start;

	INSTR_TIME_SET_CURRENT(start);
	knn_shard_check_type_exists(type, "knn_shard_receive_held_rows");
	/* (bit strings are shipped as bit varying, a bit column's rows held as bit: one kind) */
	if (getBaseType(type) != type || knn_vector_kind(type) != knn_vector_kind(h->vector_type))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("knn_shard_receive_held_rows: set " INT64_FORMAT " holds %s rows, not %s",
						set, format_type_be(h->vector_type), format_type_be(type))));

	if (length < 12)
		malformed_held_block("is shorter than its 12-byte header", length);
	memcpy(header, data, sizeof(header));
	element = (int32) pg_ntoh32(header[0]);
	dim = (int32) pg_ntoh32(header[1]);
	rows = (int32) pg_ntoh32(header[2]);
	if (element != (int32) m->element)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("knn_shard_receive_held_rows: a block of %s rows for set " INT64_FORMAT ", whose rows are %s",
						element_name(element), set, element_name(m->element))));
	if (m->dim >= 0 && dim != m->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("knn_shard_receive_held_rows: a block of rows of %d dimensions for set " INT64_FORMAT ", whose rows have %d",
						dim, set, m->dim)));
	if (m->dim < 0 && (dim < 1 || dim > held_type_max_dim(h->vector_type)))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("knn_shard_receive_held_rows: a block of rows of %d dimensions for set " INT64_FORMAT ", whose %s rows have 1 to " INT64_FORMAT,
						dim, set, format_type_be(h->vector_type), held_type_max_dim(h->vector_type))));
	if (rows < 1)
		malformed_held_block("has no rows", rows);
	if (length != 12 + (int64) rows * (int64) (sizeof(int64) + knn_row_bytes(m->element, dim)))
		malformed_held_block("is not 12 + rows x (8 + the row's bytes) long", length);

	/* straight into the matrix's room past its rows; a block that fails leaves no row */
	fixes_dim = m->dim < 0;
	PG_TRY();
	{
		char	   *dest = knn_matrix_reserve_more(m, dim, rows);

		fill_held_rows(m, data + 12, data + 12 + (Size) rows * sizeof(int64), rows, dest);
	}
	PG_CATCH();
	{
		if (fixes_dim && m->n == 0)
			knn_matrix_forget_dim(m);
		PG_RE_THROW();
	}
	PG_END_TRY();
	/* a subtransaction that aborts after this takes the set (received_subxact_callback) */
	h->hold.level = Max(h->hold.level, GetCurrentTransactionNestLevel());
	knn_matrix_commit_rows(m, rows);
	h->relayed += rows;
	h->relay_blocks++;
	{
		double		seconds = knn_seconds_since(start);

		h->relay_seconds += seconds;
		h->relay_slowest = Max(h->relay_slowest, seconds);
	}
	PG_RETURN_INT64(h->relayed);
}

bool
knn_held_rows_take(int64 set, const char *targets_sql, Oid vector_type, KnnMatrix *queries,
				   KnnMatrix *targets, bool *targets_taken)
{
	HeldTargets *h = held_targets_of(set);
	KnnMatrix	own;
	instr_time	start;
	double		seconds_sort;

	*targets_taken = false;
	if (received_set(set) != NULL)
		return false;			/* rows by knn_shard_receive_queries: knn_held_queries_take */
	if (h->matrix.n > 0 && h->matrix.element != queries->element)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("held rows cannot join as this join's element type with the received query rows")));
	INSTR_TIME_SET_CURRENT(start);
	role_held_forget(&h->hold);

	/*
	 * This server's rows in id order, in place (the targets' order breaks
	 * ties; the relayed rows' order does not matter: the pairs go back
	 * keyed by query id).
	 */
	own = h->matrix;
	own.n = h->matrix.n - h->relayed;
	own.capacity = own.n;
	knn_matrix_sort_by_id(&own);
	seconds_sort = knn_seconds_since(start);

	/* the held matrix itself: its memory now lives as long as the queries' */
	MemoryContextSetParent(h->hold.context, queries->context);
	{
		const char *set_name = queries->set_name;

		*queries = h->matrix;
		queries->set_name = set_name;
	}
	if (strcmp(h->targets_sql, targets_sql) == 0 && h->vector_type == vector_type)
	{
		const char *set_name = targets->set_name;

		/*
		 * The first rows of the same memory, never freed or written through
		 * this matrix (shared is the queries'). Ids of their own where rows
		 * follow: an engine that sees one array of keys on both sides takes
		 * the two sides for the same rows.
		 */
		*targets = own;
		targets->set_name = set_name;
		targets->shared = NULL;
		if (h->relayed > 0)
		{
			targets->ids = MemoryContextAllocHuge(queries->context,
												  Max(1, (Size) own.n * sizeof(int64)));
			memcpy(targets->ids, own.ids, (Size) own.n * sizeof(int64));
		}
		*targets_taken = true;
	}
	ereport(DEBUG1,
			(errmsg_internal("knn_shard_receive_held_rows: set " INT64_FORMAT ": " INT64_FORMAT " rows relayed in " INT64_FORMAT " blocks, read in %.3f s (the slowest block %.4f s); queries: " INT64_FORMAT " held rows (put in id order in %.3f s) and them, taken in %.3f s (no copy)",
							 set, h->relayed, h->relay_blocks, h->relay_seconds, h->relay_slowest, own.n,
							 seconds_sort, knn_seconds_since(start))));
	return true;
}

/* ---- a self-join's held rows against the coordinator's declared columns ---- */

char *
knn_shard_type_identity(Oid type)
{
	KnnVectorKind kind;
	Oid			extension;

	if (type < FirstGenbkiObjectId)
		return psprintf("pg_catalog %u", type);
	kind = knn_vector_kind(type);
	if (get_typtype(type) != TYPTYPE_BASE ||
		(kind != KNN_VECTOR_TYPE && kind != KNN_VECTOR_HALFVEC))
		return NULL;
	extension = getExtensionOfObject(TypeRelationId, type);
	if (!OidIsValid(extension))
		return NULL;
	return psprintf("%s %s", get_extension_name(extension),
					kind == KNN_VECTOR_TYPE ? "vector" : "halfvec");
}
