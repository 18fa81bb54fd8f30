# knn_gpu -- PGXS build.
#   make                 build knn_gpu.so (+ knn_gpu_cuda.so when nvcc is found)
#   make install         install into the server that pg_config names
#   make installcheck    pg_regress suite against a running server
#   make installcheck-pgvector   the tests against the real pgvector (installed
#                        first: ../shared/pgvector/build.sh), same server
#   make unittest        engine unit tests (GoogleTest, CPU)
#   make gputest         GPU engine tests (skip with a message without a GPU)
#   make bench/knn_bench engine benchmark (bench/run_bench.sh runs it)
# Options: CUDA=auto|0|1, NVCC=..., CUDA_HOME=..., GENCODE="-gencode ...".

EXTENSION = knn_gpu
MODULE_big = knn_gpu
PGFILEDESC = "knn_gpu - exact k-nearest-neighbour joins on the GPU"

EXT_SRCS = $(sort $(wildcard extension/*.c))
# kernels/*.cpp: the job layer and the vocabulary (knn_vocabulary.h).
ENGINE_SRCS = $(sort $(wildcard kernels/*.cpp kernels/cpu/*.cpp))
VOCABULARY_OBJ = kernels/knn_vocabulary.o
OBJS = $(EXT_SRCS:.c=.o) $(ENGINE_SRCS:.cpp=.o)

# The install script of the current version is assembled from one file per
# concept. A released version's script, and the upgrade script into it, are
# kept as they were shipped (extension/sql/history/) so that ALTER EXTENSION
# ... UPDATE can start from any of them; the upgrade script into the current
# version is the parts added since the last release, after the statements
# that change what that release had (extension/sql/upgrade/).
EXTVERSION = 0.3
SQL_PARTS = $(sort $(wildcard extension/sql/*.sql))
PARTS_OF_0_2 = $(addprefix extension/sql/,10_vector.sql 12_halfvec.sql 14_bit.sql 16_vector_functions.sql \
	20_knn_join.sql 22_knn_join_interface.sql 30_knn_range_join.sql 34_knn_shard.sql)
UPGRADE_0_2_PARTS = extension/sql/upgrade/0.2--0.3.sql $(filter-out $(PARTS_OF_0_2),$(SQL_PARTS))
DATA_built = knn_gpu--$(EXTVERSION).sql knn_gpu--0.2--0.3.sql
DATA = $(wildcard extension/sql/history/*.sql)

REGRESS = $(basename $(notdir $(sort $(wildcard sql/*.sql))))
REGRESS_OPTS = --inputdir=. --outputdir=. --load-extension=$(EXTENSION)

PG_CPPFLAGS = -I$(CURDIR)/kernels -ffp-contract=off
SHLIB_LINK = -lstdc++ -lpthread -ldl
EXTRA_CLEAN = $(CUDA_MODULE) kernels/cuda/*.o test/engine_test test/gpu_engine_test test/group_engine_test test/range_engine_test test/context_permit_test \
	test/gpu_first_use_test test/gpu_bit_test test/gpu_multi_test test/gpu_range_test test/gpu_group_test test/gpu_context_test test/gpu_float16_test test/gpu_service_test bench/group_bench \
	test/module_interface_test test/output_prefault_test test/fake_module_none test/fake_module_other test/fake_module_same \
	test/*.o bench/knn_bench regression.diffs regression.out results

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
# Debian's PGXS would build LLVM bitcode for every object; .cpp/.cu have no such rule.
override with_llvm = no
ifneq ($(PGXS),)
include $(PGXS)
else
# No PostgreSQL here (a bare GPU host): only the engine, its tests and benchmarks build.
DLSUFFIX = .so
all:
endif

CXX ?= g++
ENGINE_CXXFLAGS = -std=c++17 -O3 -fPIC -pthread -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -I$(CURDIR)/kernels

# Headers as dependencies, so that an edit rebuilds what includes it.
ENGINE_HEADERS = $(wildcard kernels/*.h kernels/cpu/*.h)
CUDA_HEADERS = $(wildcard kernels/*.h kernels/cuda/*.h kernels/cuda/*.cuh)

kernels/%.o: kernels/%.cpp $(ENGINE_HEADERS)
	$(CXX) $(ENGINE_CXXFLAGS) -c -o $@ $<

$(EXT_SRCS:.c=.o): $(wildcard extension/*.h) kernels/knn_engine.h kernels/knn_vocabulary.h

knn_gpu--$(EXTVERSION).sql: $(SQL_PARTS)
	cat $(SQL_PARTS) > $@

knn_gpu--0.2--0.3.sql: $(UPGRADE_0_2_PARTS)
	cat $(UPGRADE_0_2_PARTS) > $@

# ---- CUDA engine module (dlopen'ed by knn_gpu.so) ----
CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
# Exact results rest on these: no contraction into FMA (--fmad=false,
# -ffp-contract=off: distances are summed as the CPU engine sums them), and
# IEEE division, square roots and subnormals (never --use_fast_math,
# -ftz=true or -prec-*=false: the smallest terms of the TI join's rounding
# margins and of the GEMM filters' bounds are subnormal floats).
NVCCFLAGS = -std=c++17 -O3 --fmad=false -Xcompiler -fPIC,-ffp-contract=off,-pthread \
	-I$(CURDIR)/kernels $(GENCODE)
CUDA_SRCS = $(sort $(wildcard kernels/cuda/*.cu))
CUDA_OBJS = $(CUDA_SRCS:.cu=.o)
CUDA_MODULE = knn_gpu_cuda$(DLSUFFIX)

ifeq ($(CUDA),auto)
BUILD_CUDA = $(if $(NVCC),1,0)
else
BUILD_CUDA = $(CUDA)
endif

ifeq ($(BUILD_CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found; set NVCC or CUDA_HOME)
endif
all: $(CUDA_MODULE)
install: install-cuda
endif

kernels/cuda/%.o: kernels/cuda/%.cu $(CUDA_HEADERS)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# The module carries its own copies of the vocabulary and of the result
# pages' prefault (output_prefault.h): it must not depend on knn_gpu.so.
$(CUDA_MODULE): $(CUDA_OBJS) $(VOCABULARY_OBJ) kernels/output_prefault.o
	$(NVCC) -shared $(GENCODE) -o $@ $^ -cudart static -L$(CUDA_HOME)/lib64 -lcublas

install-cuda: $(CUDA_MODULE)
	$(INSTALL_SHLIB) $(CUDA_MODULE) '$(DESTDIR)$(pkglibdir)/'

uninstall: uninstall-cuda
uninstall-cuda:
	rm -f '$(DESTDIR)$(pkglibdir)/$(CUDA_MODULE)'

# ---- engine tests (no PostgreSQL) ----
GTEST_LIBS = -lgtest -lgtest_main -lpthread -ldl
ENGINE_OBJS = $(ENGINE_SRCS:.cpp=.o)

test/%.o: test/%.cpp $(ENGINE_HEADERS) $(wildcard kernels/cuda/*.h test/*.h)
	$(CXX) $(ENGINE_CXXFLAGS) -c -o $@ $<

test/engine_test: test/engine_test.o $(ENGINE_OBJS)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

test/gpu_engine_test: test/gpu_engine_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_engine_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

# Its own binary: its first test needs a process that has not used the GPU.
test/gpu_first_use_test: test/gpu_first_use_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_first_use_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

# Its own binary: it needs a process without a GPU runtime.
test/gpu_context_test: test/gpu_context_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_context_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

test/gpu_bit_test: test/gpu_bit_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_bit_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

test/gpu_multi_test: test/gpu_multi_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_multi_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

test/gpu_range_test: test/gpu_range_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_range_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

test/gpu_float16_test: test/gpu_float16_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_float16_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

test/gpu_group_test: test/gpu_group_test.o $(ENGINE_OBJS) $(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) -o $@ test/gpu_group_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

test/group_engine_test: test/group_engine_test.o $(ENGINE_OBJS)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

test/range_engine_test: test/range_engine_test.o $(ENGINE_OBJS)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

test/context_permit_test: test/context_permit_test.o $(ENGINE_OBJS)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

test/gpu_service_test: test/gpu_service_test.o $(ENGINE_OBJS)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

test/output_prefault_test: test/output_prefault_test.o $(ENGINE_OBJS)
	$(CXX) -o $@ $^ $(GTEST_LIBS)

# Stand-ins for knn_gpu_cuda.so: without the interface entry, of another
# build, of this one (test/fake_cuda_module.cpp).
FAKE_INTERFACE_none = 0
FAKE_INTERFACE_other = 1
FAKE_INTERFACE_same = 2
FAKE_MODULES = $(foreach v,none other same,test/fake_module_$(v)/knn_gpu_cuda.so)
test/fake_module_%/knn_gpu_cuda.so: test/fake_cuda_module.cpp $(ENGINE_HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(ENGINE_CXXFLAGS) -shared -DFAKE_INTERFACE=$(FAKE_INTERFACE_$*) -o $@ $<

test/module_interface_test: test/module_interface_test.o $(ENGINE_OBJS) $(FAKE_MODULES)
	$(CXX) -o $@ test/module_interface_test.o $(ENGINE_OBJS) $(GTEST_LIBS)

unittest: test/engine_test test/group_engine_test test/range_engine_test test/context_permit_test test/gpu_service_test test/module_interface_test \
		test/output_prefault_test
	test/engine_test
	test/group_engine_test
	test/range_engine_test
	test/context_permit_test
	test/gpu_service_test
	test/module_interface_test
	test/output_prefault_test

# Run from the repository root, where the test finds ./knn_gpu_cuda.so.
gputest: test/gpu_engine_test test/gpu_first_use_test test/gpu_bit_test test/gpu_multi_test test/gpu_range_test test/gpu_group_test test/gpu_context_test \
		test/gpu_float16_test
	cd $(CURDIR) && test/gpu_engine_test
	cd $(CURDIR) && test/gpu_first_use_test
	cd $(CURDIR) && test/gpu_bit_test
	cd $(CURDIR) && test/gpu_multi_test
	cd $(CURDIR) && test/gpu_range_test
	cd $(CURDIR) && test/gpu_group_test
	cd $(CURDIR) && test/gpu_context_test
	cd $(CURDIR) && test/gpu_float16_test

# Benchmark runner (engine only); bench/run_bench.sh prepares data and runs it.
bench/knn_bench: bench/knn_bench.cpp $(ENGINE_OBJS) $(ENGINE_HEADERS) \
		$(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) $(ENGINE_CXXFLAGS) -o $@ bench/knn_bench.cpp $(ENGINE_OBJS) -lpthread -ldl

# Per-group joins: one grouped GPU call against one call per group and the CPU.
bench/group_bench: bench/group_bench.cpp $(ENGINE_OBJS) $(ENGINE_HEADERS) \
		$(if $(filter 1,$(BUILD_CUDA)),$(CUDA_MODULE))
	$(CXX) $(ENGINE_CXXFLAGS) -o $@ bench/group_bench.cpp $(ENGINE_OBJS) -lpthread -ldl

# test/pgvector/: its own database, as the tests create both extensions.
installcheck-pgvector:
	$(pg_regress_installcheck) --inputdir=test/pgvector --outputdir=test/pgvector \
		--dbname=knn_pgvector_regression knn_pgvector knn_pgvector_second knn_pgvector_values knn_pgvector_range_cap knn_pgvector_functions knn_pgvector_halfvec knn_pgvector_sparsevec knn_pgvector_corner_values

.PHONY: unittest gputest installcheck-pgvector install-cuda uninstall-cuda
