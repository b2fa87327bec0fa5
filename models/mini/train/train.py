#!/usr/bin/python3
"""Train the mini engine's transformer on English text and export it for `kvs-mini-engine --weights`.

The model is exactly the architecture of models/mini/model.c: token embedding, per layer
RMSNorm (eps 1e-5) -> Q, K, V projections without bias, RoPE on consecutive pairs (angle
pos * 10000^(-2i/head_dim)), causal grouped-query attention scaled by 1/sqrt(head_dim), output
projection, residual; RMSNorm -> SwiGLU (silu(x W1) * (x W3)) W2, residual; final RMSNorm and an
untied output head. Tokens are bytes (vocabulary 256), so any text is a prompt.

Corpus: the reStructuredText sources of the Python documentation shipped by Debian's `python3-doc`
(/usr/share/doc/python3.X/html/_sources, PSF License Version 2, see the package's copyright file),
files in sorted order; every 20th file is held out for validation.

Run with Debian's interpreter (it has python3-torch):
    /usr/bin/python3 models/mini/train/train.py --out models/mini/train/mini-256.kvsw
CI never runs this: the checkpoint is committed. See README.md beside this file.
"""
import argparse
import glob
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

MAGIC = b"KVSWGT01"
SAMPLE_BYTES = 131072


def corpus_files(root):
    if root is None:
        cands = sorted(glob.glob("/usr/share/doc/python3*/html/_sources"))
        if not cands:
            sys.exit("train.py: no Python documentation sources; apt-get install python3-doc")
        root = cands[-1]
    files = sorted(glob.glob(os.path.join(root, "**", "*.txt"), recursive=True))
    if not files:
        sys.exit("train.py: no .txt files under " + root)
    return root, files


