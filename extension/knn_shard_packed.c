/*
 * knn_shard_packed.c -- a shard's knn_join rows packed into bytea values,
 * and read back (knn_shard_packed.h).
 */
#include "postgres.h"

#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "utils/tuplestore.h"

#include "knn_matrix.h"
#include "knn_shard_packed.h"

static void
start_value(KnnPackedRows *out)
{
	resetStringInfo(&out->buf);
	appendStringInfoSpaces(&out->buf, VARHDRSZ);
}

void
knn_packed_begin(KnnPackedRows *out, ReturnSetInfo *rsinfo)
{
	out->rsinfo = rsinfo;
	out->rows = 0;
	initStringInfo(&out->buf);
	enlargeStringInfo(&out->buf, VARHDRSZ + KNN_PACKED_ROWS * KNN_PACKED_ROW_BYTES);
	start_value(out);
}

static void
put_value(KnnPackedRows *out)
{
	Datum		value = PointerGetDatum(out->buf.data);
	bool		isnull = false;

	SET_VARSIZE(out->buf.data, out->buf.len);
	tuplestore_putvalues(out->rsinfo->setResult, out->rsinfo->setDesc, &value, &isnull);
	start_value(out);
	CHECK_FOR_INTERRUPTS();
}

/* A row's three fields in network byte order, in one store (no per-field bound checks). */
static inline void
pack_row(char *p, int64 query_id, int64 target_id, double distance)
{
	uint64		words[3];
	uint64		bits;

	memcpy(&bits, &distance, sizeof(bits));
	words[0] = pg_hton64((uint64) query_id);
	words[1] = pg_hton64((uint64) target_id);
	words[2] = pg_hton64(bits);
	memcpy(p, words, KNN_PACKED_ROW_BYTES);
}

void
knn_packed_put(KnnPackedRows *out, int64 query_id, int64 target_id, double distance)
{
	/* (the value's room for KNN_PACKED_ROWS rows was reserved at the start) */
	Assert(out->buf.len + KNN_PACKED_ROW_BYTES <= out->buf.maxlen);
	pack_row(out->buf.data + out->buf.len, query_id, target_id, distance);
	out->buf.len += KNN_PACKED_ROW_BYTES;
	if (++out->rows % KNN_PACKED_ROWS == 0)
		put_value(out);
}

bytea *
knn_packed_next(KnnPackedCursor *cursor)
{
	const KnnJoinDirect *d = &cursor->result;
	bytea	   *value = palloc(VARHDRSZ + (Size) KNN_PACKED_ROWS * KNN_PACKED_ROW_BYTES);
	char	   *p = VARDATA(value);
	int64		rows = 0;

	while (cursor->query < d->n_queries && rows < KNN_PACKED_ROWS)
	{
		int64		q = cursor->query;

		if (d->offsets != NULL)
		{
			int64		end;

			if (cursor->at < d->offsets[q])
				cursor->at = d->offsets[q];
			end = Min(d->offsets[q + 1], cursor->at + (KNN_PACKED_ROWS - rows));
			for (; cursor->at < end; cursor->at++)
				pack_row(p + (rows++) * KNN_PACKED_ROW_BYTES, d->query_ids[q],
						 d->target_ids[cursor->at], d->distances[cursor->at]);
			if (cursor->at < d->offsets[q + 1])
				break;
		}
		else
		{
			for (; cursor->at < d->slots && rows < KNN_PACKED_ROWS; cursor->at++)
			{
				int64		slot = q * d->slots + cursor->at;
				int64		t = d->neighbors[slot];

				if (t < 0)
				{
					cursor->at = d->slots;
					break;
				}
				knn_prefetch_target(d->target_ids, NULL, d->neighbors, slot,
									d->n_queries * d->slots);
				pack_row(p + (rows++) * KNN_PACKED_ROW_BYTES, d->query_ids[q],
						 d->target_ids[t], d->distances[slot]);
			}
			if (cursor->at < d->slots)
				break;
		}
		cursor->query++;
		cursor->at = 0;
		if ((cursor->query & 4095) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	if (rows == 0)
	{
		pfree(value);
		return NULL;
	}
	SET_VARSIZE(value, VARHDRSZ + rows * KNN_PACKED_ROW_BYTES);
	return value;
}

void
knn_packed_end(KnnPackedRows *out)
{
	if (out->buf.len > VARHDRSZ)
		put_value(out);
	pfree(out->buf.data);
	out->buf.data = NULL;
}

static uint64
get_uint64(const char *p)
{
	uint64		v;

	memcpy(&v, p, sizeof(v));
	return pg_ntoh64(v);
}

void
knn_packed_get(const char *p, int64 *query_id, int64 *target_id, double *distance)
{
	uint64		bits = get_uint64(p + 16);

	*query_id = (int64) get_uint64(p);
	*target_id = (int64) get_uint64(p + 8);
	memcpy(distance, &bits, sizeof(*distance));
}
