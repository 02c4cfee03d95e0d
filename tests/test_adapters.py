"""The framework adapters on the host backend: Megatron-Core's flex dispatcher manager and the
TorchTitan token dispatcher, outputs and gradients bitwise against plain torch in one process,
and the errors of bad use.

Routings are drawn fresh from the session seed (masked -1 ids, ranks that receive nothing,
skew, a rank with no tokens); upstream gradients are random, never zeros."""
import importlib.util

import pytest
import torch

from conftest import small_config
from symmoe import Buffer
from symmoe.adapters import megatron as sm
from symmoe.adapters.torchtitan import SymmoeDispatchMetadata, SymmoeTokenDispatcher
from symmoe.errors import InputError
from symmoe.launch import spawn
from symmoe.testing.adapters import check_megatron, check_torchtitan
from symmoe.testing.training import GRAD_ROUTINGS
from symmoe.workload import Routing, make_inputs

CASES = len(GRAD_ROUTINGS)
# Every world size, both protocols and both row dtypes, without the full product (CI time).
CASES_W_P_D = [(1, "push", "bfloat16"), (2, "pull", "float32"), (2, "push", "bfloat16"), (4, "pull", "bfloat16"),
               (4, "push", "float32")]
HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None and \
    importlib.util.find_spec("megatron.core") is not None


@pytest.mark.parametrize("world_size,protocol,dtype", CASES_W_P_D)
def test_megatron_manager_rows_probs_and_gradients_are_plain_torchs_bitwise(world_size, protocol, dtype, seed):
    """setup_metadata -> dispatch -> get_permuted_hidden_states_by_experts -> (experts) ->
    get_restored_hidden_states_by_experts -> combine: received and permuted rows, fp32 probs,
    tokens per expert, the combined output and the gradients of hidden_states, probs and the
    expert rows equal one process's plain-torch computation bit for bit."""
    cfg = small_config(protocol=protocol, **{"buffer.dtype": dtype})
    assert spawn(check_megatron, world_size, args=(cfg.to_dict(), seed + world_size)) == [CASES] * world_size


@pytest.mark.skipif(not HAVE_MEGATRON, reason="megatron-core is not installed (scripts/install.sh test installs it)")
@pytest.mark.parametrize("world_size", [2, 4])
def test_megatrons_flex_dispatcher_builds_and_runs_the_symmoe_manager_after_install(world_size, seed):
    """After install(config), Megatron-Core's own MoEFlexTokenDispatcher (backend 'deepep')
    builds SymmoeManager in place of _DeepepManager, and its dispatch_preprocess ->
    token_dispatch -> dispatch_postprocess -> combine_preprocess -> token_combine ->
    combine_postprocess give plain torch's bits, gradients included."""
    cfg = small_config(protocol="pull")
    assert spawn(check_megatron, world_size, args=(cfg.to_dict(), seed + 20 + world_size, "megatron"),
                 timeout_s=300.0) == [CASES] * world_size


@pytest.mark.parametrize("world_size,protocol,dtype", CASES_W_P_D)
def test_torchtitan_dispatcher_rows_counts_and_gradients_are_plain_torchs_bitwise(world_size, protocol, dtype, seed):
    """dispatch returns rows grouped by local expert (source rank, then token, groups padded to
    expert_alignment) and the padded group sizes; combine weights by the scores in fp32; the
    gradients of x, the scores and the routed rows equal one process's plain torch bit for bit."""
    cfg = small_config(protocol=protocol, **{"buffer.dtype": dtype})
    assert spawn(check_torchtitan, world_size, args=(cfg.to_dict(), seed + 40 + world_size)) == [CASES] * world_size


# -- bad use ---------------------------------------------------------------------------------------
def _routing(buf: Buffer, seed: int, tokens: int = 12):
    b = buf.config.buffer
    (i,) = make_inputs(Routing("masked", mask_prob=0.3), num_tokens=tokens, hidden=b.hidden, topk=b.topk,
                       num_experts=b.num_experts, world_size=1, dtype=buf.dtype, seed=seed)
    rmap = torch.zeros((tokens, b.num_experts), dtype=torch.bool)
    probs = torch.zeros((tokens, b.num_experts))
    t, k = (i.topk_idx >= 0).nonzero(as_tuple=True)
    rmap[t, i.topk_idx[t, k]] = True
    probs[t, i.topk_idx[t, k]] = i.topk_weights[t, k]
    return i, rmap, probs


