# Piper in C. `make` builds bin/, `make test` runs the fast tests (lint, unit, the fast CLI
# checks of every program), `make test-long` the rest (CI runs both), `make asan` runs the unit
# and CLI tests under ASan+UBSan, `make bench` builds the benchmarks, `make install PREFIX=...` installs.
# Optional parts are detected and reported one line each; NO_MPI=1, NO_BLAS=1, NO_CUDA=1 opt
# out. CI=true never probes a GPU.

CC ?= cc
PREFIX ?= /usr/local
BUILD ?= build
BIN ?= bin
OPT ?= -O2
FUZZ_SECONDS ?= 8


WARN := -Wall -Wextra -Wpedantic -Werror
# Each object records the headers it includes (build/**/*.d, read below), so a header change
# rebuilds exactly its users; -MP keeps the build going when a header is deleted.
DEPFLAGS = -MMD -MP
CFLAGS_ALL := -std=c11 $(WARN) $(OPT) -g -D_GNU_SOURCE \
  $(shell pkg-config --cflags libcjson glib-2.0 cairo) $(EXTRA_CFLAGS)
LDLIBS_ALL := $(shell pkg-config --libs libcjson glib-2.0 cairo) -lm -lpthread

# --- optional parts -------------------------------------------------------------------------
# One line per part, printed once (not by recursive makes, not for print-* queries).
report = $(if $(filter print-%,$(MAKECMDGOALS)),,$(if $(filter 0,$(MAKELEVEL)),$(info $(1))))
ifeq ($(NO_MPI),)
  MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
  MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null)
endif
ifneq ($(MPI_LIBS),)
  CFLAGS_ALL += -DHAVE_MPI $(MPI_CFLAGS)
  LDLIBS_ALL += $(MPI_LIBS)
  $(call report,✓ MPI found: piper-exec runs multi-process plans)
else
  $(call report,✗ MPI skipped: piper-exec runs one-device plans only)
endif

ifeq ($(NO_BLAS),)
  BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null)
endif
ifneq ($(BLAS_LIBS),)
  CFLAGS_ALL += -DHAVE_BLAS $(shell pkg-config --cflags openblas)
  LDLIBS_ALL += $(BLAS_LIBS)
  $(call report,✓ OpenBLAS found: host GEMMs use cblas_sgemm)
else
  $(call report,✗ OpenBLAS skipped: host GEMMs use the reference loops)
endif

# The cuda backend (exec/backend_cuda*.c, kernels/*.cu): built when nvcc, NCCL and MPI are all
# here (MPI bootstraps NCCL). CUDA_ARCH lists the GPUs compiled for; the libraries are linked
# --as-needed, so only programs that run a backend load them.
comma := ,
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= sm_80 sm_90
ifeq ($(NO_CUDA)$(CUDA_EMU),)
  NVCC := $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
endif
HAVE_CUDA :=
ifneq ($(CUDA_EMU),)
  # The emulation (tests/gpu/emu/README.md, `make emu`): the same backend and kernels against
  # host stand-ins of the CUDA runtime, cuBLASLt and NCCL (over MPI); no GPU, no nvcc.
  ifeq ($(MPI_LIBS),)
    $(error CUDA_EMU needs MPI, as the cuda backend does)
  endif
  HAVE_CUDA := 1
  CFLAGS_ALL += -DHAVE_CUDA -DPIPER_CUDA_EMU -Itests/gpu/emu/include
  LDLIBS_ALL += -lstdc++
else ifeq ($(NVCC),)
  $(call report,✗ cuda backend skipped: $(if $(NO_CUDA),NO_CUDA=1,no nvcc on PATH or in $(CUDA_HOME)/bin))
else ifeq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
  $(call report,✗ cuda backend skipped: nvcc found but no nccl.h under $(CUDA_HOME)/include)
else ifeq ($(MPI_LIBS),)
  $(call report,✗ cuda backend skipped: it needs MPI to start NCCL)
