/*
 * vector_checks.h -- the validity rules of a vector value, shared by every
 * way a value is made (text input, binary receive, casts), so that all of
 * them reject the same things with the same SQLSTATEs and messages as
 * pgvector: 1..VECTOR_MAX_DIM dimensions, finite elements, and the
 * dimension a typmod vector(n) asks for.
 */
#ifndef KNN_VECTOR_CHECKS_H
#define KNN_VECTOR_CHECKS_H

#include "postgres.h"

#include "utils/array.h"

/* ERROR unless 1 <= dim <= VECTOR_MAX_DIM. */
extern void knn_vector_check_dim(int dim);

/* ERROR unless typmod is -1 (no modifier) or equals dim (any type's message). */
extern void knn_vector_check_typmod(int32 typmod, int dim);

/*
 * The typmod TYPE(n) of a type of dimensions (vector, halfvec, sparsevec):
 * one integer in 1..max_dim, with pgvector's messages naming type_name.
 */
extern int32 knn_dimensions_typmod(ArrayType *modifiers, const char *type_name, int max_dim);

/* ERROR for NaN or an infinity. */
extern void knn_vector_check_element(float value);

/*
 * The text form '[x1, x2, ...]' shared by vector and halfvec: parsed into
 * palloc'd floats, each vetted by check_element as it is read; errors name
 * type_name. Returns the values, *dim_out their count.
 */
/*
 * The elements of a 1-D array without NULLs (ERROR otherwise); NULL when
 * it has more than max_elements (not unpacked: the caller's dimension
 * check then refuses *n_out).
 */
extern Datum *knn_array_elements(ArrayType *array, int max_elements, int *n_out);

/* An int4, real, float8 or numeric array element rounded to float. */
extern float knn_array_element_to_float(Datum element, Oid element_type, const char *type_name);

typedef void (*KnnTextElementCheck) (float value, const char *number, int number_len);
extern float *knn_parse_vector_text(const char *literal, const char *type_name, int max_dim,
									KnnTextElementCheck check_element, int *dim_out);

#endif							/* KNN_VECTOR_CHECKS_H */
