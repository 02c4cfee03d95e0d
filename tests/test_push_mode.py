"""kernel.push_mode: which push the CUDA protocols run with peers. "stream" (one kernel of
sender and receiver channels) needs every rank's grid resident at once, so its channel count
follows from how many ranks share a GPU; "auto" streams only with a GPU per rank. CPU only:
the rule, not the kernel (tests/gpu/test_torch_backend.py runs that)."""
from __future__ import annotations

import pytest

from symmoe import InputError
from symmoe.protocol.cuda import stream_channels


def test_auto_streams_with_a_gpu_per_rank_and_unpacks_under_mps():
    assert stream_channels("auto", share=1, sms=132, num_channels=64, num_sms=132) == 64
    assert stream_channels("auto", share=2, sms=132, num_channels=64, num_sms=132) == 0


def test_unpack_never_streams():
    assert stream_channels("unpack", share=1, sms=132, num_channels=64, num_sms=132) == 0


@pytest.mark.parametrize("share,num_channels,num_sms,want", [
    (1, 8, 16, 8),      # the config's channels
    (1, 64, 24, 12),    # half the SMs the config grants (a sender and a receiver block per channel)
    (4, 64, 132, 16),   # four ranks on 132 SMs: 4 x 2 x 16 = 128 blocks fit at once
    (8, 64, 132, 8),
])
def test_forced_stream_fits_every_rank_sharing_the_gpu(share, num_channels, num_sms, want):
    got = stream_channels("stream", share=share, sms=132, num_channels=num_channels, num_sms=num_sms)
    assert got == want and 2 * got * share <= 132


def test_forced_stream_that_cannot_fit_names_the_ranks_and_sms():
    with pytest.raises(InputError, match="3 ranks share a GPU of 4 SMs"):
        stream_channels("stream", share=3, sms=4, num_channels=8, num_sms=4)
    assert stream_channels("auto", share=3, sms=4, num_channels=8, num_sms=4) == 0
