/*
 * knn_catalog.c -- catalog identity of vector types, distance operators and
 * approximate index access methods (see knn_catalog.h).
 *
 * An extension's name is trustworthy where an object's name is not:
 * CREATE EXTENSION needs a control file on the server, and only an
 * extension's owner can add objects to it, while any user can create a
 * type or an operator called "vector" or "<->" in a schema of their own.
 * A C function's symbol (prosrc) is trustworthy once the function belongs
 * to such an extension: only a superuser creates C functions.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_am.h"
#include "catalog/dependency.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_language.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "knn_catalog.h"

#define KNN_GPU_EXTENSION "knn_gpu"
#define PGVECTOR_EXTENSION "vector"

/* A C function of an extension, by its symbol. */
typedef struct KnownFunction
{
	const char *extension;
	const char *symbol;
	int			value;			/* what it means to the caller */
} KnownFunction;

/* The input functions of the vector types, and the kind they make. */
static const KnownFunction vector_input_functions[] = {
	{KNN_GPU_EXTENSION, "knn_vector_in", KNN_VECTOR_TYPE},
	{PGVECTOR_EXTENSION, "vector_in", KNN_VECTOR_TYPE},
	{KNN_GPU_EXTENSION, "knn_halfvec_in", KNN_VECTOR_HALFVEC},
	{PGVECTOR_EXTENSION, "halfvec_in", KNN_VECTOR_HALFVEC},
};

/* The distance functions of each kind of operand, and their metrics. */
static const KnownFunction distance_functions[] = {
	{KNN_GPU_EXTENSION, "knn_vector_l2_distance", KNN_METRIC_L2},
	{KNN_GPU_EXTENSION, "knn_vector_cosine_distance", KNN_METRIC_COSINE},
	{KNN_GPU_EXTENSION, "knn_vector_negative_inner_product", KNN_METRIC_IP},
	{KNN_GPU_EXTENSION, "knn_vector_l1_distance", KNN_METRIC_L1},
	{PGVECTOR_EXTENSION, "l2_distance", KNN_METRIC_L2},
	{PGVECTOR_EXTENSION, "cosine_distance", KNN_METRIC_COSINE},
	{PGVECTOR_EXTENSION, "vector_negative_inner_product", KNN_METRIC_IP},
	{PGVECTOR_EXTENSION, "l1_distance", KNN_METRIC_L1},
};

static const KnownFunction halfvec_distance_functions[] = {
	{KNN_GPU_EXTENSION, "knn_halfvec_l2_distance", KNN_METRIC_L2},
	{KNN_GPU_EXTENSION, "knn_halfvec_cosine_distance", KNN_METRIC_COSINE},
	{KNN_GPU_EXTENSION, "knn_halfvec_negative_inner_product", KNN_METRIC_IP},
	{KNN_GPU_EXTENSION, "knn_halfvec_l1_distance", KNN_METRIC_L1},
	{PGVECTOR_EXTENSION, "halfvec_l2_distance", KNN_METRIC_L2},
	{PGVECTOR_EXTENSION, "halfvec_cosine_distance", KNN_METRIC_COSINE},
	{PGVECTOR_EXTENSION, "halfvec_negative_inner_product", KNN_METRIC_IP},
	{PGVECTOR_EXTENSION, "halfvec_l1_distance", KNN_METRIC_L1},
};

static const KnownFunction bit_distance_functions[] = {
	{KNN_GPU_EXTENSION, "knn_bit_hamming_distance", KNN_METRIC_HAMMING},
	{KNN_GPU_EXTENSION, "knn_bit_jaccard_distance", KNN_METRIC_JACCARD},
	{PGVECTOR_EXTENSION, "hamming_distance", KNN_METRIC_HAMMING},
	{PGVECTOR_EXTENSION, "jaccard_distance", KNN_METRIC_JACCARD},
};

