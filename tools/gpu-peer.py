#!/usr/bin/env python3
"""gpu-peer: the peer tools/gpu-check.sh measures piper-exec against: the same model trained by
PyTorch on the same GPU, eager and under torch.compile, SDPA attention (causal, grouped-query
heads), bf16 autocast over fp32 master weights, fused AdamW; tokens/s per mode.

The model is read from a piper model file (models/*.json: Hugging Face config keys plus the
"piper" block's seq_len and micro_batch_size), a Llama-style decoder as kernels/ describes it:
embedding, per layer RMSNorm -> attention (RoPE rotate-half, GQA) -> residual, RMSNorm ->
SwiGLU MLP -> residual, final RMSNorm, LM head (tied or not), mean cross-entropy. Tokens are
random (seeded), as piper-exec's synthetic data: only the speed is compared.

Usage: tools/gpu-peer.py --model M.json [--steps 5] [--warmup 2] [--modes eager,compile]
                         [--device cuda|cpu] [--json OUT.json] [--smoke]
--smoke shrinks the model to a CPU-sized shape (hidden 64, 2 layers, seq 32) to check the
script itself where no GPU is. Every part that cannot run (no PyTorch, no GPU, torch.compile
failing) is one line saying so; the exit status is 0 unless the arguments are wrong (2).
"""
import argparse
import json
import math
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(prog="gpu-peer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a piper model file (models/*.json)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per mode")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring")
    p.add_argument("--modes", default="eager,compile", help="eager, compile, or both")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--smoke", action="store_true", help="a CPU-sized model (checks the script)")
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "compile")]
    if bad or not modes or a.steps < 1 or a.warmup < 0:
        p.error(f"--modes takes eager and/or compile, --steps >= 1, --warmup >= 0 (got {a.modes!r})")
    a.modes = modes
    return a


