import os, sys, torch
from symmoe import Buffer
from symmoe.config import Config, from_dict
T = int(sys.argv[1]); H = int(sys.argv[2]); sms = int(sys.argv[3])
base = {"backend": "torch", "buffer.hidden": H, "buffer.max_tokens_per_rank": T, "buffer.topk": 8,
        "buffer.num_experts": 64, "buffer.expert_alignment": 4, "buffer.dtype": "bfloat16",
        "kernel.timeout_s": 5.0, "kernel.num_sms": sms, "torch.allow_overlapping_devices": True,
        "buffer.output_layout": "expert", "kernel.fan_phases": os.environ.get("SYMMOE_DBG_PHASES", "block")}
cfg = from_dict(Config().replace(**base).to_dict())
torch.manual_seed(0)
with Buffer(None, cfg) as buf:
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    idx = torch.rand(T, 64, device="cuda").topk(8, dim=1).indices
    w = torch.rand(T, 8, device="cuda")
    import symmoe.protocol.cuda as pc
    print("dispatch", T, H, sms, type(buf._protocol), flush=True)
    r = buf.dispatch(x, idx, w)
    torch.cuda.synchronize()
    print("ok fused=", buf._protocol.routed_in_fan_out, r[0].shape, flush=True)
    p = buf._protocol
    print("summary", p._summary_np[:8].tolist() if hasattr(p, "_summary_np") else None, flush=True)
