/*
 * knn_join_params.c -- knn_join's bind parameters (knn_join_params.h).
 *
 * The text is analysed once with variable parameters to learn each $n's
 * type, then prepared through SPI with those types, so that the plan, its
 * checks (a plain SELECT) and the cursor are the same as without
 * parameters. Values stay values: nothing is pasted into the SQL text.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "parser/analyze.h"
#include "parser/parse_param.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "knn_join_params.h"

void
knn_join_params_read(ArrayType *array, KnnJoinParams *params)
{
	Datum	   *elements;
	bool	   *nulls;
	int			n;

	memset(params, 0, sizeof(*params));
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("knn_join: params must be a one-dimensional array, not %d dimensions",
						ARR_NDIM(array))));
	/* element i is $i: an array of other bounds would be renumbered silently */
	if (ARR_NDIM(array) == 1 && ARR_LBOUND(array)[0] != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("knn_join: params must start at element 1 (element n is $n), not %d",
						ARR_LBOUND(array)[0])));
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elements, &nulls, &n);
	params->n = n;
	params->texts = palloc0(Max(1, n) * sizeof(char *));
	for (int i = 0; i < n; i++)
		params->texts[i] = nulls[i] ? NULL : TextDatumGetCString(elements[i]);
}

/* Where parse analysis leaves the types it infers for $1 .. $n. */
typedef struct VariableParams
{
	Oid		  **types;
	int		   *n_types;
} VariableParams;

/*
 * PREPARE's inference, without its check that every $n got a type: each
 * text uses some of the values only, and a value whose use implies no
 * type is text, as an untyped literal would be.
 */
static void
setup_variable_params(ParseState *pstate, void *arg)
{
	VariableParams *state = (VariableParams *) arg;

	setup_parse_variable_parameters(pstate, state->types, state->n_types);
}

List *
knn_join_params_analyze(RawStmt *raw, const char *sql, Oid **types, int *n_types)
{
	VariableParams state = {types, n_types};

	return pg_analyze_and_rewrite_withcb(raw, sql, setup_variable_params, &state, NULL);
}

/*
 * An error's position in the text is a position in the text, not in the
 * statement that called knn_join (as SPI reports it for texts it parses).
 */
static void
text_error_callback(void *arg)
{
	int			position = geterrposition();

	if (position <= 0)
		return;
	errposition(0);
	internalerrposition(position);
	internalerrquery((const char *) arg);
}

SPIPlanPtr
knn_join_params_prepare(const char *sql, const char *arg, const KnnJoinParams *params,
						Datum **values, char **nulls)
{
	List	   *raw;
	Oid		   *types = NULL;
	int			n_types = 0;
	SPIPlanPtr	plan;
	ErrorContextCallback text_context;

	text_context.callback = text_error_callback;
	text_context.arg = unconstify(char *, sql);
	text_context.previous = error_context_stack;
	error_context_stack = &text_context;
	raw = pg_parse_query(sql);
	if (list_length(raw) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("%s must be a single SELECT statement, not %d statements",
						arg, list_length(raw))));
	(void) knn_join_params_analyze(linitial_node(RawStmt, raw), sql, &types, &n_types);
	error_context_stack = text_context.previous;
	if (n_types > params->n)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_PARAMETER),
				 errmsg("%s uses $%d but params has %d value%s", arg, n_types, params->n,
						params->n == 1 ? "" : "s")));
	*values = palloc0(Max(1, n_types) * sizeof(Datum));
	*nulls = palloc(Max(1, n_types) + 1);
	memset(*nulls, ' ', Max(1, n_types));
	for (int i = 0; i < n_types; i++)
	{
		Oid			input;
		Oid			ioparam;

		/* A $n the text skips takes no part: any type will do. */
		if (!OidIsValid(types[i]) || types[i] == UNKNOWNOID)
			types[i] = TEXTOID;
		if (params->texts[i] == NULL)
		{
			(*nulls)[i] = 'n';
			continue;
		}
		getTypeInputInfo(types[i], &input, &ioparam);
		(*values)[i] = OidInputFunctionCall(input, params->texts[i], ioparam, -1);
	}
	plan = SPI_prepare(sql, n_types, types);
	if (plan == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("could not prepare %s: %s", arg, SPI_result_code_string(SPI_result))));
	return plan;
}
