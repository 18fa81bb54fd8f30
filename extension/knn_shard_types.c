/*
 * knn_shard_types.c -- the partitions' column types on their shards
 * against the types the foreign tables declare here (knn_shard.h).
 *
 * Why: postgres_fdw reads a foreign table's rows as text, each value
 * through the input function of the type declared here, so a plain scan
 * (and the join of its rows here) computes with the declared type
 * whatever the shard's column is. A shard's own join computes with its
 * column's type there: a halfvec column under a declared vector gives
 * halfvec distances (the query vectors rounded to halfvec), pgvector's
 * vector under knn_gpu's has pgvector's operators, a vector of any
 * dimension under a declared vector(8) joins where the read here fails. So a partition joins on its shard only where every column the
 * shard's join computes with (the caller's typed columns: the id and the
 * vector; the node's self-exclusion, group and ORDER BY columns) has there
 * exactly the declared type: the same type by catalog identity
 * (knn_shard_type_identity: a built-in type by OID, knn_gpu's or
 * pgvector's vector and halfvec by extension and input function, never by
 * a name a user could give another type) and, where the declared type has
 * a typmod, the same typmod. Anything else (a domain, another extension's
 * type) is read here, as without the shards. (A table or column not there
 * stays with the shard: its join fails as the read here would.)
 *
 * The shard is asked within its check at opening (knn_shard_remote_open),
 * so the question costs no round trip of its own: one text[] field of
 * three values per typed column of each partition, read from its
 * catalogs by the names postgres_fdw's SELECT uses there (the table's
 * schema_name and table_name options, the column's column_name, else the
 * names here).
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/pg_language.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "foreign/foreign.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"

#include "knn_shard.h"
#include "knn_shard_receive.h"

/* per typed column, in the shard's answer: its type's identity there, its typmod, its type's name */
#define ANSWERS_PER_COLUMN 3

/*
 * knn_shard_type_identity of the column's type there (ra: its
 * pg_attribute row): "pg_catalog <oid>" for a built-in type, "<extension>
 * vector" or "<extension> halfvec" for a base type of knn_gpu or pgvector
 * ("vector") whose input is that extension's C function of the type, else
 * NULL.
 */
#define REMOTE_TYPE_IDENTITY_SQL \
	"CASE WHEN ra.atttypid < " CppAsString2(FirstGenbkiObjectId) \
	" THEN 'pg_catalog ' || ra.atttypid::pg_catalog.text ELSE (" \
	"SELECT x.extname || CASE WHEN p.prosrc IN ('knn_vector_in', 'vector_in')" \
	"  THEN ' vector' ELSE ' halfvec' END" \
	" FROM pg_catalog.pg_type t, pg_catalog.pg_proc p, pg_catalog.pg_extension x" \
	" WHERE t.oid = ra.atttypid AND p.oid = t.typinput AND t.typtype = 'b' AND t.typlen = -1" \
	"  AND p.prolang = " CppAsString2(ClanguageId) \
	"  AND x.oid = (SELECT d.refobjid FROM pg_catalog.pg_depend d" \
	"   WHERE d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND d.objid = t.oid AND d.deptype = 'e')" \
	"  AND x.oid = (SELECT d.refobjid FROM pg_catalog.pg_depend d" \
	"   WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = p.oid AND d.deptype = 'e')" \
	"  AND ((x.extname = 'knn_gpu' AND p.prosrc IN ('knn_vector_in', 'knn_halfvec_in'))" \
	"    OR (x.extname = 'vector' AND p.prosrc IN ('vector_in', 'halfvec_in')))) END"

/* A foreign table's option (or a column's, options of GetForeignColumnOptions), or NULL. */
static char *
option_value(List *options, const char *name)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *def = lfirst_node(DefElem, lc);

		if (strcmp(def->defname, name) == 0)
			return defGetString(def);
	}
	return NULL;
}

/*
 * "(<n>, '<table>', '<column>')": the column as postgres_fdw's SELECT
 * names it there (the table's name as that SELECT writes it, to be
 * resolved as it is resolved there).
 */
static char *
remote_column_row(int n, const KnnShardScan *scan, AttrNumber attno)
{
	List	   *table_options = GetForeignTable(scan->relid)->options;
	char	   *schema = option_value(table_options, "schema_name");
	char	   *table = option_value(table_options, "table_name");
	char	   *column = option_value(GetForeignColumnOptions(scan->relid, attno), "column_name");

	if (schema == NULL)
		schema = get_namespace_name(get_rel_namespace(scan->relid));
	if (table == NULL)
		table = get_rel_name(scan->relid);
	if (column == NULL)
		column = get_attname(scan->relid, attno, false);
	return psprintf("(%d, %s, %s)", n,
					quote_literal_cstr(psprintf("%s.%s", quote_identifier(schema),
												quote_identifier(table))),
					quote_literal_cstr(column));
}

/* Is the output column (1-based) one of the scan's? (The callers' columns always are.) */
static bool
scan_has_column(const KnnShardScan *scan, AttrNumber column)
{
	return column >= 1 && column <= scan->n_columns;
}

/* The typed columns of the shard's partitions, in the order of the answer. */
static int
count_typed_columns(const KnnShardPlan *sp, const KnnShardRemote *shard)
{
	ListCell   *lc;
	int			n = 0;

	foreach(lc, shard->scans)
		for (int c = 0; c < sp->n_typed_columns; c++)
			if (scan_has_column(lfirst(lc), sp->typed_columns[c]))
				n++;
	return n;
}

