/*
 * knn_gpu.c -- module entry: PG_MODULE_MAGIC and what happens when the
 * library is loaded.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"

#include "knn_admission.h"
#include "knn_engine.h"
#include "knn_join_function_scan.h"
#include "knn_progress.h"
#include "knn_scan.h"
#include "knn_settings.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

void
_PG_init(void)
{
	knn_settings_define();

	/* The GPU module (knn_gpu_cuda.so) is installed beside this library. */
	knn_engine_set_module_dir(pkglib_path);
	/* One GPU probe per server run, not per session (knn_admission.c). */
	knn_admission_setup_probe_record();

	knn_scan_register();
	knn_join_function_scan_register();
	knn_progress_init();
}
