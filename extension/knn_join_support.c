/*
 * knn_join_support.c -- the planner support function of knn_join(): its
 * row estimate, |Q| x min(k, |T|), from the planner's own estimates of the
 * two query texts, instead of a fixed ROWS 1000 (for every form of
 * knn_join: queries, targets and k come first in each).
 *
 * The texts are planned in a subtransaction, rolled back once the estimate
 * is read: a text that does not plan (a syntax error, a missing table)
 * leaves the default estimate, and the error comes, as before, when
 * knn_join runs. Only a cancel is passed on. Estimates do not nest: a
 * text whose planning reaches knn_join() again gets the default there.
 *
 * A text over a relation (or column) the caller may not read gets the
 * default too: its estimate comes from the relation's statistics (for
 * "WHERE salary = 9000", the exact count of such rows), which PostgreSQL
 * shows neither in pg_stats nor through EXPLAIN to such a caller.
 */
#include "postgres.h"

#include "executor/executor.h"
#include "fmgr.h"
#include "nodes/supportnodes.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "knn_join_params.h"
#include "knn_subtransaction.h"

/* The planner's row estimate of one plain SELECT text, or -1. */
static double
planned_rows(const char *sql)
{
	List	   *raw;
	List	   *queries;
	Query	   *query;
	PlannedStmt *plan;
	Oid		   *param_types = NULL;
	int			n_params = 0;

	raw = pg_parse_query(sql);
	if (list_length(raw) != 1)
		return -1;
	/* $1, $2, ... (the params argument) are planned as unknown values. */
	queries = knn_join_params_analyze(linitial_node(RawStmt, raw), sql, &param_types,
									  &n_params);
	if (list_length(queries) != 1)
		return -1;
	query = linitial_node(Query, queries);
	if (query->commandType != CMD_SELECT || query->utilityStmt != NULL ||
		query->hasModifyingCTE || query->rowMarks != NIL)
		return -1;
	plan = pg_plan_query(query, sql, 0, NULL);
	/* the executor's check of the caller's rights, without its ERROR */
	if (!ExecCheckRTPerms(plan->rtable, false))
		return -1;
	return plan->planTree->plan_rows;
}

/* One text's estimate, for knn_try_in_subtransaction. */
typedef struct Estimate
{
	const char *sql;
	double		rows;
} Estimate;

static void
estimate_step(void *arg)
{
	Estimate   *estimate = (Estimate *) arg;

	estimate->rows = planned_rows(estimate->sql);
}

/*
 * Estimates under way in this backend: a text whose planning reaches
 * knn_join() again (a view or function over itself) gets the default
 * estimate there, instead of planning two texts more at every level.
 */
static int	estimates_running = 0;

/*
 * planned_rows() in a subtransaction: -1 for any error but a cancel, and
 * inside another estimate. The planning's memory goes with it (a rollback
 * does not free what it allocated in the caller's context).
 */
static double
estimate_rows(const char *sql)
{
	Estimate	estimate = {sql, -1};
	MemoryContext planning;
	MemoryContext old;
	volatile bool ok = false;

	if (estimates_running > 0)
		return -1;
	planning = AllocSetContextCreate(CurrentMemoryContext, "knn_join row estimate",
									 ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(planning);
	estimates_running++;
	PG_TRY();
	{
		ok = knn_try_in_subtransaction(estimate_step, &estimate, NULL);
	}
	PG_FINALLY();
	{
		estimates_running--;
		MemoryContextSwitchTo(old);
		MemoryContextDelete(planning);
	}
	PG_END_TRY();
	return ok ? estimate.rows : -1;
}

/* The text of a constant, non-null text argument, or NULL. */
static char *
constant_text(Node *arg)
{
	if (arg == NULL || !IsA(arg, Const) || ((Const *) arg)->constisnull)
		return NULL;
	return TextDatumGetCString(((Const *) arg)->constvalue);
}

PG_FUNCTION_INFO_V1(knn_join_support);
Datum
knn_join_support(PG_FUNCTION_ARGS)
{
	Node	   *request = (Node *) PG_GETARG_POINTER(0);
	SupportRequestRows *rows_request;
	FuncExpr   *call;
	char	   *queries;
	char	   *targets;
	Node	   *k;
	double		n_queries;
	double		n_targets;

	if (!IsA(request, SupportRequestRows))
		PG_RETURN_POINTER(NULL);
	rows_request = (SupportRequestRows *) request;
	if (!IsA(rows_request->node, FuncExpr))
		PG_RETURN_POINTER(NULL);
	call = (FuncExpr *) rows_request->node;
	if (list_length(call->args) < 3)
		PG_RETURN_POINTER(NULL);
	queries = constant_text(linitial(call->args));
	targets = constant_text(lsecond(call->args));
	k = lthird(call->args);
	if (queries == NULL || targets == NULL || !IsA(k, Const) || ((Const *) k)->constisnull ||
		DatumGetInt32(((Const *) k)->constvalue) < 1)
		PG_RETURN_POINTER(NULL);

	n_queries = estimate_rows(queries);
	n_targets = strcmp(queries, targets) == 0 ? n_queries : estimate_rows(targets);
	if (n_queries < 0 || n_targets < 0)
		PG_RETURN_POINTER(NULL);
	rows_request->rows = Max(1.0, n_queries * Min((double) DatumGetInt32(((Const *) k)->constvalue),
												  n_targets));
	PG_RETURN_POINTER(rows_request);
}