def read_shape(path, smoke):
    """The model's shape from a piper model file; one line and exit 2 when it cannot be read."""
    try:
        with open(path) as f:
            m = json.load(f)
        pb = m.get("piper", {})
        s = {
            "hidden": int(m["hidden_size"]),
            "layers": int(m["num_hidden_layers"]),
            "heads": int(m["num_attention_heads"]),
            "kv_heads": int(m.get("num_key_value_heads", m["num_attention_heads"])),
            "ffn": int(m["intermediate_size"]),
            "vocab": int(m["vocab_size"]),
            "theta": float(m.get("rope_theta", 10000.0)),
            "eps": float(m.get("rms_norm_eps", 1e-6)),
            "tied": bool(m.get("tie_word_embeddings", False)),
            "seq": int(pb.get("seq_len", 1024)),
            "batch": int(pb.get("micro_batch_size", 1)),
        }
        s["head_dim"] = int(m.get("head_dim") or s["hidden"] // s["heads"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"gpu-peer.py: error: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if smoke:
        s.update(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=101,
                 seq=32, batch=2)
    return s


def build(torch, s):
    """The decoder as an nn.Module (fp32 parameters; autocast runs its GEMMs in bf16)."""
    nn, F = torch.nn, torch.nn.functional
    H, KV, D, C = s["heads"], s["kv_heads"], s["head_dim"], s["hidden"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(C))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + s["eps"])).type_as(x) * self.w

    def rope(x, cos, sin):  # x [B, heads, S, D], rotate-half pairs (i, i + D/2)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.wq = nn.Linear(C, H * D, bias=False)
            self.wk = nn.Linear(C, KV * D, bias=False)
            self.wv = nn.Linear(C, KV * D, bias=False)
            self.wo = nn.Linear(H * D, C, bias=False)
            self.wg = nn.Linear(C, s["ffn"], bias=False)
            self.wu = nn.Linear(C, s["ffn"], bias=False)
            self.wd = nn.Linear(s["ffn"], C, bias=False)

        def forward(self, x, cos, sin):
            B, S, _ = x.shape
            h = self.n1(x)
            q = self.wq(h).view(B, S, H, D).transpose(1, 2)
            k = self.wk(h).view(B, S, KV, D).transpose(1, 2)
            v = self.wv(h).view(B, S, KV, D).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if KV != H:  # grouped-query heads: each kv head serves H / KV query heads
                k = k.repeat_interleave(H // KV, dim=1)
                v = v.repeat_interleave(H // KV, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(a.transpose(1, 2).reshape(B, S, H * D))
            h = self.n2(x)
            return x + self.wd(F.silu(self.wg(h)) * self.wu(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(s["vocab"], C)
            self.layers = nn.ModuleList(Layer() for _ in range(s["layers"]))
            self.norm = RMSNorm()
            self.head = None if s["tied"] else nn.Linear(C, s["vocab"], bias=False)
            inv = 1.0 / (s["theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
            ang = torch.outer(torch.arange(s["seq"], dtype=torch.float64), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)

        def forward(self, tokens, targets):
            x = self.emb(tokens)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            x = self.norm(x)
            logits = x @ self.emb.weight.t() if self.head is None else self.head(x)
            return F.cross_entropy(logits.float().view(-1, s["vocab"]), targets.view(-1))

    return Model()


def flops_per_token(s):
    """Model FLOPs per token of a training step (6 per parameter-token of the GEMMs, plus the
    causal attention's 6 * 2 * S * D per head, half the score matrix), as MFU counts them."""
    C, L, F, V = s["hidden"], s["layers"], s["ffn"], s["vocab"]
    HD, KD = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    gemm = L * (C * HD * 2 + C * KD * 2 + 3 * C * F) + C * V
    attn = L * 6 * 2 * s["seq"] * HD / 2
    return 6 * gemm + attn


def run_mode(torch, s, mode, a):
    """Trains warmup + steps steps; returns the measured figures, or a one-line reason."""
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = build(torch, s).to(dev)
    fused = {"fused": True} if a.device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, **fused)
    step_fn = model
    if mode == "compile":
        step_fn = torch.compile(model)
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    shape = (s["batch"], s["seq"])
    tokens = torch.randint(0, s["vocab"], shape, generator=g).to(dev)
    targets = torch.randint(0, s["vocab"], shape, generator=g).to(dev)
    amp = torch.autocast(device_type=a.device, dtype=torch.bfloat16)
    times, losses = [], []
    for it in range(a.warmup + a.steps):
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with amp:
            loss = step_fn(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if it >= a.warmup:
            times.append(dt)
    step = statistics.median(times)
    tokens_per_step = s["batch"] * s["seq"]
    out = {"mode": mode, "step_s": step, "tokens_per_s": tokens_per_step / step,
           "loss_first": losses[0], "loss_last": losses[-1],
           "model_tflops_per_s": flops_per_token(s) * tokens_per_step / step / 1e12}
    if a.device == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def main(argv):
    a = parse_args(argv)
    s = read_shape(a.model, a.smoke)
    result = {"model": a.model, "shape": s, "device": a.device, "modes": {}}
    try:
        import torch
    except ImportError as e:
        print(f"gpu-peer: skip: PyTorch is not installed here ({e})")
        return finish(result, a)
    result["torch"] = torch.__version__
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-peer: skip: PyTorch {torch.__version__} sees no CUDA device")
        return finish(result, a)
    if a.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    for mode in a.modes:
        try:
            r = run_mode(torch, s, mode, a)
        except Exception as e:  # one line per part that cannot run, then the next part
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            print(f"gpu-peer: {mode}: skip: {type(e).__name__}: {first}")
            result["modes"][mode] = {"skipped": first}
            if a.device == "cuda":
                torch.cuda.empty_cache()
            continue
        result["modes"][mode] = r
        print(f"gpu-peer: pytorch {torch.__version__} {mode} ({a.device}, bf16 autocast, SDPA): "
              f"{r['tokens_per_s']:.0f} tokens/s, step {r['step_s'] * 1e3:.1f} ms, "
              f"{r['model_tflops_per_s']:.1f} model TFLOP/s, loss {r['loss_first']:.4f} -> "
              f"{r['loss_last']:.4f}")
        if not math.isfinite(r["loss_last"]):
            print(f"gpu-peer: {mode}: the loss is not finite")
    return finish(result, a)


def finish(result, a):
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
