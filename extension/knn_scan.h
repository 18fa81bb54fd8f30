/*
 * knn_scan.h -- the KNN Join custom scan: plans pgvector-style
 * LATERAL ... ORDER BY distance LIMIT k joins as one batched join.
 */
#ifndef KNN_SCAN_H
#define KNN_SCAN_H

/* Registers the custom scan methods and planner hook; called from _PG_init. */
extern void knn_scan_register(void);

#endif							/* KNN_SCAN_H */