/* The name of the extension an object belongs to, or NULL. */
static char *
owning_extension(Oid classid, Oid objid)
{
	Oid			extension = getExtensionOfObject(classid, objid);

	return OidIsValid(extension) ? get_extension_name(extension) : NULL;
}

/*
 * Does the object belong to that extension? (The name looked up is freed:
 * a node calls this on each of its executions, in the query's memory.)
 */
static bool
belongs_to(Oid classid, Oid objid, const char *extension)
{
	char	   *owner = owning_extension(classid, objid);
	bool		belongs = owner != NULL && strcmp(owner, extension) == 0;

	if (owner != NULL)
		pfree(owner);
	return belongs;
}

/* The C symbol of a function, or NULL (not C). */
static char *
c_symbol(Oid funcoid)
{
	HeapTuple	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcoid));
	char	   *symbol = NULL;

	if (!HeapTupleIsValid(tuple))
		return NULL;
	if (((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		src = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_prosrc, &isnull);

		if (!isnull)
			symbol = TextDatumGetCString(src);
	}
	ReleaseSysCache(tuple);
	return symbol;
}

/*
 * The entry of `known` that funcoid is (a C function of that extension with
 * that symbol), or NULL.
 */
static const KnownFunction *
identify_function(Oid funcoid, const KnownFunction *known, int n_known)
{
	char	   *symbol = c_symbol(funcoid);
	char	   *extension = NULL;
	const KnownFunction *found = NULL;

	if (symbol == NULL)
		return NULL;

	/* The symbol first: the pg_depend scan only for a known one. */
	for (int i = 0; i < n_known; i++)
	{
		if (strcmp(known[i].symbol, symbol) != 0)
			continue;
		if (extension == NULL)
			extension = owning_extension(ProcedureRelationId, funcoid);
		if (extension != NULL && strcmp(known[i].extension, extension) == 0)
		{
			found = &known[i];
			break;
		}
	}
	pfree(symbol);
	if (extension != NULL)
		pfree(extension);
	return found;
}

char *
knn_gpu_function_symbol(Oid funcoid)
{
	char	   *symbol = c_symbol(funcoid);

	if (symbol == NULL)
		return NULL;
	if (!belongs_to(ProcedureRelationId, funcoid, KNN_GPU_EXTENSION))
	{
		pfree(symbol);
		return NULL;
	}
	return symbol;
}

/*
 * The kind of typid (no domain) when it is the vector or halfvec type of
 * knn_gpu or of pgvector, else KNN_VECTOR_UNSUPPORTED.
 */
static KnnVectorKind
extension_vector_kind(Oid typid)
{
	HeapTuple	tuple;
	Oid			input;
	const KnownFunction *known;
	bool		varlena;

	tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	if (!HeapTupleIsValid(tuple))
		return KNN_VECTOR_UNSUPPORTED;
	varlena = ((Form_pg_type) GETSTRUCT(tuple))->typlen == -1 &&
		((Form_pg_type) GETSTRUCT(tuple))->typtype == TYPTYPE_BASE;
	input = ((Form_pg_type) GETSTRUCT(tuple))->typinput;
	ReleaseSysCache(tuple);
	if (!varlena)
		return KNN_VECTOR_UNSUPPORTED;

	known = identify_function(input, vector_input_functions,
							  lengthof(vector_input_functions));
	if (known == NULL)
		return KNN_VECTOR_UNSUPPORTED;
	/* The type must belong to the extension whose input function it uses. */
	if (!belongs_to(TypeRelationId, typid, known->extension))
		return KNN_VECTOR_UNSUPPORTED;
	return (KnnVectorKind) known->value;
}

KnnVectorKind
knn_vector_kind(Oid typid)
{
	typid = getBaseType(typid);
	if (typid == FLOAT4ARRAYOID)
		return KNN_VECTOR_FLOAT4_ARRAY;
	if (typid == FLOAT8ARRAYOID)
		return KNN_VECTOR_FLOAT8_ARRAY;
	if (typid == BITOID || typid == VARBITOID)
		return KNN_VECTOR_BIT;
	return extension_vector_kind(typid);
}

