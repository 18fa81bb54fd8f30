/*
 * knn_catalog.h -- what a type, an operator or an index access method is,
 * decided by catalog identity, never by name.
 *
 * A vector (halfvec) type is knn_gpu's own or pgvector's: a varlena type
 * that belongs to the extension knn_gpu or vector (pg_depend) and whose
 * input function is that extension's C function for vectors (halfvecs).
 * bit and bit varying are PostgreSQL's own (fixed OIDs). A distance operator is one whose
 * function is one of those extensions' C distance functions over such a
 * type (for bit: pgvector's or knn_gpu's hamming and jaccard distances). An approximate index is one whose access method belongs to pgvector.
 * Anything a user creates, under whatever name, is none of these.
 */
#ifndef KNN_CATALOG_H
#define KNN_CATALOG_H

#include "postgres.h"

#include "knn_engine.h"

/* The column types whose values can be joined. */
typedef enum KnnVectorKind
{
	KNN_VECTOR_UNSUPPORTED = 0,
	KNN_VECTOR_TYPE,			/* knn_gpu's or pgvector's vector (one layout) */
	KNN_VECTOR_FLOAT4_ARRAY,	/* real[] */
	KNN_VECTOR_FLOAT8_ARRAY,	/* double precision[] */
	KNN_VECTOR_HALFVEC,			/* knn_gpu's or pgvector's halfvec (one layout) */
	KNN_VECTOR_BIT				/* PostgreSQL's bit or bit varying */
} KnnVectorKind;

/* The kind of a type (a domain counts as its base type). */
extern KnnVectorKind knn_vector_kind(Oid typid);

/*
 * KNN_VECTOR_TYPE or KNN_VECTOR_HALFVEC when typid (no domain) is knn_gpu's
 * or pgvector's vector (halfvec) and its binary receive function is still
 * that extension's own C receive function for it, so that its send form is
 * read as that function reads it; else KNN_VECTOR_UNSUPPORTED.
 */
extern KnnVectorKind knn_vector_known_receive_kind(Oid typid);

/*
 * Is opno a distance operator of knn_gpu or pgvector between two values of
 * one joinable type (vector, halfvec, bit)? Then *metric says which distance
 * it computes.
 */
extern bool knn_distance_operator_metric(Oid opno, KnnMetric *metric);

/*
 * pgvector's own function computing `metric` between two values of typid,
 * when typid is pgvector's vector or halfvec (a domain counts as its base
 * type); else InvalidOid. Found among pgvector's members by symbol and
 * argument types, never by name.
 */
extern Oid knn_pgvector_distance_function(Oid typid, KnnMetric metric);

/*
 * What a distance operator is, in terms another server's catalog can be
 * searched by (knn_shard_remote_operator): its name, the extension and C
 * symbol of its function with that extension's version, and its operands'
 * type: bit (PostgreSQL's own), or a type of type_extension whose input
 * function is type_input.
 */
typedef struct KnnOperatorIdentity
{
	char	   *name;			/* "<->" */
	char	   *extension;		/* "knn_gpu" or "vector" */
	char	   *version;		/* its extversion here */
	char	   *symbol;			/* the operator's C function */
	Oid			operand_type;	/* here */
	char	   *type_extension; /* NULL: PostgreSQL's bit */
	char	   *type_input;		/* the type's input function's C symbol */
} KnnOperatorIdentity;

/* Fills *identity for a distance operator (knn_distance_operator_metric); false otherwise. */
extern bool knn_distance_operator_identity(Oid opno, KnnOperatorIdentity *identity);

/* An extension's installed version here, or NULL. */
extern char *knn_extension_version(const char *extension);

/* Is amoid one of pgvector's (approximate) index access methods? */
extern bool knn_is_approximate_index_am(Oid amoid);

/* The C symbol of funcoid when it is a C function of knn_gpu, else NULL (palloc'd). */
extern char *knn_gpu_function_symbol(Oid funcoid);

#endif							/* KNN_CATALOG_H */
