/*
 * knn_shard_packed.c -- a shard's knn_join rows packed into bytea values,
 * and read back (knn_shard_packed.h).
 */
#include "postgres.h"

#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "utils/tuplestore.h"

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

void
knn_packed_put(KnnPackedRows *out, int64 query_id, int64 target_id, double distance)
{
	pq_sendint64(&out->buf, query_id);
	pq_sendint64(&out->buf, target_id);
	pq_sendfloat8(&out->buf, distance);
	if (++out->rows % KNN_PACKED_ROWS == 0)
		put_value(out);
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
