#!/usr/bin/python3
"""Convert the mini engine's trained weights (KVSW, models/mini/weights.h) to a GGUF file of
llama.cpp's "llama" architecture, so that llama.cpp runs the very model the mini engine runs.

    kvsw_to_gguf.py IN.kvsw OUT.gguf [--type f32|f16] [--context-length N]

Only numpy is needed. The mapping, and why each part of it holds:

- RMSNorm x * w / sqrt(mean(x^2) + eps), eps 1e-5 (model.c rmsnorm): llama.cpp's LLM_NORM_RMS with
  attention.layer_norm_rms_epsilon.
- RoPE on consecutive pairs (x[2i], x[2i+1]) with inv_freq 10000^(-2i/head_dim) over the whole head:
  the "normal" RoPE that the llama architecture uses (LLAMA_ROPE_TYPE_NORM), with
  rope.dimension_count = head_dim and rope.freq_base = 10000. Checkpoints of Hugging Face's Llama
  rotate the two halves of a head instead (NeoX), which is why their converters permute the rows
  of Q and K; the mini model already rotates pairs, so Q and K are written unpermuted.
- Grouped-query attention: query head h reads K/V head h / (heads / kv_heads), as ggml broadcasts.
- Scores scaled by 1/sqrt(head_dim), the llama default (no attention.scale key).
- SwiGLU: silu(x W1) * (x W3) W2, i.e. ffn_gate = W1, ffn_up = W3, ffn_down = W2.
- Untied output head: output.weight is written (llama.cpp would otherwise reuse token_embd).
- The mini model stores matrices input-major (w[in][out]); a GGUF matrix has ne = [in, out], i.e.
  out rows of in contiguous values, so every matrix is transposed. token_embd is [vocab][dim] in
  both and is copied as is.
- Tokens are bytes: tokenizer.ggml.model "none" with llama.vocab_size = 256. llama.cpp then has no
  text tokenizer and its callers pass token ids (a byte of text is its id).
"""

import argparse
import os
import struct
import sys

import numpy as np

KVSW_MAGIC = b"KVSWGT01"
KVSW_HEADER = 48

GGUF_ALIGNMENT = 32
GGUF_UINT32, GGUF_FLOAT32, GGUF_STRING = 4, 6, 8
GGML_TYPE = {"f32": 0, "f16": 1}
LLAMA_FTYPE = {"f32": 0, "f16": 1}  # general.file_type: LLAMA_FTYPE_ALL_F32, MOSTLY_F16

# The mini model's fixed hyperparameters (models/mini/model.c).
RMS_EPS = 1e-5
ROPE_BASE = 10000.0