def load_corpus(files):
    train, val = bytearray(), bytearray()
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            b = fh.read() + b"\n\n"
        (val if i % 20 == 0 else train).extend(b)
    return bytes(train), bytes(val)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        hd = c["dim"] // c["heads"]
        self.attn_norm = torch.nn.Parameter(torch.ones(c["dim"]))
        self.ffn_norm = torch.nn.Parameter(torch.ones(c["dim"]))
        self.wq = torch.nn.Linear(c["dim"], c["heads"] * hd, bias=False)
        self.wk = torch.nn.Linear(c["dim"], c["kv_heads"] * hd, bias=False)
        self.wv = torch.nn.Linear(c["dim"], c["kv_heads"] * hd, bias=False)
        self.wo = torch.nn.Linear(c["heads"] * hd, c["dim"], bias=False)
        self.w1 = torch.nn.Linear(c["dim"], c["ffn"], bias=False)
        self.w3 = torch.nn.Linear(c["dim"], c["ffn"], bias=False)
        self.w2 = torch.nn.Linear(c["ffn"], c["dim"], bias=False)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x, cos, sin):
    # x: [B, H, T, hd]; pairs (2i, 2i+1) rotated by angle pos * inv_freq[i]
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = torch.nn.Embedding(c["vocab"], c["dim"])
        self.blocks = torch.nn.ModuleList([Block(c) for _ in range(c["layers"])])
        self.final_norm = torch.nn.Parameter(torch.ones(c["dim"]))
        self.wcls = torch.nn.Linear(c["dim"], c["vocab"], bias=False)
        hd = c["dim"] // c["heads"]
        inv = torch.tensor([10000.0 ** (-2.0 * i / hd) for i in range(hd // 2)], dtype=torch.float32)
        self.register_buffer("inv_freq", inv, persistent=False)
        mask = torch.triu(torch.ones(4096, 4096, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, tokens):
        c = self.c
        B, T = tokens.shape
        hd = c["dim"] // c["heads"]
        group = c["heads"] // c["kv_heads"]
        pos = torch.arange(T, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        x = self.embed(tokens)
        for blk in self.blocks:
            h = rmsnorm(x, blk.attn_norm)
            q = blk.wq(h).view(B, T, c["heads"], hd).transpose(1, 2)
            k = blk.wk(h).view(B, T, c["kv_heads"], hd).transpose(1, 2)
            v = blk.wv(h).view(B, T, c["kv_heads"], hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
            a = att @ v
            x = x + blk.wo(a.transpose(1, 2).reshape(B, T, c["heads"] * hd))
            h = rmsnorm(x, blk.ffn_norm)
            x = x + blk.w2(F.silu(blk.w1(h)) * blk.w3(h))
        return self.wcls(rmsnorm(x, self.final_norm))


def batches(data, batch, seq, gen):
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    idx = starts[:, None] + torch.arange(seq + 1)[None, :]
    chunk = buf[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def val_loss(model, val, seq, n_batches=32, batch=16):
    gen = torch.Generator().manual_seed(1234)
    total = 0.0
    for _ in range(n_batches):
        x, y = batches(val, batch, seq, gen)
        total += F.cross_entropy(model(x).reshape(-1, model.c["vocab"]), y.reshape(-1)).item()
    return total / n_batches


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def export(model, path, meta, prompt):
    """The KVSW format (models/mini/weights.h): a header, then fp32 little-endian arrays in
    the C model's input-major order, then the reference the loader's test compares against."""
    c = model.c
    arrays = [model.embed.weight, model.final_norm, model.wcls.weight.t()]
    for blk in model.blocks:
        arrays += [blk.attn_norm, blk.ffn_norm, blk.wq.weight.t(), blk.wk.weight.t(),
                   blk.wv.weight.t(), blk.wo.weight.t(), blk.w1.weight.t(), blk.w3.weight.t(),
                   blk.w2.weight.t()]
    body = b"".join(a.detach().contiguous().float().numpy().astype("<f4").tobytes() for a in arrays)
    with torch.no_grad():
        ref = model(torch.tensor([list(prompt)], dtype=torch.long))[0, -1]
    ref_bytes = ref.float().numpy().astype("<f4").tobytes()
    desc = json.dumps(meta, sort_keys=True).encode()
    head = struct.pack("<8s10I", MAGIC, 1, c["dim"], c["layers"], c["heads"], c["kv_heads"],
                       c["ffn"], c["vocab"], len(prompt), len(desc), 0)
    payload = head + desc + body + bytes(prompt) + ref_bytes
    with open(path, "wb") as fh:
        fh.write(payload + struct.pack("<Q", fnv1a64(payload)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", help="directory of .txt files (default: python3-doc's sources)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--sample-only", action="store_true",
                    help="write only the held-out text sample beside --out, no training")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    root, files = corpus_files(a.corpus)
    train, val = load_corpus(files)
    sample = os.path.splitext(a.out)[0] + ".sample.txt"
    with open(sample, "wb") as fh:  # prompts for quality runs: held-out text the model never saw
        fh.write(val[:SAMPLE_BYTES])
    if a.sample_only:
        return
    c = dict(dim=a.dim, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads, ffn=a.ffn, vocab=256)
    model = Model(c)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"corpus {root}: {len(files)} files, train {len(train)} bytes, val {len(val)} bytes; "
          f"{n_params} parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(a.seed)
    warm = max(1, a.steps // 20)
    t0 = time.time()
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batches(train, a.batch, a.seq, gen)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} {time.time() - t0:.0f} s",
                  flush=True)
    vl = val_loss(model, val, a.seq)
    meta = dict(corpus="python3-doc " + root, licence="PSF License Version 2", files=len(files),
                train_bytes=len(train), val_bytes=len(val), steps=a.steps, batch=a.batch,
                seq=a.seq, lr=a.lr, seed=a.seed, params=n_params, val_loss_nats=round(vl, 4),
                val_bits_per_byte=round(vl / math.log(2), 4), tokenizer="bytes",
                train_seconds=round(time.time() - t0))
    prompt = val[:64]
    export(model, a.out, meta, prompt)
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
