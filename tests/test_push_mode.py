"""kernel.push_mode: which push the CUDA protocols run with peers. "stream" (one kernel of
sender and receiver blocks) needs every rank's grid resident at once, so its block count
follows from how many ranks share a GPU and the SMs the config grants (kernel.num_sms, as
DeepEP's num_sms); "auto" streams only with a GPU per rank. The blocks split into senders
(the channels) and at most as many receivers. CPU only: the rules, not the kernel
(tests/gpu/test_torch_backend.py runs that)."""
from __future__ import annotations

import pytest

from symmoe import InputError
from symmoe.launch_shape import stream_blocks, stream_split


def test_auto_streams_with_a_gpu_per_rank_and_unpacks_under_mps():
    assert stream_blocks("auto", share=1, sms=132, num_sms=132) == 132
    assert stream_blocks("auto", share=2, sms=132, num_sms=132) == 0


def test_unpack_never_streams():
    assert stream_blocks("unpack", share=1, sms=132, num_sms=132) == 0


@pytest.mark.parametrize("share,num_sms,want", [
    (1, 24, 24),    # the SMs the config grants
    (1, 1, 2),      # a sender and a receiver at least
    (4, 132, 33),   # four ranks on 132 SMs: 4 x 33 = 132 blocks fit at once
    (8, 132, 16),
])
def test_forced_stream_fits_every_rank_sharing_the_gpu(share, num_sms, want):
    got = stream_blocks("stream", share=share, sms=132, num_sms=num_sms)
    assert got == want and got * share <= 132


def test_forced_stream_that_cannot_fit_names_the_ranks_and_sms():
    with pytest.raises(InputError, match="3 ranks share a GPU of 4 SMs"):
        stream_blocks("stream", share=3, sms=4, num_sms=4)
    assert stream_blocks("auto", share=3, sms=4, num_sms=4) == 0


def test_receivers_get_half_the_blocks_by_default():
    assert stream_split(132, max_senders=128, receivers=0) == (66, 66)
    assert stream_split(133, max_senders=128, receivers=0) == (67, 66)


@pytest.mark.parametrize("blocks,max_senders,receivers,want", [
    (132, 128, 16, (116, 16)),   # the config's receivers
    (132, 64, 16, (64, 16)),     # senders capped by the layout's tail words
    (24, 128, 0, (12, 12)),      # the defaults: 24 SMs
    (132, 128, 200, (66, 66)),   # receivers never outnumber the senders
    (132, 8, 100, (8, 8)),
    (2, 128, 0, (1, 1)),
])
def test_split_keeps_senders_within_the_tail_words_and_receivers_within_the_senders(blocks, max_senders, receivers, want):
    s, r = stream_split(blocks, max_senders=max_senders, receivers=receivers)
    assert (s, r) == want and 1 <= r <= s and s + r <= blocks


def test_the_streamed_push_keeps_tail_words_for_its_most_senders_whatever_num_channels_says():
    """kernel.num_channels is nvshmem's; a torch or nccl config that leaves it at 8 still
    streams with as many senders as its SMs allow (DeepEP's num_sms is the one knob)."""
    from symmoe.config import Config
    from symmoe.layout import STREAM_CHANNELS

    for backend in ("torch", "nccl"):
        cfg = Config().replace(backend=backend, **{"kernel.num_channels": 8, "kernel.num_sms": 132})
        assert cfg.layout(2).num_channels == STREAM_CHANNELS
        assert stream_split(stream_blocks("auto", 1, 132, 132), cfg.layout(2).num_channels, 0) == (66, 66)
    assert Config().replace(backend="nvshmem", **{"kernel.num_channels": 8}).layout(2).num_channels == 8
