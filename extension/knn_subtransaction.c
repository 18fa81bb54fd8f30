/*
 * knn_subtransaction.c -- a step whose failure is not the statement's
 * (knn_subtransaction.h).
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/resowner.h"

#include "knn_subtransaction.h"

bool
knn_try_in_subtransaction(void (*step) (void *arg), void *arg, char **message)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	bool		ok = true;

	if (message != NULL)
		*message = NULL;
	if (IsInParallelMode())
		return false;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		step(arg);
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
		if (error->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(error);
		if (message != NULL)
			*message = pstrdup(error->message);
		FreeErrorData(error);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(context);
	CurrentResourceOwner = owner;
	return ok;
}
