"""A llama-architecture GGUF with random weights, written with numpy only (no `gguf` package).

The format is GGUF version 3 (llama.cpp's `ggml/include/gguf.h`), little-endian, as the
Rust writer of `cargo xtask fixtures` (xtask/src/fixtures/gguf.rs) writes it: magic, version,
tensor count, key/value count, the key/values, the tensor infos (name, dims, ggml type,
offset), padding to `general.alignment`, then each tensor's data padded the same way.

The matrices are F16 and the norms F32 (`general.file_type` 1, mostly F16); the vocabulary is
the small SentencePiece one of the `tiny-llama` fixture (byte fallback tokens, `<s>`, `</s>`,
ChatML markers), which llama.cpp's `llama` tokenizer loads. Values are N(0, 0.02) from one
seeded pool of random numbers, tiled, so a few GB are written at disk speed.

    python3 gguf.py OUT.gguf [--embd 4096] [--layers 8] [--ff 11008] [--head-dim 128]
"""
import argparse
import json
import struct
import sys
import time

import numpy as np

ALIGNMENT = 32
GGML_F32, GGML_F16 = 0, 1
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Elements in the pool of random numbers the tensors are cut from (64 MiB of F16).
POOL = 32 << 20


def spm_vocab():
    """(piece, score, type) as in xtask/src/fixtures.rs's `spm_vocab`."""
    vocab = [("<unk>", 0.0, UNKNOWN), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL)]
    vocab += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [str(d) for d in range(10)] + list(".,!?:'-")
    pieces += ["\u2581" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["th", "he", "in", "er", "an", "on", "re", "at", "ll", "lo", "or", "ld"]
    words = ["th", "the", "an", "and", "is", "to", "of", "in", "he", "hel", "hell", "hello",
             "wor", "world", "yo", "you", "it", "wh", "what", "on", "one"]
    pieces += ["\u2581" + w for w in words]
    n = len(pieces)
    vocab += [(p, -float(n - i), NORMAL) for i, p in enumerate(pieces)]
    vocab += [("<|im_start|>", 0.0, CONTROL), ("<|im_end|>", 0.0, CONTROL)]
    return vocab


def padded(n):
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class Writer:
    """Key/values and tensor infos in insertion order; tensor data streamed at the end."""

    def __init__(self):
        self.kvs = []
        self.tensors = []  # (name, dims in ggml order, ggml type, fill)

    def kv(self, key, kind, value):
        self.kvs.append((key, kind, value))

    def tensor(self, name, dims, kind, fill):
        self.tensors.append((name, dims, kind, fill))

    @staticmethod
    def _str(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def _value(self, kind, value):
        if kind == T_UINT32:
            return struct.pack("<II", kind, value)
        if kind == T_FLOAT32:
            return struct.pack("<If", kind, value)
        if kind == T_BOOL:
            return struct.pack("<IB", kind, int(value))
        if kind == T_STRING:
            return struct.pack("<I", kind) + self._str(value)
        item, items = value
        head = struct.pack("<IIQ", T_ARRAY, item, len(items))
        if item == T_STRING:
            return head + b"".join(self._str(s) for s in items)
        dtype = {T_FLOAT32: "<f4", T_INT32: "<i4"}[item]
        return head + np.asarray(items, dtype=dtype).tobytes()

    @staticmethod
    def nbytes(dims, kind):
        return int(np.prod(dims)) * (4 if kind == GGML_F32 else 2)

    def write(self, path, pool):
        with open(path, "wb") as out:
            out.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kvs)))
            for key, kind, value in self.kvs:
                out.write(self._str(key) + self._value(kind, value))
            offset = 0
            for name, dims, kind, _ in self.tensors:
                out.write(self._str(name) + struct.pack("<I", len(dims)))
                out.write(struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", kind, offset))
                offset += padded(self.nbytes(dims, kind))
            out.write(b"\0" * (padded(out.tell()) - out.tell()))
            for i, (_, dims, kind, fill) in enumerate(self.tensors):
                n = int(np.prod(dims))
                if fill == "random":
                    # Tiled from the pool, each tensor starting elsewhere in it.
                    start = (i * 7919 * 4096) % POOL
                    while n > 0:
                        take = min(n, POOL - start)
                        out.write(memoryview(pool[start:start + take]))
                        n -= take
                        start = 0
                else:
                    out.write(np.full(n, fill, dtype="<f4").tobytes())
                out.write(b"\0" * (padded(out.tell()) - out.tell()))
            return out.tell()


def llama(embd, layers, ff, head_dim):
    """The writer for a llama model of these sizes (KV heads: a quarter of the heads)."""
    heads = max(1, embd // head_dim)
    heads_kv = max(1, heads // 4)
    vocab = spm_vocab()
    ids = {p: i for i, (p, _, _) in enumerate(vocab)}
    w = Writer()
    u32 = lambda k, v: w.kv(k, T_UINT32, v)  # noqa: E731
    w.kv("general.architecture", T_STRING, "llama")
    w.kv("general.name", T_STRING, "Hangar GPU check llama (random weights)")
    u32("general.alignment", ALIGNMENT)
    u32("general.file_type", 1)  # MOSTLY_F16
    u32("llama.context_length", 4096)
    u32("llama.embedding_length", embd)
    u32("llama.block_count", layers)
    u32("llama.feed_forward_length", ff)
    u32("llama.attention.head_count", heads)
    u32("llama.attention.head_count_kv", heads_kv)
    u32("llama.rope.dimension_count", head_dim)
    w.kv("llama.rope.freq_base", T_FLOAT32, 10000.0)
    w.kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5)
    u32("llama.vocab_size", len(vocab))
    w.kv("tokenizer.ggml.model", T_STRING, "llama")
    w.kv("tokenizer.ggml.pre", T_STRING, "default")
    w.kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, [v[0] for v in vocab]))
    w.kv("tokenizer.ggml.scores", T_ARRAY, (T_FLOAT32, [v[1] for v in vocab]))
    w.kv("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, [v[2] for v in vocab]))
    u32("tokenizer.ggml.bos_token_id", ids["<s>"])
    u32("tokenizer.ggml.eos_token_id", ids["</s>"])
    u32("tokenizer.ggml.eot_token_id", ids["<|im_end|>"])
    u32("tokenizer.ggml.unknown_token_id", ids["<unk>"])
    w.kv("tokenizer.ggml.add_bos_token", T_BOOL, True)
    w.kv("tokenizer.ggml.add_eos_token", T_BOOL, False)
    w.kv("tokenizer.chat_template", T_STRING, CHATML)
    q, kv = heads * head_dim, heads_kv * head_dim
    w.tensor("token_embd.weight", [embd, len(vocab)], GGML_F16, "random")
    for i in range(layers):
        b = f"blk.{i}."
        w.tensor(b + "attn_norm.weight", [embd], GGML_F32, 1.0)
        w.tensor(b + "attn_q.weight", [embd, q], GGML_F16, "random")
        w.tensor(b + "attn_k.weight", [embd, kv], GGML_F16, "random")
        w.tensor(b + "attn_v.weight", [embd, kv], GGML_F16, "random")
        w.tensor(b + "attn_output.weight", [q, embd], GGML_F16, "random")
        w.tensor(b + "ffn_norm.weight", [embd], GGML_F32, 1.0)
        w.tensor(b + "ffn_gate.weight", [embd, ff], GGML_F16, "random")
        w.tensor(b + "ffn_down.weight", [ff, embd], GGML_F16, "random")
        w.tensor(b + "ffn_up.weight", [embd, ff], GGML_F16, "random")
    w.tensor("output_norm.weight", [embd], GGML_F32, 1.0)
    w.tensor("output.weight", [embd, len(vocab)], GGML_F16, "random")
    shape = {"embd": embd, "layers": layers, "ff": ff, "heads": heads, "heads_kv": heads_kv,
             "head_dim": head_dim, "vocab": len(vocab), "tensors": len(w.tensors)}
    return w, shape


def write(path, embd=4096, layers=8, ff=11008, head_dim=128, seed=20240611):
    """Writes the model to `path`; what was written (shape, bytes, seconds)."""
    started = time.monotonic()
    pool = (np.random.default_rng(seed).standard_normal(POOL, dtype=np.float32) * 0.02)
    pool = pool.astype("<f2")
    w, shape = llama(embd, layers, ff, head_dim)
    size = w.write(path, pool)
    return {"path": str(path), "bytes": size, "mib": size >> 20, "shape": shape,
            "seconds": round(time.monotonic() - started, 2)}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--embd", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ff", type=int, default=11008)
    p.add_argument("--head-dim", type=int, default=128)
    a = p.parse_args(argv)
    print(json.dumps(write(a.out, a.embd, a.layers, a.ff, a.head_dim)))


if __name__ == "__main__":
    main(sys.argv[1:])
