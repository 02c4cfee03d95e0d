#!/usr/bin/env bash
# Session 43 D (run warm right after C): next/host's nccl section (build, its 15 tests, the W=1 bench).
#   python3 -m pip install ... .whl/*.whl && export PYTHONPATH=/tmp/site;   (the gpu-wheels.sh line)
cd trees/2fdb026 && SYMMOE_COMMIT=2fdb026 LOG=/tmp/l/nc TEST_LIMIT_S=120 FAULT_S=110 timeout 240 scripts/gpu_check.sh build nccl 2>&1 | tail -30
