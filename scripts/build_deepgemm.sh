#!/usr/bin/env bash
# Builds DeepGEMM's torch extension (deep_gemm._C) from a DeepGEMM source tree into a copy:
# scripts/build_deepgemm.sh SRC DEST. Then PYTHONPATH=DEST (and DG_JIT_CACHE_DIR somewhere writable).
# DeepGEMM is never a dependency of symmoe; tests/gpu/test_fp8_gpu.py runs its contiguous grouped
# FP8 GEMM on symmoe's expert-major FP8 outputs where it imports, and skips otherwise.
#   SRC: `git archive 54e2261` of deepseek-ai/DeepGEMM with third-party/cutlass/include (CUTLASS
#        v4.2.1, f3fde58) and third-party/fmt/include (553ec11) unpacked in it (docs/testing.md).
# At install only csrc/python_api.cpp compiles (g++, torch's headers); the GEMM kernels are
# compiled by nvcc at their first call, with deep_gemm/include as their one include path, which
# therefore gets cute/ and cutlass/ beside deep_gemm/ (what DeepGEMM's develop.sh links).
set -euo pipefail
src=${1:?usage: scripts/build_deepgemm.sh SRC DEST}
dest=${2:?usage: scripts/build_deepgemm.sh SRC DEST}
PY=${PYTHON:-python3}
rm -rf "$dest" && mkdir -p "$dest" && cp -r "$src"/. "$dest"/
cd "$dest"
ln -sfn ../../third-party/cutlass/include/cute deep_gemm/include/cute
ln -sfn ../../third-party/cutlass/include/cutlass deep_gemm/include/cutlass
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# nvrtc.h, cublasLt.h and libnvrtc from torch's CUDA 13 wheels, where CUDA_HOME holds only the compiler
NV=$($PY -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))")
mkdir -p build/nvlib && ln -sf "$NV/lib/libnvrtc.so.13" build/nvlib/libnvrtc.so
CPATH="$NV/include${CPATH:+:$CPATH}" LIBRARY_PATH="$PWD/build/nvlib${LIBRARY_PATH:+:$LIBRARY_PATH}" \
  DG_USE_LOCAL_VERSION=0 MAX_JOBS=${MAX_JOBS:-12} $PY setup.py build_ext --inplace
