#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/: small valid inputs and near-misses that
give libFuzzer a head start. Run from the repository root; files named regress-* (inputs that
once broke memplan) are never touched."""
import json
import pickle
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    folder = os.path.join(ROOT, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    header, blobs, offset = {}, b"", 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs += blob
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blobs


def idx_pair(count, rows, cols, labels):
    images = struct.pack(">IIII", 0x803, count, rows, cols) + bytes(range(count * rows * cols))
    label_file = struct.pack(">II", 0x801, count) + bytes(labels)
    return struct.pack("<I", len(images)) + images + label_file


for i, text in enumerate(["24GiB", "80GB", "16000MiB", "1.5 TiB", "4096", "1e3 kb", "0.5B", "-1", "nan", "9e18"]):
    write("byte_size", f"seed-{i}", text)

write("minimalloc_csv", "seed-basic", "id,lower,upper,size\na,0,3,16\nb,1,4,32\nc,3,5,8\n")
write("minimalloc_csv", "seed-offsets", "id,lower,upper,size,offset\na,0,2,10,0\nb,1,3,10,10\n")
write("minimalloc_csv", "seed-reordered", "size,upper,id,lower\r\n4,2,x,0\r\n\r\n8,9,y,1\r\n")
write("minimalloc_csv", "seed-bad", "id,lower,upper,size\na,0,0,16\n")
write("minimalloc_csv", "seed-zeros", b"\0" * 5000)  # /dev/zero's first bytes: no line ends
write("minimalloc_csv", "seed-long-line", "id,lower,upper,size\n" + "7" * 4097 + ",0,1,8\n")

write("idx", "seed-valid", idx_pair(2, 2, 3, [1, 9]))
write("idx", "seed-truncated", idx_pair(2, 2, 3, [1, 9])[:-3])
write("idx", "seed-badlabel", idx_pair(1, 1, 1, [10]))
# A header announcing 2^32 images of 4096x4096 pixels, and zeros where a header should be.
huge = struct.pack(">IIII", 0x803, 0xFFFFFFFF, 4096, 4096)
write("idx", "seed-huge-header", struct.pack("<I", len(huge)) + huge + struct.pack(">II", 0x801, 0xFFFFFFFF))
write("idx", "seed-zeros", b"\0" * 64)

f32 = struct.pack("<4f", 1, 2, 3, 4)
write("safetensors", "seed-valid", safetensors([("w", "F32", [2, 2], f32), ("b", "I64", [1], struct.pack("<q", 7))],
                                               {"memplan.step": "3", "memplan.model": "mlp"}))
write("safetensors", "seed-empty-shape", safetensors([("s", "F32", [], f32[:4]), ("z", "BF16", [0, 5], b"")]))
write("safetensors", "seed-truncated", safetensors([("w", "F32", [2, 2], f32)])[:-5])
write("safetensors", "seed-zeros", b"\0" * 64)  # header length 0
# The header announces 16 data bytes; none follow.
write("safetensors", "seed-announces-more", safetensors([("w", "F32", [2, 2], f32)])[:-16])
write("safetensors", "seed-hostile-gpt-config", safetensors([], {
    "memplan.model": "gpt", "memplan.vocab_hex": "6162",
    "memplan.config": json.dumps({"vocab": 2, "context": 10**15, "layers": 10**9, "heads": 1, "width": 8,
                                  "tied_head": True})}))
write("safetensors", "seed-gpt-metadata", safetensors([("w", "F16", [2], b"\0\0\0\0")],
                                                      {"memplan.model": "gpt", "memplan.gpt.context": "8",
                                                       "memplan.gpt.layers": "1", "memplan.gpt.heads": "2",
                                                       "memplan.gpt.width": "16", "memplan.vocab": "616263"}))
write("safetensors", "seed-config-decoder", safetensors([("w", "F32", [1], f32[:4])], {
    "memplan.model": "tiny.json", "memplan.context": "16", "memplan.vocab_hex": "61626364",
    "memplan.hf_config": json.dumps({"model_type": "mixtral", "hidden_size": 16, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "intermediate_size": 24, "vocab_size": 32,
                                     "max_position_embeddings": 64, "num_local_experts": 4})}))
write("safetensors", "seed-hostile-config-decoder", safetensors([], {
    "memplan.model": "x.json", "memplan.context": "1000000000000", "memplan.vocab_hex": "6162",
    "memplan.hf_config": json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1000000,
                                     "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 2,
                                     "max_position_embeddings": 4096})}))

cli_cases = [
    ["fit", "--model", "mlp", "--budget", "1GiB"],
    ["plan", "--model", "cnn", "--batch", "8", "--json"],
    ["train", "--model", "gpt", "--seq", "16", "--lr", "nan"],
    ["train", "--hidden", "3,-4", "--steps", "2"],
    ["compare", "--model", "mlp", "--batch", "-1", "--alloc-conf", "expandable_segments:True"],
    ["solve", "--problem", "x.csv", "--solver", "exact", "--time-limit", "inf"],
    ["sample", "--weights", "w.safetensors", "--length", "1e99"],
    ["--help"],
    ["fit", "--model", "llama2-7b", "--batch", "4000000000", "--budget", "80GiB"],
    ["plan", "--model", "vit-b16", "--image-size", "1600000"],
    ["train", "--model", "gpt", "--layers", "1000000000", "--width", "4000000000000"],
    ["solve", "--input", "/dev/zero"],
]
for i, args in enumerate(cli_cases):
    write("cli", f"seed-{i}", b"\0".join(a.encode() for a in args))

write("solver", "seed-small", bytes([6, 0, 10, 0, 0x09, 0, 20, 0, 0x11, 2, 5, 0, 0x02, 4, 7, 1, 0x1a, 3, 9, 0, 0, 6, 3, 3, 0, 1]))
write("solver", "seed-capacity", bytes([4, 0x01, 100, 0, 0, 0, 100, 0, 8, 0, 100, 0, 16, 1, 50, 0, 0, 3, 200, 0, 0, 0]))
write("solver", "seed-huge", bytes([11, 0x06] + [255, 255, 0, 0] * 11))
write("solver", "seed-fixed", bytes([3, 0x08, 16, 0, 0x80, 0, 0, 0, 16, 0, 0x80, 1, 32, 0, 16, 0, 0, 0]))

for i, text in enumerate(["max_split_size_mb:100,expandable_segments:True",
                          "roundup_power2_divisions:[64:8,>:1],garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
                          "roundup_power2_divisions:4", "expandable_segments:False", "max_split_size_mb:-3"]):
    write("alloc_conf", f"seed-{i}", text)

write("text", "seed-fortune", b"\x03" + b"A fool and his money are soon parted.\n\n%\nTime flies.\n")
write("text", "seed-binary", bytes([1]) + bytes(range(256)))


def snapshot(events, segments=()):
    return pickle.dumps({"segments": list(segments), "device_traces": [events],
                         "allocator_settings": {"max_split_size": -1, "expandable_segments": False},
                         "external_annotations": []}, protocol=4)


MiB = 1 << 20
frames = [{"filename": "/home/u/model.py", "line": 3, "name": "forward"}]
write("snapshot", "seed-fresh", snapshot([
    {"action": "segment_alloc", "addr": 1 << 40, "size": 2 * MiB, "stream": 0, "frames": frames},
    {"action": "alloc", "addr": 1 << 40, "size": 4000, "stream": 0, "frames": frames},
    {"action": "free_requested", "addr": 1 << 40, "size": 4000, "stream": 0, "frames": frames},
    {"action": "free_completed", "addr": 1 << 40, "size": 4000, "stream": 0, "frames": frames}]))
write("snapshot", "seed-late-start", snapshot(
    [{"action": "free_completed", "addr": (1 << 40) + 4 * MiB, "size": 6 * MiB},
     {"action": "alloc", "addr": (1 << 40) + 4 * MiB, "size": 8 * MiB}],
    [{"device": 0, "address": 1 << 40, "total_size": 20 * MiB, "segment_type": "large",
      "blocks": [{"address": 1 << 40, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated"},
                 {"address": (1 << 40) + 4 * MiB, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated"},
                 {"address": (1 << 40) + 12 * MiB, "size": 8 * MiB, "state": "inactive"}]}]))
write("snapshot", "seed-oom", snapshot([{"action": "oom", "addr": 0, "device_free": MiB, "size": 64 * MiB}]))
write("snapshot", "seed-global", b"\x80\x02cos\nsystem\n(S'true'\ntR.")
write("snapshot", "seed-truncated", snapshot([{"action": "alloc", "addr": 4096, "size": 512}])[:-7])
write("snapshot", "seed-deep", b"\x80\x02" + b"]" * 3000 + b".")

# ONNX: the committed small CNN fixture (tests/golden/make_onnx_fixtures.py), cut short, and bytes
# that are no protobuf.
with open(os.path.join(os.path.dirname(ROOT), "..", "tests", "data", "onnx", "small_cnn.onnx"), "rb") as f:
    cnn = f.read()
write("onnx", "seed-small-cnn", cnn)
write("onnx", "seed-truncated", cnn[: len(cnn) // 2])
write("onnx", "seed-zeros", b"\0" * 64)

# Hugging Face configs: every shipped one (the families' real fields), small ones of each family,
# and near-misses (heads that do not divide the width, a wrong type, an unknown model_type).
CONFIGS = os.path.join(os.path.dirname(ROOT), "..", "models", "configs")
for name in sorted(os.listdir(CONFIGS)):
    with open(os.path.join(CONFIGS, name), "rb") as f:
        write("hf_config", "seed-" + name[: -len(".json")], f.read())
small = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 24,
         "vocab_size": 32, "max_position_embeddings": 8}
for model_type in ["llama", "qwen3", "gemma", "gemma2", "phi3", "olmo2", "gpt_neox", "falcon"]:
    write("hf_config", "seed-small-" + model_type, json.dumps(dict(small, model_type=model_type)))
write("hf_config", "seed-small-mixtral", json.dumps(dict(small, model_type="mixtral", num_local_experts=4,
                                                           num_experts_per_tok=2, output_router_logits=True)))
write("hf_config", "seed-small-qwen2_moe", json.dumps(dict(small, model_type="qwen2_moe", num_experts=3, num_experts_per_tok=2,
                                                             moe_intermediate_size=8, shared_expert_intermediate_size=12,
                                                             decoder_sparse_step=2, mlp_only_layers=[0])))
write("hf_config", "seed-small-qwen3_moe", json.dumps(dict(small, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=3,
                                                             moe_intermediate_size=8, norm_topk_prob=True)))
write("hf_config", "seed-experts-per-token-above-experts", json.dumps(dict(small, model_type="mixtral", num_local_experts=2,
                                                                             num_experts_per_tok=3)))
write("hf_config", "seed-small-gpt2", json.dumps({"model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2,
                                                   "vocab_size": 32, "n_positions": 8}))
write("hf_config", "seed-heads-do-not-divide", json.dumps(dict(small, model_type="llama", num_attention_heads=3)))
write("hf_config", "seed-partial-rotary", json.dumps(dict(small, model_type="gpt_neox", rotary_pct=0.5)))
write("hf_config", "seed-wrong-type", json.dumps(dict(small, model_type="falcon", multi_query="yes")))
write("hf_config", "seed-unknown-type", json.dumps(dict(small, model_type="xlnet")))
write("hf_config", "seed-small-t5", json.dumps({"model_type": "t5", "d_model": 16, "d_kv": 4, "d_ff": 24, "num_heads": 2,
                                                "num_layers": 1, "num_decoder_layers": 2, "feed_forward_proj": "gated-gelu",
                                                "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
                                                "vocab_size": 50}))
write("hf_config", "seed-t5-too-few-buckets", json.dumps({"model_type": "t5", "d_model": 16, "d_kv": 4, "d_ff": 24,
                                                          "num_heads": 2, "num_layers": 1, "vocab_size": 50,
                                                          "relative_attention_num_buckets": 3}))
write("hf_config", "seed-not-json", "{\"model_type\": \"llama\", ")