bool
knn_distance_operator_metric(Oid opno, KnnMetric *metric)
{
	HeapTuple	tuple;
	Form_pg_operator op;
	Oid			function;
	Oid			left;
	Oid			right;
	const KnownFunction *known;
	KnnVectorKind kind;

	tuple = SearchSysCache1(OPEROID, ObjectIdGetDatum(opno));
	if (!HeapTupleIsValid(tuple))
		return false;
	op = (Form_pg_operator) GETSTRUCT(tuple);
	function = op->oprcode;
	left = op->oprleft;
	right = op->oprright;
	ReleaseSysCache(tuple);

	if (left != right)
		return false;
	/* bit operands are bit itself: a domain's operator is none of ours */
	kind = left == BITOID ? KNN_VECTOR_BIT : extension_vector_kind(left);
	switch (kind)
	{
		case KNN_VECTOR_TYPE:
			known = identify_function(function, distance_functions,
									  lengthof(distance_functions));
			break;
		case KNN_VECTOR_HALFVEC:
			known = identify_function(function, halfvec_distance_functions,
									  lengthof(halfvec_distance_functions));
			break;
		case KNN_VECTOR_BIT:
			known = identify_function(function, bit_distance_functions,
									  lengthof(bit_distance_functions));
			break;
		default:
			known = NULL;
			break;
	}
	if (known == NULL)
		return false;
	*metric = (KnnMetric) known->value;
	return true;
}

bool
knn_is_approximate_index_am(Oid amoid)
{
	return belongs_to(AccessMethodRelationId, amoid, PGVECTOR_EXTENSION);
}

/*
 * Is funcoid the C function `symbol` of extension extoid, taking two values
 * of typid and returning float8?
 */
static bool
is_distance_function(Oid funcoid, Oid typid, const char *symbol)
{
	HeapTuple	tuple;
	Form_pg_proc proc;
	bool		match = false;

	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcoid));
	if (!HeapTupleIsValid(tuple))
		return false;
	proc = (Form_pg_proc) GETSTRUCT(tuple);
	if (proc->prolang == ClanguageId && proc->pronargs == 2 &&
		proc->proargtypes.values[0] == typid && proc->proargtypes.values[1] == typid &&
		proc->prorettype == FLOAT8OID)
	{
		bool		isnull;
		Datum		src = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_prosrc, &isnull);

		if (!isnull)
		{
			char	   *source = TextDatumGetCString(src);

			match = strcmp(source, symbol) == 0;
			pfree(source);
		}
	}
	ReleaseSysCache(tuple);
	return match;
}

Oid
knn_pgvector_distance_function(Oid typid, KnnMetric metric)
{
	const KnownFunction *known;
	int			n_known;
	const char *symbol = NULL;
	Oid			extoid;
	Oid			found = InvalidOid;
	Relation	depend;
	ScanKeyData key[2];
	SysScanDesc scan;
	HeapTuple	tuple;

	typid = getBaseType(typid);
	switch (extension_vector_kind(typid))
	{
		case KNN_VECTOR_TYPE:
			known = distance_functions;
			n_known = lengthof(distance_functions);
			break;
		case KNN_VECTOR_HALFVEC:
			known = halfvec_distance_functions;
			n_known = lengthof(halfvec_distance_functions);
			break;
		default:
			return InvalidOid;
	}
	if (!belongs_to(TypeRelationId, typid, PGVECTOR_EXTENSION))
		return InvalidOid;
	for (int i = 0; i < n_known; i++)
		if (strcmp(known[i].extension, PGVECTOR_EXTENSION) == 0 && known[i].value == (int) metric)
			symbol = known[i].symbol;
	extoid = get_extension_oid(PGVECTOR_EXTENSION, true);
	if (symbol == NULL || !OidIsValid(extoid))
		return InvalidOid;

	/* pgvector's members, through pg_depend: never a lookup by name. */
	depend = table_open(DependRelationId, AccessShareLock);
	ScanKeyInit(&key[0], Anum_pg_depend_refclassid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ExtensionRelationId));
	ScanKeyInit(&key[1], Anum_pg_depend_refobjid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(depend, DependReferenceIndexId, true, NULL, 2, key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_depend dep = (Form_pg_depend) GETSTRUCT(tuple);

		if (dep->classid == ProcedureRelationId && dep->deptype == DEPENDENCY_EXTENSION &&
			is_distance_function(dep->objid, typid, symbol))
		{
			found = dep->objid;
			break;
		}
	}
	systable_endscan(scan);
	table_close(depend, AccessShareLock);
	return found;
}