def test_megatron_manager_refuses_bad_use_naming_the_value(seed):
    with Buffer(None, small_config()) as buf:
        b = buf.config.buffer
        with pytest.raises(InputError, match=r"^SymmoeManager: num_experts=64, but the symmoe config \(given\) gives "
                                             r"32 at world size 1"):
            sm.SymmoeManager(None, 32, b.topk, 64, buffer=buf)
        with pytest.raises(InputError, match=r"^SymmoeManager: router_topk=8, but .* gives 4"):
            sm.SymmoeManager(None, 32, 8, 32, buffer=buf)
        with pytest.raises(InputError, match=r"^SymmoeManager: no symmoe config; pass symmoe_config="):
            sm.SymmoeManager(None, 32, 4, 32)
        m = sm.SymmoeManager(None, 32, b.topk, 32, buffer=buf)
        i, rmap, probs = _routing(buf, seed)
        with pytest.raises(InputError, match=r"^dispatch: setup_metadata\(routing_map, probs\) was not called"):
            m.dispatch(i.x)
        with pytest.raises(InputError, match=r"^get_number_of_tokens_per_expert: no dispatch has run yet$"):
            m.get_number_of_tokens_per_expert()
        with pytest.raises(InputError, match=r"^setup_metadata: routing_map has shape \(12, 16\); expected "
                                             r"\[num_tokens, 32\]"):
            m.setup_metadata(rmap[:, :16], probs)
        m.setup_metadata(rmap, probs)
        rows = m.dispatch(i.x)
        with pytest.raises(InputError, match=rf"^get_permuted_hidden_states_by_experts: hidden_states has shape "
                                             rf"\(3, 64\); expected the {rows.shape[0]} rows dispatch returned$"):
            m.get_permuted_hidden_states_by_experts(rows[:3])
        with pytest.raises(InputError, match=r"^get_restored_hidden_states_by_experts: get_permuted_hidden_states"):
            m.get_restored_hidden_states_by_experts(rows)
        perm, _ = m.get_permuted_hidden_states_by_experts(rows)
        with pytest.raises(InputError, match=rf"^get_restored_hidden_states_by_experts: hidden_states has shape "
                                             rf"\({perm.shape[0] + 1}, 64\); expected the {perm.shape[0]} permuted rows"):
            m.get_restored_hidden_states_by_experts(torch.cat([perm, perm[:1]]))
        m.combine(m.get_restored_hidden_states_by_experts(perm))
        with pytest.raises(InputError, match=r"^combine: no dispatch is waiting for its combine"):
            m.combine(rows)


def test_megatron_quantization_padding_is_refused_and_install_without_megatron_says_so(monkeypatch):
    class TConfig:
        moe_router_padding_for_quantization = True

    with Buffer(None, small_config()) as buf:
        with pytest.raises(InputError, match=r"^moe_router_padding_for_quantization=True: .*allowed: False$"):
            sm.SymmoeManager(None, 32, 4, 32, TConfig(), buffer=buf)
    monkeypatch.setattr(sm, "_MODULE", "symmoe_no_such_module.token_dispatcher")
    with pytest.raises(InputError, match=r"^install: symmoe_no_such_module.token_dispatcher does not import here"):
        sm.install(small_config())


def test_torchtitan_dispatcher_refuses_bad_use_naming_the_value(seed):
    cfg = small_config()
    d = SymmoeTokenDispatcher.Config(num_experts=32, top_k=4, symmoe_config=cfg).build()
    with pytest.raises(InputError, match=r"^dispatch: no Buffer yet; call wire_meshes\(ep_mesh=...\) first"):
        d.dispatch(torch.zeros(1, 64), torch.ones(1, 4), torch.zeros(1, 4, dtype=torch.long), torch.ones(32))
    with pytest.raises(InputError, match=r"^wire_meshes: ep_mesh=None; SymmoeTokenDispatcher needs expert parallelism"):
        d.wire_meshes(ep_mesh=None)
    with pytest.raises(InputError, match=r"^SymmoeTokenDispatcher: top_k=8, but the symmoe config \(given\) has "
                                         r"buffer.topk=4; set it to the model's$"):
        SymmoeTokenDispatcher.Config(num_experts=32, top_k=8, symmoe_config=cfg).build().init_buffer()
    with Buffer(None, small_config(**{"buffer.topk": 20})) as wide:
        with pytest.raises(InputError, match=r"^SymmoeTokenDispatcher: top_k=20 x 4 > hidden=64 \(torch.bfloat16\)"):
            SymmoeTokenDispatcher.from_buffer(wide)
    with Buffer(None, cfg) as buf:
        d = SymmoeTokenDispatcher.from_buffer(buf)
        i, _, _ = _routing(buf, seed)
        counts = torch.bincount(i.topk_idx[i.topk_idx >= 0], minlength=32)
        with pytest.raises(InputError, match=r"^dispatch: num_local_tokens_per_expert_E has shape \(16,\); expected "
                                             r"\(32,\), one count per expert$"):
            d.dispatch(i.x, i.topk_weights, i.topk_idx, counts[:16])
        with pytest.raises(InputError, match=r"^dispatch: topk_scores_TK has dtype torch.int64; expected a "
                                             r"floating-point tensor"):
            d.dispatch(i.x, i.topk_idx, i.topk_idx, counts)
        rows, sizes, meta = d.dispatch(i.x, i.topk_weights, i.topk_idx, counts)
        with pytest.raises(InputError, match=r"^combine: metadata is a dict; expected the SymmoeDispatchMetadata"):
            d.combine(rows, {"handle": meta.handle}, i.x)
        with pytest.raises(InputError, match=r"^combine: x_TD has shape \(5, 64\); the dispatch took 12 tokens$"):
            d.combine(rows, meta, i.x[:5])
        assert isinstance(meta, SymmoeDispatchMetadata) and int(sizes.sum()) == rows.shape[0]
