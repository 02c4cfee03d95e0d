"""The host's one wait of a GPU dispatch (csrc/bindings/host_wait.h's CountsWait): it spins on
a word the routing kernel sets in host-mapped memory, returns as soon as the word holds the
dispatch's epoch or a device wait recorded a failure, gives up after its time so the caller
can ask the stream whether it faulted, and lets other Python threads run meanwhile. Plain host
memory stands in for the mapped words: the helper never calls CUDA. What it does with a guessed
result once the counts are in: tests/test_counts.py."""
import threading
import time

import numpy as np
import pytest

from symmoe.protocol.counts import NO_GUESS, SUMMARY_HEAD

pytestmark = pytest.mark.build


class Words:
    """The ready word and the ErrorWord (stage first), and the wait over them."""

    def __init__(self, mod):
        self.ready, self.err = np.zeros(1, np.int64), np.zeros(4, np.int64)
        self.summary, self.counts = np.zeros(SUMMARY_HEAD + 4, np.int32), np.zeros(6, np.int32)
        self._wait = mod.CountsWait(self.ready.ctypes.data, self.err.ctypes.data, 0, self.summary.ctypes.data,
                                    SUMMARY_HEAD, self.counts.ctypes.data, self.counts.size, 4, 64)

    def wait(self, epoch: int, max_s: float) -> int:
        return self._wait.wait(epoch, max_s, *NO_GUESS)


def test_it_times_out_after_its_time_when_nothing_arrives(cuda_module):
    w = Words(cuda_module)
    w.ready[0] = 6  # an earlier dispatch's epoch is not this one's
    t0 = time.perf_counter()
    assert w.wait(7, 0.05) == cuda_module.COUNTS_TIMED_OUT == 0  # falsy: the caller asks the stream
    assert 0.05 <= time.perf_counter() - t0 < 1.0


def test_the_counts_are_ready_when_the_word_holds_the_epoch(cuda_module):
    w = Words(cuda_module)
    w.ready[0] = 7
    assert w.wait(7, 5.0) == cuda_module.COUNTS_READY


def test_it_returns_when_a_device_wait_recorded_a_failure(cuda_module):
    w = Words(cuda_module)
    w.err[0] = 1  # stage "dispatch.counts": the caller reads the word and raises StallError
    t0 = time.perf_counter()
    assert w.wait(7, 5.0) == cuda_module.COUNTS_READY
    assert time.perf_counter() - t0 < 1.0


def test_other_threads_run_while_it_spins(cuda_module):
    w = Words(cuda_module)

    def writer():  # needs the GIL: a wait that held it would run out its 5 s
        time.sleep(0.02)
        w.ready[0] = 7

    th = threading.Thread(target=writer)
    th.start()
    t0 = time.perf_counter()
    assert w.wait(7, 5.0) == cuda_module.COUNTS_READY
    assert time.perf_counter() - t0 < 1.0
    th.join()


def test_a_dispatch_s_wait_says_whether_it_filled_the_guess_and_marks_its_span(cuda_module):
    """Protocol._wait_counts, as the GPU protocols call it: True only where the wait filled a
    guess; without one the host reads the counts (False). Its marks bound the wait."""
    from types import SimpleNamespace

    from symmoe.protocol.base import Protocol

    w = Words(cuda_module)
    w.ready[0] = 7
    w.summary[1:3] = 5  # this rank's rows and the most any receiver got, rank-major
    counts, per_expert = np.zeros(6, np.int32), np.zeros(4, np.int32)
    guess = SimpleNamespace(target=(5, False, counts.ctypes.data, per_expert.ctypes.data))
    finished = SimpleNamespace(query=lambda: True)  # the stream, asked only after a timed-out spin
    proto = SimpleNamespace(_counts_wait=w._wait, _filled=cuda_module.COUNTS_FILLED, _stream=lambda: finished)
    assert Protocol._wait_counts(proto, 7, None) is False
    t0, t1 = proto.wait_marks
    assert t0 <= t1
    w.counts[:] = 3
    assert Protocol._wait_counts(proto, 7, guess) is True
    assert counts.tolist() == [3] * 6
    w.ready[0] = 6  # not this dispatch's epoch: the finished stream ends the wait, nothing filled
    assert Protocol._wait_counts(proto, 7, guess) is False