char *
knn_extension_version(const char *extension)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = NULL;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum(extension));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		value = heap_getattr(tuple, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(value);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

bool
knn_distance_operator_identity(Oid opno, KnnOperatorIdentity *identity)
{
	KnnMetric	metric;
	HeapTuple	tuple;
	Oid			function;

	memset(identity, 0, sizeof(*identity));
	if (!knn_distance_operator_metric(opno, &metric))
		return false;
	tuple = SearchSysCache1(OPEROID, ObjectIdGetDatum(opno));
	if (!HeapTupleIsValid(tuple))
		return false;
	identity->name = pstrdup(NameStr(((Form_pg_operator) GETSTRUCT(tuple))->oprname));
	identity->operand_type = ((Form_pg_operator) GETSTRUCT(tuple))->oprleft;
	function = ((Form_pg_operator) GETSTRUCT(tuple))->oprcode;
	ReleaseSysCache(tuple);

	/* knn_distance_operator_metric found both to be an extension's C function and type */
	identity->symbol = c_symbol(function);
	identity->extension = owning_extension(ProcedureRelationId, function);
	if (identity->symbol == NULL || identity->extension == NULL)
		return false;
	identity->version = knn_extension_version(identity->extension);
	if (identity->operand_type != BITOID)
	{
		Oid			input;
		Oid			ioparam;

		getTypeInputInfo(identity->operand_type, &input, &ioparam);
		identity->type_extension = owning_extension(TypeRelationId, identity->operand_type);
		identity->type_input = c_symbol(input);
		if (identity->type_extension == NULL || identity->type_input == NULL)
			return false;
	}
	return identity->version != NULL;
}

/* The binary receive functions of the vector types, and the kind they read. */
static const KnownFunction vector_receive_functions[] = {
	{KNN_GPU_EXTENSION, "knn_vector_recv", KNN_VECTOR_TYPE},
	{PGVECTOR_EXTENSION, "vector_recv", KNN_VECTOR_TYPE},
	{KNN_GPU_EXTENSION, "knn_halfvec_recv", KNN_VECTOR_HALFVEC},
	{PGVECTOR_EXTENSION, "halfvec_recv", KNN_VECTOR_HALFVEC},
};

KnnVectorKind
knn_vector_known_receive_kind(Oid typid)
{
	KnnVectorKind kind = extension_vector_kind(typid);
	HeapTuple	tuple;
	Oid			receive;
	const KnownFunction *known;

	if (kind != KNN_VECTOR_TYPE && kind != KNN_VECTOR_HALFVEC)
		return KNN_VECTOR_UNSUPPORTED;
	tuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	if (!HeapTupleIsValid(tuple))
		return KNN_VECTOR_UNSUPPORTED;
	receive = ((Form_pg_type) GETSTRUCT(tuple))->typreceive;
	ReleaseSysCache(tuple);
	known = identify_function(receive, vector_receive_functions,
							  lengthof(vector_receive_functions));
	/* that extension's receive function for this kind, and the type is of the same extension */
	if (known == NULL || (KnnVectorKind) known->value != kind)
		return KNN_VECTOR_UNSUPPORTED;
	if (!belongs_to(TypeRelationId, typid, known->extension))
		return KNN_VECTOR_UNSUPPORTED;
	return kind;
}