class FormatError(Exception):
    pass


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_kvsw(path):
    """The shape and the weights of a KVSW file, checked as models/mini/weights.c checks them."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < KVSW_HEADER + 8 or data[:8] != KVSW_MAGIC:
        raise FormatError(f"{path}: not a KVSW weights file")
    fields = struct.unpack_from("<10I", data, 8)
    version, dim, layers, heads, kv_heads, ffn, vocab, prompt_len, desc_len, reserved = fields
    if version != 1 or reserved != 0:
        raise FormatError(f"{path}: format version {version} (this reads 1)")
    (stored_sum,) = struct.unpack_from("<Q", data, len(data) - 8)
    if fnv1a64(data[:-8]) != stored_sum:
        raise FormatError(f"{path}: checksum mismatch: file damaged")
    if dim % heads or (dim // heads) % 2 or heads % kv_heads:
        raise FormatError(f"{path}: inconsistent shape dim {dim} heads {heads} kv {kv_heads}")
    hd = dim // heads
    cfg = dict(dim=dim, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab, hd=hd)
    qw, kvw = heads * hd, kv_heads * hd
    per_layer = 2 * dim + dim * qw + 2 * dim * kvw + qw * dim + 3 * dim * ffn
    n_floats = 2 * vocab * dim + dim + layers * per_layer
    want = KVSW_HEADER + desc_len + 4 * n_floats + prompt_len + 4 * vocab + 8
    if want != len(data):
        raise FormatError(f"{path}: {len(data)} bytes where its shape needs {want}")
    floats = np.frombuffer(data, dtype="<f4", count=n_floats, offset=KVSW_HEADER + desc_len)
    if not np.all(np.isfinite(floats)):
        raise FormatError(f"{path}: a weight is not a finite number")

    pos = 0

    def take(*shape):
        nonlocal pos
        n = int(np.prod(shape))
        a = floats[pos : pos + n].reshape(shape)
        pos += n
        return a

    # The order of model.h (model_weights_floats): input-major matrices, w[in][out].
    w = {"embed": take(vocab, dim), "final_norm": take(dim), "wcls": take(dim, vocab), "layers": []}
    for _ in range(layers):
        w["layers"].append(
            {
                "attn_norm": take(dim),
                "ffn_norm": take(dim),
                "wq": take(dim, qw),
                "wk": take(dim, kvw),
                "wv": take(dim, kvw),
                "wo": take(qw, dim),
                "w1": take(dim, ffn),
                "w3": take(dim, ffn),
                "w2": take(ffn, dim),
            }
        )
    assert pos == n_floats
    return cfg, w


def gguf_tensors(cfg, w):
    """(name, array) in GGUF layout: a matrix as [out][in] (ne = [in, out])."""
    out = [
        ("token_embd.weight", w["embed"]),
        ("output_norm.weight", w["final_norm"]),
        ("output.weight", w["wcls"].T),
    ]
    for i, lw in enumerate(w["layers"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", lw["attn_norm"]),
            (b + "attn_q.weight", lw["wq"].T),
            (b + "attn_k.weight", lw["wk"].T),
            (b + "attn_v.weight", lw["wv"].T),
            (b + "attn_output.weight", lw["wo"].T),
            (b + "ffn_norm.weight", lw["ffn_norm"]),
            (b + "ffn_gate.weight", lw["w1"].T),
            (b + "ffn_up.weight", lw["w3"].T),
            (b + "ffn_down.weight", lw["w2"].T),
        ]
    return out


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value):
    head = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == GGUF_UINT32:
        return head + struct.pack("<I", value)
    if vtype == GGUF_FLOAT32:
        return head + struct.pack("<f", value)
    if vtype == GGUF_STRING:
        return head + gguf_string(value)
    raise ValueError(vtype)


def write_gguf(path, cfg, w, wtype, context_length):
    arch = "llama"
    name = "kvstrata-mini-{dim}x{layers}".format(**cfg)
    kvs = [
        ("general.architecture", GGUF_STRING, arch),
        ("general.name", GGUF_STRING, name),
        ("general.file_type", GGUF_UINT32, LLAMA_FTYPE[wtype]),
        (arch + ".vocab_size", GGUF_UINT32, cfg["vocab"]),
        (arch + ".context_length", GGUF_UINT32, context_length),
        (arch + ".embedding_length", GGUF_UINT32, cfg["dim"]),
        (arch + ".block_count", GGUF_UINT32, cfg["layers"]),
        (arch + ".feed_forward_length", GGUF_UINT32, cfg["ffn"]),
        (arch + ".attention.head_count", GGUF_UINT32, cfg["heads"]),
        (arch + ".attention.head_count_kv", GGUF_UINT32, cfg["kv_heads"]),
        (arch + ".attention.layer_norm_rms_epsilon", GGUF_FLOAT32, RMS_EPS),
        (arch + ".rope.dimension_count", GGUF_UINT32, cfg["hd"]),
        (arch + ".rope.freq_base", GGUF_FLOAT32, ROPE_BASE),
        ("tokenizer.ggml.model", GGUF_STRING, "none"),
    ]
    tensors = []
    for tname, a in gguf_tensors(cfg, w):
        # Norm vectors stay f32 in f16 files too, as llama.cpp's converters keep 1-D tensors.
        t = "f32" if a.ndim == 1 else wtype
        data = np.ascontiguousarray(a, dtype="<f4" if t == "f32" else "<f2").tobytes()
        tensors.append((tname, a.shape[::-1], GGML_TYPE[t], data))

    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for key, vtype, value in kvs:
        head += gguf_kv(key, vtype, value)
    offset = 0
    for tname, ne, ttype, data in tensors:
        head += gguf_string(tname) + struct.pack("<I", len(ne))
        head += struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", ttype, offset)
        offset += -(-len(data) // GGUF_ALIGNMENT) * GGUF_ALIGNMENT
    head += bytes(-len(head) % GGUF_ALIGNMENT)
    # Written beside the target and renamed: a reader never sees half a file.
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for _, _, _, data in tensors:
                f.write(data)
                f.write(bytes(-len(data) % GGUF_ALIGNMENT))
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv):
    ap = argparse.ArgumentParser(description="KVSW weights -> GGUF (llama architecture)")
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--type", choices=sorted(GGML_TYPE), default="f32",
                    help="type of the matrices (norm weights stay f32)")
    ap.add_argument("--context-length", type=int, default=256,
                    help="llama.context_length (the mini model was trained on 256 bytes)")
    a = ap.parse_args(argv)
    if a.context_length < 1:
        ap.error("--context-length must be positive")
    try:
        cfg, w = read_kvsw(a.input)
    except (OSError, FormatError) as e:
        print(f"kvsw_to_gguf: {e}", file=sys.stderr)
        return 1
    try:
        write_gguf(a.output, cfg, w, a.type, a.context_length)
    except OSError as e:
        print(f"kvsw_to_gguf: cannot write {a.output}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
