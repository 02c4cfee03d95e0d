"""The host's one wait of a GPU dispatch (csrc/bindings/host_wait.h): it spins on a word the
routing kernel sets in host-mapped memory, returns as soon as the word holds the dispatch's
epoch or a device wait recorded a failure, gives up after its time so the caller can ask the
stream whether it faulted, and lets other Python threads run meanwhile. Plain host memory
stands in for the mapped words: the helper never calls CUDA."""
import threading
import time

import numpy as np
import pytest

from symmoe import build

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def mod():
    if build.nvcc_path() is None:
        pytest.skip("nvcc not found")
    return build.load("symmoe_cuda")


def _words():
    return np.zeros(1, np.int64), np.zeros(4, np.int64)  # ready word, ErrorWord (stage first)


def test_returns_false_after_its_time_when_nothing_arrives(mod):
    ready, err = _words()
    ready[0] = 6  # an earlier dispatch's epoch is not this one's
    t0 = time.perf_counter()
    assert mod.wait_mapped(ready.ctypes.data, 7, err.ctypes.data, 0.05) is False
    assert 0.05 <= time.perf_counter() - t0 < 1.0


def test_returns_true_when_the_word_holds_the_epoch(mod):
    ready, err = _words()
    ready[0] = 7
    assert mod.wait_mapped(ready.ctypes.data, 7, err.ctypes.data, 5.0) is True


def test_returns_true_when_a_device_wait_recorded_a_failure(mod):
    ready, err = _words()
    err[0] = 1  # stage "dispatch.counts": the caller reads the word and raises StallError
    t0 = time.perf_counter()
    assert mod.wait_mapped(ready.ctypes.data, 7, err.ctypes.data, 5.0) is True
    assert time.perf_counter() - t0 < 1.0


def test_other_threads_run_while_it_spins(mod):
    ready, err = _words()

    def writer():  # needs the GIL: a wait that held it would run out its 5 s
        time.sleep(0.02)
        ready[0] = 7

    th = threading.Thread(target=writer)
    th.start()
    t0 = time.perf_counter()
    assert mod.wait_mapped(ready.ctypes.data, 7, err.ctypes.data, 5.0) is True
    assert time.perf_counter() - t0 < 1.0
    th.join()
