/*
 * knn_role_visibility.h -- who may see what a role's join shows of itself:
 * a running join's progress (knn_gpu_progress), the statistics a finished
 * join leaves in its backend (knn_gpu_last_stats(),
 * knn_gpu_last_shard_stats()).
 *
 * PostgreSQL's own rule for pg_stat_activity's query text: the current
 * role sees a join of a role whose privileges it has (its own, a role it
 * is a member of; a superuser has every role's), and every join where it
 * has pg_read_all_stats' privileges. The current role, not the session's:
 * after SET ROLE, inside a SECURITY DEFINER function, or on a connection
 * that a pooler hands from one role to the next, what the previous role's
 * joins left behind is not the new one's to see.
 */
#ifndef KNN_ROLE_VISIBILITY_H
#define KNN_ROLE_VISIBILITY_H

#include "postgres.h"

#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/acl.h"

/* May the current role see a join that role `joined_as` ran? (Catalog access: in a transaction.) */
static inline bool
knn_role_may_see_join_of(Oid joined_as)
{
	return has_privs_of_role(GetUserId(), joined_as) ||
		has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS);
}

#endif							/* KNN_ROLE_VISIBILITY_H */