char *
knn_shard_types_fields(const KnnShardPlan *sp, const KnnShardRemote *shard, int *n_fields)
{
	StringInfoData columns;
	ListCell   *lc;
	int			n = 0;

	*n_fields = 0;
	if (count_typed_columns(sp, shard) == 0)
		return "";
	initStringInfo(&columns);
	foreach(lc, shard->scans)
	{
		const KnnShardScan *scan = lfirst(lc);

		for (int c = 0; c < sp->n_typed_columns; c++)
		{
			if (!scan_has_column(scan, sp->typed_columns[c]))
				continue;
			appendStringInfo(&columns, "%s%s", n > 0 ? ", " : "",
							 remote_column_row(n, scan, scan->attnos[sp->typed_columns[c] - 1]));
			n++;
		}
	}
	*n_fields = 1;
	/*
	 * One text[] of ANSWERS_PER_COLUMN values per column, in order: one
	 * plan for all, however many partitions (planned in about 0.4 ms there,
	 * run in 0.1 ms, beside the check's 1.8 ms). A column_name option may
	 * name a system column there (xmin: of type xid), which postgres_fdw's
	 * SELECT reads as any other: its pg_attribute row counts too.
	 */
	return psprintf(", ARRAY(SELECT v.answer FROM (VALUES %s) c(n, rel, col)"
					" LEFT JOIN pg_catalog.pg_attribute ra"
					"  ON ra.attrelid = pg_catalog.to_regclass(c.rel)"
					"  AND ra.attname = c.col::pg_catalog.name AND NOT ra.attisdropped"
					" CROSS JOIN LATERAL (VALUES (1, " REMOTE_TYPE_IDENTITY_SQL "),"
					"  (2, ra.atttypmod::pg_catalog.text),"
					"  (3, pg_catalog.format_type(ra.atttypid, ra.atttypmod))) v(k, answer)"
					" ORDER BY c.n, v.k)",
					columns.data);
}

/*
 * Why the column (its answers: identity, typmod and type name there) is
 * not of the declared type, or NULL where it is.
 */
static char *
column_differs(const KnnShardScan *scan, AttrNumber column, Datum *there, bool *null)
{
	int			i = column - 1;
	char	   *here = knn_shard_type_identity(scan->types[i]);

	/*
	 * No such table or column there: the shard's join fails as the read
	 * here would (postgres_fdw's SELECT names it), its ERROR naming the
	 * server.
	 */
	if (null[2])
		return NULL;
	if (here != NULL && !null[0] && strcmp(here, TextDatumGetCString(there[0])) == 0 &&
		(scan->typmods[i] < 0 ||
		 (!null[1] && scan->typmods[i] == pg_strtoint32(TextDatumGetCString(there[1])))))
		return NULL;
	return psprintf("its column \"%s\" is %s there, %s here",
					get_attname(scan->relid, scan->attnos[i], false),
					TextDatumGetCString(there[2]),
					format_type_with_typemod(scan->types[i], scan->typmods[i]));
}

/*
 * The shard's answer, a text[] in its text form, read by this server's
 * array_in (hostile input: its own checks), of exactly n values.
 */
static void
read_answers(const KnnShardRemote *shard, const char *answer, int n, Datum **values,
			 bool **nulls)
{
	int			n_read = -1;

	if (answer != NULL)
		deconstruct_array(DatumGetArrayTypeP(OidInputFunctionCall(F_ARRAY_IN, (char *) answer,
																  TEXTOID, -1)),
						  TEXTOID, -1, false, TYPALIGN_INT, values, nulls, &n_read);
	if (n_read != n)
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("%s on foreign server \"%s\" returned %d answers about its columns' types, not %d",
						shard->who, shard->server->servername, Max(n_read, 0), n)));
}

void
knn_shard_types_check(KnnShardPlan *sp, KnnShardRemote *shard, char **fields,
					  StringInfo fallbacks)
{
	List	   *kept = NIL;
	StringInfoData read_here;
	ListCell   *lc;
	Datum	   *answers;
	bool	   *nulls;
	int			answer = 0;

	if (count_typed_columns(sp, shard) == 0)
		return;
	read_answers(shard, fields[0], ANSWERS_PER_COLUMN * count_typed_columns(sp, shard),
				 &answers, &nulls);
	initStringInfo(&read_here);
	foreach(lc, shard->scans)
	{
		KnnShardScan *scan = lfirst(lc);
		char	   *why = NULL;

		for (int c = 0; c < sp->n_typed_columns; c++)
		{
			AttrNumber	column = sp->typed_columns[c];

			if (!scan_has_column(scan, column))
				continue;
			if (why == NULL)
				why = column_differs(scan, column, &answers[answer], &nulls[answer]);
			answer += ANSWERS_PER_COLUMN;
		}
		if (why == NULL)
		{
			kept = lappend(kept, scan);
			continue;
		}
		ereport(NOTICE,
				(errmsg("%s reads the rows of foreign table \"%s\" of server \"%s\" here: %s",
						sp->who, scan->relation, shard->server->servername, why)));
		sp->shard_of[scan->index] = -1;
		appendStringInfo(&read_here, "%s%s", read_here.len > 0 ? ", " : "", scan->relation);
		if (fallbacks != NULL)
			knn_shard_add_fallback(fallbacks, shard->server->servername, scan->relation, why);
	}
	shard->scans = kept;
	if (read_here.len == 0)
		return;
	/* EXPLAIN's "Servers Read Here: shard1 (items_1, items_3)" */
	sp->read_here = psprintf("%s%s%s (%s)", sp->read_here ? sp->read_here : "",
							 sp->read_here ? ", " : "", shard->server->servername, read_here.data);
}
