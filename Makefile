# torch_renaissance developer commands. Everything runs in a local venv (.venv)
# built from the CPU wheel of torch 2.13.0; MAX_JOBS=2 suits small machines.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Off this project's machines, a CPU-only torch wheel needs PyTorch's index:
#   make TORCH_INDEX="--extra-index-url https://download.pytorch.org/whl/cpu" test
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
DEPS   := setuptools wheel pybind11 ninja rich pytest pytest-benchmark numpy matplotlib transformers hypothesis
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.c' -o -name '*.h') setup.py pyproject.toml
export MAX_JOBS ?= 2

.PHONY: venv build demo test test-cpp test-debug bench bench-lock bench-replay bench-pairs check-cuda clean

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_INDEX) $(TORCH)
	$(PIP) install -q $(DEPS)
	touch $@

venv: $(VENV)/.deps

# pytest-benchmark, also for a .venv made before it joined DEPS.
$(VENV)/.bench-deps: $(VENV)/.deps
	$(PIP) install -q pytest-benchmark
	touch $@

# Builds the extension and installs the package (editable: the compiled
# torch_renaissance/_C*.so lands next to the sources); again only when a
# C++ source or the build files changed.
$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-build-isolation -e .
	touch $@

build: $(VENV)/.built

demo: build
	$(VENV)/bin/torch-renaissance demo

