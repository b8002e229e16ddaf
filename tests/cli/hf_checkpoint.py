#!/usr/bin/env python3
"""Tiny Hugging Face checkpoints for tests/cli/test_hf.sh, with the standard library only.

  hf_checkpoint.py make DIR MODEL_JSON DTYPE SHARDS SEED  write DIR/config.json, the safetensors
      (SHARDS files with model.safetensors.index.json when > 1) of a llama model of random
      weights in DTYPE (F32, BF16, F16), and MODEL_JSON (config.json + Piper's training fields)
  hf_checkpoint.py expect DIR OUT  the checkpoint's values in Piper's parameter order (float32,
      what --dump-params writes), transposing every nn.Linear weight from HF's [out, in]
  hf_checkpoint.py same DIR_A DIR_B  every tensor of A in B with its shape and equal values
  hf_checkpoint.py loss DIR DATA N S  the mean next-token loss of Hugging Face's Llama (its
      modeling_llama.py written out in numpy: [out, in] weights, rotate_half RoPE, grouped KV
      heads) on N sequences of S tokens laid S apart in the byte file DATA (needs numpy)
"""
import json
import os
import random
import struct
import sys

CONFIG = {
    "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 256,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-05, "architectures": ["LlamaForCausalLM"],
}


def shapes(c):
    """(name, HF shape, transposed in Piper's block) in Piper's model order."""
    C, F, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D = C // c["num_attention_heads"]
    HD, KD = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    out = [("model.embed_tokens.weight", [V, C], False)]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", [C], False),
                (p + "self_attn.q_proj.weight", [HD, C], True),
                (p + "self_attn.k_proj.weight", [KD, C], True),
                (p + "self_attn.v_proj.weight", [KD, C], True),
                (p + "self_attn.o_proj.weight", [C, HD], True),
                (p + "post_attention_layernorm.weight", [C], False),
                (p + "mlp.gate_proj.weight", [F, C], True),
                (p + "mlp.up_proj.weight", [F, C], True),
                (p + "mlp.down_proj.weight", [C, F], True)]
    out += [("model.norm.weight", [C], False), ("lm_head.weight", [V, C], True)]
    return out


def count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u += 0x7FFF + ((u >> 16) & 1)
    return struct.pack("<H", (u >> 16) & 0xFFFF)


def encode(values, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    return b"".join(bf16(v) for v in values)


def decode(raw, dtype, n):
    if dtype == "F32":
        return list(struct.unpack("<%df" % n, raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % n, raw))
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
            for h in struct.unpack("<%dH" % n, raw)]


def write_file(path, tensors, dtype):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, values in tensors:
        blob = encode(values, dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_dir(d):
    """name -> (dtype, shape, values) of every tensor in d (index or model.safetensors)."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for fn in files:
        raw = open(os.path.join(d, fn), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, e in header.items():
            if name == "__metadata__":
                continue
            lo, hi = e["data_offsets"]
            out[name] = (e["dtype"], e["shape"],
                         decode(raw[8 + n + lo:8 + n + hi], e["dtype"], count(e["shape"])))
    return out


def make(d, model_json, dtype, shards, seed):
    rng = random.Random(seed)
    os.makedirs(d, exist_ok=True)
    tensors = []
    for name, shape, _ in shapes(CONFIG):
        if len(shape) == 1:
            values = [1.0 + rng.gauss(0, 0.1) for _ in range(count(shape))]
        else:
            # queries and keys large enough that attention (and so RoPE) matters to the loss
            sd = 0.25 if "q_proj" in name or "k_proj" in name else 0.05
            values = [rng.gauss(0, sd) for _ in range(count(shape))]
        tensors.append((name, shape, values))
    weight_map = {}
    for k in range(shards):
        part = tensors[k::shards]
        fn = "model.safetensors" if shards == 1 else \
            "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        write_file(os.path.join(d, fn), part, dtype)
        weight_map.update({t[0]: fn for t in part})
    if shards > 1:
        json.dump({"metadata": {}, "weight_map": weight_map},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump(CONFIG, open(os.path.join(d, "config.json"), "w"))
    model = {k: v for k, v in CONFIG.items() if k != "architectures"}
    model["piper"] = {"seq_len": 16, "micro_batch_size": 2, "dtype": "fp32", "pp_regions": 2}
    json.dump(model, open(model_json, "w"))


def expect(d, out):
    got, values = read_dir(d), []
    for name, shape, transposed in shapes(CONFIG):
        v = got[name][2]
        if transposed:
            rows, cols = shape
            v = [v[r * cols + c] for c in range(cols) for r in range(rows)]
        values += v
    open(out, "wb").write(struct.pack("<%df" % len(values), *values))


def same(a, b):
    ta, tb = read_dir(a), read_dir(b)
    assert sorted(ta) == sorted(tb), (sorted(set(ta) ^ set(tb)))
    for name in ta:
        assert ta[name][1] == tb[name][1], (name, ta[name][1], tb[name][1])
        assert ta[name][2] == tb[name][2], (name, "values differ")


def hf_loss(d, data, n, s):
    import numpy as np
    w = {k: np.array(v[2], dtype=np.float64).reshape(v[1]) for k, v in read_dir(d).items()}
    c = CONFIG
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    D = c["hidden_size"] // H
    eps, theta = c["rms_norm_eps"], 10000.0
    raw = open(data, "rb").read()
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    ang = np.outer(np.arange(s), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x):  # [S, heads, D]
        half = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
        return x * cos[:, None, :] + half * sin[:, None, :]

    total = 0.0
    for q in range(n):
        tok = np.frombuffer(raw[q * s:q * s + s + 1], dtype=np.uint8).astype(int)
        x = w["model.embed_tokens.weight"][tok[:-1]]
        for i in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % i
            h = norm(x, w[p + "input_layernorm.weight"])
            qs = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(s, H, D))
            ks = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(s, KV, D))
            vs = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(s, KV, D)
            y = np.zeros((s, H, D))
            for j in range(H):
                sc = qs[:, j] @ ks[:, j // (H // KV)].T / np.sqrt(D)
                sc = sc + np.triu(np.full((s, s), -np.inf), 1)
                pr = np.exp(sc - sc.max(-1, keepdims=True))
                y[:, j] = (pr / pr.sum(-1, keepdims=True)) @ vs[:, j // (H // KV)]
            x = x + y.reshape(s, H * D) @ w[p + "self_attn.o_proj.weight"].T
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
                w[p + "mlp.down_proj.weight"].T
        logits = norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
        m = logits.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
        total += (lse - logits[np.arange(s), tok[1:]]).sum()
    return total / (n * s)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    elif cmd == "expect":
        expect(sys.argv[2], sys.argv[3])
    elif cmd == "loss":
        print(repr(float(hf_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))))
    elif cmd == "same":
        same(sys.argv[2], sys.argv[3])
    else:
        sys.exit("unknown command " + cmd)
