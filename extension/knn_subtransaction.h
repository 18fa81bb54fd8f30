/*
 * knn_subtransaction.h -- running a step whose failure is not the
 * statement's: a row estimate of a query text (knn_join_support.c), the
 * shards a knn_join call would use for plain EXPLAIN (knn_join_function_scan.c).
 */
#ifndef KNN_SUBTRANSACTION_H
#define KNN_SUBTRANSACTION_H

#include "postgres.h"

/*
 * Runs step(arg) in a subtransaction that is always rolled back (nothing
 * of it is kept, its locks are given back). Returns true when it ended
 * without an error; else false with the error's message in *message (may
 * be NULL), except that a cancel is passed on. False, without running
 * it, in parallel mode (no subtransaction can start there).
 */
extern bool knn_try_in_subtransaction(void (*step) (void *arg), void *arg, char **message);

#endif							/* KNN_SUBTRANSACTION_H */