# The planner's exhaustive C++ test (brute-force optimality, obstacle bounds,
# overflow cases): few iterations here and no timing checks; by hand,
# `build/plan_test 400 --timings` runs the long version with timings.
PLANNER_SOURCES := $(wildcard csrc/core/planner*.cpp csrc/core/planner*.h)
PLAN_TESTS := $(wildcard tests/cpp/planner/*.cpp tests/cpp/planner/*.h)
build/plan_test: $(PLAN_TESTS) $(PLANNER_SOURCES)
	@mkdir -p build
	$(CXX) -O2 -std=c++17 -Wall -Wextra -Werror -pthread -Icsrc $(filter %.cpp,$(PLAN_TESTS)) \
	    $(filter %.cpp,$(PLANNER_SOURCES)) -o $@

# An allocation's worst latency on another thread while a step is planned
# (C++, no GIL): benchmarks/cpp/plan_lock_latency.cpp.
CORE_HOST_SOURCES := $(filter-out csrc/core/cuda_device.cpp,$(wildcard csrc/core/*.cpp))
build/plan_lock_latency: benchmarks/cpp/plan_lock_latency.cpp $(wildcard csrc/core/*.cpp csrc/core/*.h)
	@mkdir -p build
	$(CXX) -O2 -std=c++17 -Wall -Wextra -Werror -pthread -Icsrc $< $(CORE_HOST_SOURCES) -o $@

bench-lock: build/plan_lock_latency
	build/plan_lock_latency 1200 3

# The config table's C++ layer (core/config.h): every bad value is an error.
# Planned replay's cost per pair in a C++ loop (for callgrind / perf):
# benchmarks/cpp/replay_loop.cpp.
build/replay_loop: benchmarks/cpp/replay_loop.cpp $(wildcard csrc/core/*.cpp csrc/core/*.h)
	@mkdir -p build
	$(CXX) -O2 -g -std=c++17 -Wall -Wextra -Werror -pthread -Icsrc $< $(CORE_HOST_SOURCES) -o $@

bench-replay: build/replay_loop
	build/replay_loop

# The dynamic hot path's cost per pair in a C++ loop (for callgrind / perf):
# benchmarks/cpp/pair_loop.cpp.
build/pair_loop: benchmarks/cpp/pair_loop.cpp $(wildcard csrc/core/*.cpp csrc/core/*.h)
	@mkdir -p build
	$(CXX) -O2 -g -std=c++17 -Wall -Wextra -Werror -pthread -Icsrc $< $(CORE_HOST_SOURCES) -o $@

bench-pairs: build/pair_loop
	build/pair_loop

build/config_test: tests/cpp/config_test.cpp csrc/core/config.cpp csrc/core/config.h
	@mkdir -p build
	$(CXX) -O1 -std=c++17 -Wall -Wextra -Werror -Icsrc tests/cpp/config_test.cpp \
	    csrc/core/config.cpp -o $@

# TR_DEBUG (core/debug.h) at levels 0 and 1: a stat below zero clamps / aborts.
build/debug_test_%: tests/cpp/debug_test.cpp csrc/core/debug.cpp csrc/core/debug.h csrc/core/stats.h
	@mkdir -p build
	$(CXX) -O1 -std=c++17 -Wall -Wextra -Werror -DTR_DEBUG=$* -Icsrc tests/cpp/debug_test.cpp \
	    csrc/core/debug.cpp -o $@

# The asymmetric fence (core/asym_fence.h): a membarrier that fails after a
# retry is reported, never taken for one that ran.
build/fence_test: tests/cpp/fence_test.cpp csrc/core/asym_fence.cpp csrc/core/asym_fence.h
	@mkdir -p build
	$(CXX) -O1 -std=c++17 -Wall -Wextra -Werror -Icsrc tests/cpp/fence_test.cpp \
	    csrc/core/asym_fence.cpp -o $@

# The replay fast path's tables (core/replay_table.h) against brute force.
build/replay_table_test: tests/cpp/replay_table_test.cpp csrc/core/replay_table.cpp \
		csrc/core/replay_table.h
	@mkdir -p build
	$(CXX) -O1 -std=c++17 -Wall -Wextra -Werror -Icsrc tests/cpp/replay_table_test.cpp \
	    csrc/core/replay_table.cpp -o $@

# The territory's free-block index (core/territory_index.h) against a std::map.
build/territory_index_test: tests/cpp/territory_index_test.cpp csrc/core/territory_index.cpp \
		csrc/core/territory_index.h csrc/core/live_map.h
	@mkdir -p build
	$(CXX) -O1 -std=c++17 -Wall -Wextra -Werror -Icsrc tests/cpp/territory_index_test.cpp \
	    csrc/core/territory_index.cpp -o $@

# A slot's room above (core/slot_room.h) against the scan it replaced.
build/slot_room_test: tests/cpp/slot_room_test.cpp csrc/core/slot_room.h
	@mkdir -p build
	$(CXX) -O1 -std=c++17 -Wall -Wextra -Werror -Icsrc tests/cpp/slot_room_test.cpp -o $@

test-cpp: build/plan_test build/config_test build/debug_test_0 build/debug_test_1 build/fence_test \
		build/territory_index_test build/replay_table_test build/slot_room_test
	build/plan_test 40
	build/territory_index_test
	build/replay_table_test
	build/slot_room_test
	build/config_test
	build/fence_test
	build/debug_test_0
	build/debug_test_1

# The tests (the planner's C++ test first; the suite takes 7-9 minutes on 2
# idle cores), then every benchmark once, untimed and on small inputs, so
# that the benchmarks cannot rot (about 15 s; not run when a test fails).
test: build test-cpp $(VENV)/.bench-deps
	$(PY) -m pytest -q tests
	$(PY) -m pytest -q benchmarks --benchmark-disable

# The core and planned-step tests against a TR_DEBUG=3 build (csrc/core/debug.h:
# O(1) assertions, and the arena's check_invariants() after every public
# operation). The build lives in a copy of the sources under build/debug3, so
# the tree's own extension stays the release build; rebuilt incrementally.
DEBUG_TREE := build/debug3/src
# Left out at level 3: the planned-step scenarios that train for 30-200 steps
# and the 200k-operation stream fuzz (minutes each there; the other scenarios
# and the contract suite's fuzz on all 16 arenas run the same paths on shorter
# runs), and the one wall-clock test (a plan must take > 0.5 s of a 1.5 s
# budget while another thread allocates: timing, not an invariant).
DEBUG_TESTS := tests/test_core.py tests/test_planned.py tests/test_contract.py \
	tests/test_arena_fuzz.py tests/test_territory.py tests/test_streams_sim.py \
	tests/test_replay_deviation.py tests/test_replay_fast_path.py tests/test_replay_fast_livein.py \
	tests/test_replay_lazy_trace.py tests/test_front_model.py tests/test_reordered_requests.py \
	tests/test_keyed_steps.py tests/test_step_stream_structure.py tests/test_cross_step.py \
	tests/test_variant_backoff.py tests/test_recorded_steps.py tests/test_step_structures.py \
	tests/test_step_end_fuzz.py
DEBUG_SKIP := not variable_lengths_reserved_stops_growing and not gpt_30_steps and \
	not alternating_batch_sizes and not fuzz_200k_ops_four_streams and \
	not other_threads_allocate_while_a_step_is_planned
test-debug: $(VENV)/.deps
	@mkdir -p $(DEBUG_TREE)
	tar -cf - --exclude='_C*.so' --exclude=__pycache__ csrc tests tools torch_renaissance \
	    setup.py pyproject.toml README.md LICENSE | tar -xpf - -C $(DEBUG_TREE)
	cd $(DEBUG_TREE) && TORCH_RENAISSANCE_DEBUG=3 TORCH_RENAISSANCE_CUDA=0 \
	    $(abspath $(PY)) setup.py -q build_ext --inplace
	cd $(DEBUG_TREE) && PYTHONPATH=$(abspath $(DEBUG_TREE)) \
	    TORCH_RENAISSANCE_DATA=$${TORCH_RENAISSANCE_DATA:-$(abspath ..)/shared/data} TR_EXPECT_DEBUG_LEVEL=3 \
	    $(abspath $(PY)) -m pytest -q -p no:cacheprovider --durations=8 -k "$(DEBUG_SKIP)" $(DEBUG_TESTS)

# pytest-benchmark suites (one process: hot path, replay, planner, stream
# events; each group prints our numbers beside its baseline, the JSON goes to
# BENCH_JSON), then the scripts that need a process per configuration
# (preloaded mallocs, PyTorch's default allocator). docs/benchmarks.md.
BENCH_JSON ?= bench.json
bench: build $(VENV)/.bench-deps
	$(PY) -m pytest -q benchmarks --benchmark-only --benchmark-group-by=group \
		--benchmark-json=$(BENCH_JSON)
	$(PY) benchmarks/bench_json_table.py $(BENCH_JSON)
	$(PY) benchmarks/bench_planner.py
	$(PY) benchmarks/bench_demo.py
	$(PY) benchmarks/bench_model_slots.py
	$(PY) benchmarks/bench_plan_lock.py
	$(PY) benchmarks/bench_territory.py
	$(PY) benchmarks/bench_snapshot_load.py
	$(PY) benchmarks/bench_fsdp_memory.py

# Compiles and links the CUDA backend against /usr/local/cuda and checks the
# torch CUDA glue against torch's headers (no GPU needed).
check-cuda: venv
	$(PY) tools/check_cuda_build.py

clean:
	rm -rf build dist *.egg-info torch_renaissance/_C*.so $(VENV)