else
  HAVE_CUDA := 1
  $(call report,✓ cuda backend built: $(NVCC) for $(CUDA_ARCH), NCCL, cuBLASLt)
  CUDA_LIBDIRS := $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib)
  CFLAGS_ALL += -DHAVE_CUDA -I$(CUDA_HOME)/include
  LDLIBS_ALL += $(addprefix -L,$(CUDA_LIBDIRS)) $(addprefix -Wl$(comma)-rpath$(comma),$(CUDA_LIBDIRS)) \
    -Wl,--as-needed -lnccl -lcublasLt -lcudart -lstdc++ -Wl,--no-as-needed
  NVCC_FLAGS := -O2 -std=c++17 -lineinfo -DHAVE_CUDA \
    $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a:sm_%=%),code=$(a)) \
    -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings
endif

# cuDNN (the attention core from cuDNN's fused SDPA, exec/backend_cuda_cudnn.c): with the cuda
# backend when $(CUDA_HOME)/include has cudnn.h; the emulation has a stand-in
# (tests/gpu/emu/cudnn.c). NO_CUDNN=1 builds without (the own attention kernels only).
HAVE_CUDNN :=
ifneq ($(HAVE_CUDA),)
  ifneq ($(NO_CUDNN),)
    $(call report,✗ cuDNN skipped: NO_CUDNN=1 (attention runs the own kernels))
  else ifneq ($(CUDA_EMU),)
    HAVE_CUDNN := 1
  else ifneq ($(wildcard $(CUDA_HOME)/include/cudnn.h),)
    HAVE_CUDNN := 1
    $(call report,✓ cuDNN found: attention from cuDNN's fused SDPA (the own kernels as fallback))
    LDLIBS_ALL += -Wl,--as-needed -lcudnn -Wl,--no-as-needed
  else
    $(call report,✗ cuDNN skipped: no cudnn.h under $(CUDA_HOME)/include (attention runs the own kernels))
  endif
endif
ifneq ($(HAVE_CUDNN),)
  CFLAGS_ALL += -DHAVE_CUDNN
endif

# --- sources --------------------------------------------------------------------------------
MODULES := base ir models directives report sim kernels exec prof
LIB_SRCS := $(foreach m,$(MODULES),$(wildcard $(m)/*.c))
# The cuda backend's host side and the profiler's CUDA part: compiled only with HAVE_CUDA (they
# include the CUDA headers).
CUDA_SRCS := $(wildcard exec/backend_cuda*.c prof/cuda*.c)
CU_SRCS := $(wildcard kernels/*.cu)
ifeq ($(HAVE_CUDA),)
  LIB_SRCS := $(filter-out $(CUDA_SRCS),$(LIB_SRCS))
  CU_OBJS :=
else
  CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.cu.o)
endif
# the emulation's stand-ins, in the library (C, and the fibers the kernels' threads run on)
EMU_SRCS := $(wildcard tests/gpu/emu/*.c)
ifneq ($(CUDA_EMU),)
  LIB_SRCS += $(EMU_SRCS)
  CU_OBJS += $(BUILD)/tests/gpu/emu/launch.cpp.o
endif
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
LIB := $(BUILD)/libpiper.a
TOOLS := $(patsubst tools/%.c,$(BIN)/%,$(wildcard tools/piper-*.c))
# tools/ also holds what the programs share above the library (option tables, drivers such as
# the sweep): built into its own archive, linked into the programs only.
TOOL_LIB_SRCS := $(filter-out tools/piper-%.c,$(wildcard tools/*.c))
TOOL_LIB_OBJS := $(TOOL_LIB_SRCS:%.c=$(BUILD)/%.o)
TOOL_LIB := $(BUILD)/libpiper-tools.a
TOOL_OBJS := $(patsubst tools/%.c,$(BUILD)/tools/%.o,$(wildcard tools/piper-*.c))
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRCS := $(wildcard tests/bench/*.c)
BENCH_BINS := $(patsubst tests/bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
# GPU check programs (tests/gpu/, run by tools/gpu-check.sh): built with the cuda backend.
# Emulated: the kernel check, and bench_fp8 at small shapes (its check against the host).
GPU_CHECK_SRCS := $(if $(HAVE_CUDA),$(wildcard tests/gpu/*.c))
GPU_CHECK_SRCS := $(if $(CUDA_EMU),tests/gpu/check_kernels.c tests/gpu/bench_fp8.c,$(GPU_CHECK_SRCS))
GPU_CHECK_BINS := $(GPU_CHECK_SRCS:tests/gpu/%.c=$(BUILD)/gpu/%)
ALL_OBJS := $(LIB_OBJS) $(TOOL_LIB_OBJS) $(TOOL_OBJS) $(UNIT_SRCS:%.c=$(BUILD)/%.o) \
  $(BENCH_SRCS:%.c=$(BUILD)/%.o) $(GPU_CHECK_SRCS:%.c=$(BUILD)/%.o)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)

.SECONDARY:
.PHONY: all test test-long test-bins test-long-bins fuzz-bins unit unit-long cli cli-fast cli-long fuzz asan asan-unit bench install clean deps \
  print-cflags print-libs example lint loop loop-short emu readme-check validate
# the emulation's own check of the fused attention (tests/gpu/emu/flash_emu.cpp)
EMU_CHECK_BINS := $(if $(CUDA_EMU),$(BUILD)/gpu/flash_emu)
all: $(TOOLS) $(GPU_CHECK_BINS) $(EMU_CHECK_BINS)

deps:
	@tools/install-deps.sh

# The README's main job: simulate DualPipeV with data and expert parallelism on the tiny MoE
# model and draw its schedule (out/example/schedule.png).
EXAMPLE_OUT ?= out/example
example: deps
	@$(MAKE) --no-print-directory all
	$(BIN)/piper-sim --model models/tiny-moe.json --pp-regions 4 \
	  --base-schedule directives/base-schedules/pp4_dp2_ep2_v_placement.json \
	  --schedule dualpipev --mbs 8 --profile profiles/h100-sxm.json --out $(EXAMPLE_OUT) --force

# Host kernels: vectorise their elementwise loops (gcc 12's -O2 uses the "very cheap" cost model,
# which skips loops of unknown trip count; sqrtf's errno path blocks AdamW; assuming that FP
# exceptions may trap keeps the clamps of kernels_impl_expf from if-converting). None of these
# flags reassociates or contracts floating point: every result is the same as without them.
$(BUILD)/kernels/%.o: CFLAGS_ALL += -ftree-vectorize -fno-math-errno -fno-trapping-math

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(DEPFLAGS) -c $< -o $@
-include $(ALL_OBJS:.o=.d)

# CUDA kernels: few files (each nvcc run compiles every architecture of CUDA_ARCH).
ifeq ($(CUDA_EMU),)
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MMD -MP -c $< -o $@
else
# Emulated: g++ compiles the same source, its launches (<<<grid, block, bytes, stream>>>(...))
# rewritten to fake_launch(grid, block, bytes, stream, kernel, ...), __shared__ arrays to
# static thread-local ones (a thread runs a block at a time), and the dynamic shared memory's
# `extern __shared__ ... smem[];` left out (tests/gpu/emu/fake_cuda.hpp declares smem, the
# device side's stand-in).
# The kernels pun bf16 pairs through pointers, as CUDA code does: no strict aliasing.
EMU_CXXFLAGS := -std=c++17 $(OPT) -g -Wall -Wextra -Werror -fno-strict-aliasing -DHAVE_CUDA \
  -DPIPER_CUDA_EMU -Ikernels -Itests/gpu/emu -Itests/gpu/emu/include \
  -include tests/gpu/emu/fake_cuda.hpp
$(BUILD)/%.emu.cpp: %.cu Makefile
	@mkdir -p $(dir $@)
	sed -E -e 's/([A-Za-z_0-9]+(<[A-Za-z0-9_]+>)?)<<<(.*)>>>\(/fake_launch(\3, \1, /' \
	  -e '/extern __shared__/d' -e 's/__shared__/static thread_local/' \
	  -e 's/"mma_sm80.cuh"/"mma_sm80.hpp"/' $< > $@
$(BUILD)/%.cu.o: $(BUILD)/%.emu.cpp
	$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%.cpp.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@
endif
-include $(CU_OBJS:.o=.d)

$(LIB): $(LIB_OBJS) $(CU_OBJS)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(TOOL_LIB): $(TOOL_LIB_OBJS)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# Static pattern rules: the binaries' patterns must not compete with the objects' one.
$(TOOLS): $(BIN)/%: $(BUILD)/tools/%.o $(TOOL_LIB) $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS_ALL) $< $(TOOL_LIB) $(LIB) $(LDLIBS_ALL) -o $@

$(UNIT_BINS): $(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(TOOL_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< $(TOOL_LIB) $(LIB) $(LDLIBS_ALL) -lcmocka -o $@

$(GPU_CHECK_BINS): $(BUILD)/gpu/%: $(BUILD)/tests/gpu/%.o $(TOOL_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< $(TOOL_LIB) $(LIB) $(LDLIBS_ALL) -o $@

$(EMU_CHECK_BINS): $(BUILD)/gpu/%: $(BUILD)/tests/gpu/emu/%.cpp.o $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $< $(LIB) $(LDLIBS_ALL) -o $@

$(BENCH_BINS): $(BUILD)/bench/%: $(BUILD)/tests/bench/%.o $(TOOL_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< $(TOOL_LIB) $(LIB) $(LDLIBS_ALL) -o $@

bench: $(BENCH_BINS) $(TOOLS)

# The cuda backend run on the CPU (tests/gpu/emu/README.md): the programs and the kernel check
# built against the emulation, in $(EMU_BUILD) (tests/cli/test_cuda_emu.sh runs them).
EMU_BUILD ?= build/emu
emu:
	@$(MAKE) --no-print-directory CUDA_EMU=1 BUILD=$(EMU_BUILD) BIN=$(EMU_BUILD)/bin all

# The suites run through tools/run-suites.sh: TEST_JOBS at a time (the cores; 2 in CI), each
# one's output whole and in order, followed by its line "time: NAME W s wall, U s user, S s
# sys, load L" (make test and test-long list the slowest at the end). A suite that starts MPI
# jobs or threads of its own runs alone (written @SUITE): its ranks already fill the cores.
# (nproc counts the CPUs this process may use; capped at 8: the suites are few, and their
# mpirun jobs run alone anyway)
TEST_JOBS ?= $(shell n=$$(nproc 2> /dev/null || echo 1); echo $$((n > 8 ? 8 : n)))
RUN_SUITES = tools/run-suites.sh -j $(TEST_JOBS)
# the CLI scripts that start mpirun (found by name, so a new one is found too)
alone_if_mpi = $(foreach t,$(1),$(if $(shell grep -l mpirun $(t)),@)$(t))

# Each unit test binary is its own process; the CLI scripts run the programs as a user would.
# test_planner searches on 2 threads and so runs alone.
unit: $(UNIT_BINS) $(TOOLS)
	@PIPER_BIN=$(BIN) $(RUN_SUITES) $(patsubst %/test_planner,@%/test_planner,$(UNIT_BINS))

# the unit checks that take minutes (every configuration the planner proposes for 405B on 8,192
# devices and DeepSeek-V3 compiles; the planner's memory bound under every recomputation);
# make test runs the same binaries on their small cases, which PIPER_LONG_TESTS=1 leaves out
# (PIPER_LONG_TESTS=all runs them too)
unit-long: $(BUILD)/tests/test_planner $(TOOLS)
	@fail=0; for t in test_every_config_compiles test_memory_bound; do PIPER_BIN=$(BIN) \
	  PIPER_LONG_TESTS=1 PIPER_TEST_ONLY=$$t $(RUN_SUITES) $(BUILD)/tests/test_planner || fail=1; \
	  done; exit $$fail

cli: $(TOOLS)
	@PIPER_BIN=$(BIN) $(RUN_SUITES) $(call alone_if_mpi,$(wildcard tests/cli/*.sh))

# The CLI scripts split by time: those below run processes for real (mpirun equivalence suites,
# faults, checkpoints, the profiler, the emulated GPU: 20 s to several minutes each on 2 cores)
# or edit every field of a plan, and run in `make test-long`; every other script, a new one
# included, is a fast check (each under 10 s of CPU) and runs in `make test`. Together they are `make cli`: none is
# dropped from CI.
CLI_LONG := battery cuda cuda_emu exec faults hf memory plan_fields plan_model prof recompute \
  reshard runs stragglers tied tp train validate
CLI_LONG_SCRIPTS := $(CLI_LONG:%=tests/cli/test_%.sh)
CLI_FAST_SCRIPTS := $(filter-out $(CLI_LONG_SCRIPTS),$(wildcard tests/cli/*.sh))
cli-fast: $(TOOLS)
	@PIPER_BIN=$(BIN) $(RUN_SUITES) $(call alone_if_mpi,$(CLI_FAST_SCRIPTS))
cli-long: $(TOOLS)
	@PIPER_BIN=$(BIN) $(RUN_SUITES) $(call alone_if_mpi,$(CLI_LONG_SCRIPTS))

# The README check (tools/readme-check.py): every command block of README.md run as written in
# a scratch folder, its figures compared with the README's (exact for the simulator and the
# planner, rtol for the executor's losses, wall times not compared); one line per stale figure.
readme-check: $(TOOLS)
	@echo "== readme-check"; tools/timed.sh readme-check python3 tools/readme-check.py --quiet --root . --readme README.md

# libFuzzer targets over the parsers, each for a short bounded time from its seed corpus. A
# UBSan report counts as a crash (halt_on_error), as an ASan one does.
FUZZ_CC ?= clang
FUZZ_BUILD := $(BUILD)/fuzz
FUZZ_CFLAGS := $(filter-out -Werror -DHAVE_CUDA,$(CFLAGS_ALL)) -O1 -fsanitize=fuzzer-no-link,address,undefined
# The library and what the programs share above it (the sweep file's reader is fuzzed too).
FUZZ_LIB_OBJS := $(patsubst %.c,$(FUZZ_BUILD)/%.o,$(filter-out $(CUDA_SRCS),$(LIB_SRCS))) $(TOOL_LIB_SRCS:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -c $< -o $@
-include $(FUZZ_LIB_OBJS:.o=.d)
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJS) $(LDLIBS_ALL) -o $@
# Each target is one process on one core: TEST_JOBS of them side by side, each still for its
# FUZZ_SECONDS (tools/fuzz-one.sh).
fuzz: $(FUZZ_BINS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) $(RUN_SUITES) --prefix tools/fuzz-one.sh $(FUZZ_BINS)

# Every suite runs (a failure does not stop the others); the log is kept in $(BUILD)/test.log
# (test-long: $(BUILD)/test-long.log) and its last line is the totals (tools/test-totals.sh):
# "tests: N passed, N failed", a sanitizer report or a lint finding counted as a failure.
# `make test` is the fast core (lint, unit tests, the fast CLI checks of every program: under 5
# minutes on 2 quiet cores); `make test-long` the rest: the long CLI suites (executor
# equivalence, faults, checkpoints, profiler, emulated GPU), the short fidelity loop, the unit
# tests under the sanitizers, the fuzz targets and the README check. CI runs both (.ci/run).
# Each first builds what its suites run on TEST_JOBS cores, then runs the suites (their output
# must not interleave: run-suites.sh runs them side by side).
test-bins: $(UNIT_BINS) $(TOOLS)
test-long-bins: $(BUILD)/tests/test_planner $(TOOLS)
fuzz-bins: $(FUZZ_BINS)
test: deps
	@mkdir -p $(BUILD)
	@( rc=0; \
	  $(MAKE) --no-print-directory -j$(TEST_JOBS) test-bins || rc=1; \
	  tools/timed.sh lint $(MAKE) --no-print-directory lint || rc=1; \
	  $(MAKE) --no-print-directory -k unit cli-fast || rc=1; \
	  echo $$rc > $(BUILD)/test.rc ) 2>&1 | tee $(BUILD)/test.log
	@tools/test-slowest.sh $(BUILD)/test.log
	@tools/test-totals.sh $(BUILD)/test.log; exit $$(cat $(BUILD)/test.rc)

test-long: deps
	@mkdir -p $(BUILD)
	@( rc=0; \
	  $(MAKE) --no-print-directory -j$(TEST_JOBS) test-long-bins || rc=1; \
	  $(MAKE) --no-print-directory -k unit-long cli-long loop-short readme-check || rc=1; \
	  $(MAKE) --no-print-directory asan-unit || rc=1; \
	  $(MAKE) --no-print-directory -j$(TEST_JOBS) fuzz-bins || rc=1; \
	  $(MAKE) --no-print-directory fuzz || rc=1; \
	  echo $$rc > $(BUILD)/test-long.rc ) 2>&1 | tee $(BUILD)/test-long.log
	@tools/test-slowest.sh $(BUILD)/test-long.log
	@tools/test-totals.sh $(BUILD)/test-long.log; exit $$(cat $(BUILD)/test-long.rc)

# Every UBSan report fails its test (halt_on_error: the process exits 1 after the report);
# leaks of third-party caches are suppressed (tests/sanitizers/lsan.supp).
asan: deps
	@UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp \
	  $(MAKE) --no-print-directory -j$(TEST_JOBS) BUILD=build-asan BIN=build-asan/bin OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" \
	  LDLIBS_EXTRA= unit cli

# The unit tests alone under ASan + UBSan + LeakSanitizer, without the cuda backend (no GPU
# here, and nvcc would double the build): what `make test` (and so CI, 90 minutes on 2 cores)
# runs of the sanitizers. Its own build folder: its flags differ from `make asan`'s. Built on
# TEST_JOBS cores (a whole second build of the library: serial, it was minutes of CI).
ASAN_UNIT_BUILD ?= build-asan-unit
asan-unit:
	@UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp \
	  $(MAKE) --no-print-directory -j$(TEST_JOBS) BUILD=$(ASAN_UNIT_BUILD) BIN=$(ASAN_UNIT_BUILD)/bin OPT=-O1 \
	  NO_CUDA=1 EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" unit

# The fidelity loop (tools/loop.sh): profile this machine with piper-prof, then simulate,
# execute (3 runs) and compare a fixed set of validation plans; prints one table (out/loop/).
# Takes several minutes. loop-short (part of make test) runs each plan once for a few steps and
# only checks that the table is produced: it reports the errors, it does not judge them.
LOOP_OUT ?= out/loop
loop: $(TOOLS)
	@PIPER_BIN=$(BIN) tools/loop.sh --out $(LOOP_OUT)

loop-short: $(TOOLS)
	@PIPER_BIN=$(BIN) tools/timed.sh loop-short tools/loop.sh --short --out $(BUILD)/loop-short

# The published runs of validation/runs.json simulated as published: validation/table.md, and
# the issue's targets asserted (docs/validation.md)
validate: $(TOOLS)
	@python3 tools/validate.py --bin $(BIN) --out validation --check

# Function budget (issue 8): no function over 120 lines or cyclomatic complexity 40 in the
# library or the programs. Prints the offenders and fails when there is any.
LINT_SRCS = $(wildcard $(foreach d,base ir models directives sim exec prof kernels report tools,$(d)/*.c $(d)/*.h))
lint:
	@command -v lizard >/dev/null || python3 -c "import lizard" 2>/dev/null || tools/install-deps.sh
	@# the LINT_SRCS folders' C, headers and CUDA (.cu, .cuh: lizard's C-like reader), then the layering
	@if command -v lizard >/dev/null; then lizard=lizard; else lizard="python3 -m lizard"; fi; fail=0; \
	  srcs="$(sort $(LINT_SRCS) $(wildcard $(foreach d,$(sort $(dir $(LINT_SRCS))),$(d)*.cu $(d)*.cuh)))"; \
	  out=$$($$lizard -L 120 -C 40 -w $$srcs); \
	  if [ -n "$$out" ]; then echo "$$out"; echo "lint: $$(echo "$$out" | wc -l) function(s) over 120 lines or CCN 40"; fail=1; \
	  else echo "lint: no function over 120 lines or CCN 40"; fi; \
	  tools/lint-layers.sh $$srcs || fail=1; \
	  exit $$fail

install: all
	install -d $(PREFIX)/bin
	install -m 755 $(TOOLS) $(PREFIX)/bin

clean:
	rm -rf $(BUILD) build-asan build-asan-unit $(BIN)

# Flags for compiling a subset of the tree by hand (cc $(make -s print-cflags) ...).
print-cflags:
	@echo $(CFLAGS_ALL)
print-libs:
	@echo $(LDLIBS_ALL)
