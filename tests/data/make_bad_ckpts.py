"""Write malformed checkpoints and configs for normaudit's readers (a copy of ../shared/bad-inputs/make_bad_ckpts.py,
so the suite runs without ../shared; keep the two in step).

``make_all(directory)`` writes every file into ``directory`` (made from scratch; nothing is downloaded). The pickles
that would run code write a marker file named PWNED_<name> in that folder if they are ever unpickled with full
pickle; the remote-code module and the YAML python tag do the same. Run as a script, it writes into the current
directory (or the one given as argument).
"""
import io  # noqa: F401 - kept as in the original
import json
import os
import pickle
import struct
import sys
import zipfile

import torch
from safetensors.torch import save_file


def make_all(directory):
    """Write every hostile file of the generator into ``directory`` (created if needed); returns its path."""
    os.makedirs(directory, exist_ok=True)
    old = os.getcwd()
    os.chdir(directory)
    try:
        _make(os.path.abspath(directory))
    finally:
        os.chdir(old)
    return directory


def _make(HERE):  # noqa: N803 - the original's module constant
    torch.manual_seed(0)
    base = {
        "encoder.layer.0.LayerNorm.weight": torch.ones(16) + 0.01 * torch.randn(16),
        "encoder.layer.0.LayerNorm.bias": torch.zeros(16),
        "encoder.layer.0.dense.weight": torch.randn(16, 16),
        "bn.weight": torch.ones(8),
        "bn.bias": torch.zeros(8),
        "bn.running_mean": torch.zeros(8),
        "bn.running_var": torch.ones(8),
        "bn.num_batches_tracked": torch.tensor(0),
        "norm.weight": torch.ones(16),
    }
    save_file(base, "good.safetensors")
    torch.save(base, "good.pt")
    good = open("good.safetensors", "rb").read()
    n = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + n])
    data = good[8 + n:]


    def st(hdr, payload=data, length=None):
        h = json.dumps(hdr).encode() if not isinstance(hdr, bytes) else hdr
        return struct.pack("<Q", len(h) if length is None else length) + h + payload


    def write(name, blob):
        with open(name, "wb") as f:
            f.write(blob)


    write("st_len_huge.safetensors", struct.pack("<Q", 2 ** 63) + good[8:])
    write("st_len_max.safetensors", b"\xff" * 8 + good[8:])
    write("st_len_past_eof.safetensors", struct.pack("<Q", len(good) + 100) + good[8:])
    write("st_len_zero.safetensors", struct.pack("<Q", 0) + good[8:])
    write("st_len_100MB.safetensors", struct.pack("<Q", 100 * 2 ** 20) + good[8:])
    write("st_header_not_json.safetensors", st(b"{not json" + b" " * 10))
    write("st_header_list.safetensors", st(b"[1, 2, 3]"))
    write("st_header_nonutf8.safetensors", st(b'{"\xff\xfe": 1}'))
    write("st_truncated_data.safetensors", good[: 8 + n + len(data) // 2])
    write("st_header_only.safetensors", good[: 8 + n])
    write("st_3bytes.safetensors", good[:3])
    h = json.loads(json.dumps(header)); k = "encoder.layer.0.LayerNorm.weight"; h[k]["dtype"] = "F99"
    write("st_bad_dtype.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["dtype"] = "F16"   # offsets now say 64 bytes for 16 halves (32)
    write("st_dtype_size_mismatch.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["data_offsets"] = [0, 64]; h["norm.weight"]["data_offsets"] = [0, 64]
    write("st_overlap.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["data_offsets"] = [10 ** 12, 10 ** 12 + 64]
    write("st_offset_past_eof.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["data_offsets"] = [64, 0]
    write("st_offset_reversed.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["data_offsets"] = [-64, 0]
    write("st_offset_negative.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["shape"] = [-16]
    write("st_shape_negative.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["shape"] = [2 ** 40, 2 ** 40]
    write("st_shape_huge.safetensors", st(h))
    h = json.loads(json.dumps(header)); h[k]["shape"] = "sixteen"
    write("st_shape_string.safetensors", st(h))
    h = json.loads(json.dumps(header)); h["__metadata__"] = {"format": "pt", "config": json.dumps({"layer_norm_eps": "x" * 10})}
    write("st_metadata_config.safetensors", st(h))
    h = json.loads(json.dumps(header)); h["__metadata__"] = {"nested": {"a": 1}}
    write("st_metadata_nonstr.safetensors", st(h))
    # key names with terminal escapes / format braces / newlines
    h = json.loads(json.dumps(header))
    h["\x1b[31mRED\x1b[0m\x1b]0;pwned-title\x07.LayerNorm.weight"] = h.pop(k)
    h["{site.__class__}.norm.weight"] = h.pop("norm.weight")
    h["evil\n::error file=x.py,line=1::injected.LayerNorm.bias"] = h.pop("encoder.layer.0.LayerNorm.bias")
    write("st_evil_names.safetensors", st(h))
    # NaN gains
    bad = dict(base); bad["norm.weight"] = torch.full((16,), float("nan")); save_file(bad, "st_nan_gain.safetensors")
    # deeply nested header JSON (still within safetensors' limits?)
    write("st_deep_json.safetensors", st(b"[" * 100000 + b"]" * 100000))
    write("empty.safetensors", b"")
    write("empty.pt", b"")
    write("empty.bin", b"")


    class Evil:
        def __init__(self, name):
            self.name = name

        def __reduce__(self):
            return (os.system, (f"touch {HERE}/PWNED_{self.name}",))


    # legacy (non-zip) pickle; torch.save with _use_new_zipfile_serialization=False; plain pickle.dump
    with open("evil_plain_pickle.pt", "wb") as f:
        pickle.dump({"norm.weight": Evil("plain_pickle")}, f)
    torch.save({"norm.weight": torch.ones(4), "x": Evil("torch_zip")}, "evil_torch_zip.pt")
    torch.save({"norm.weight": torch.ones(4), "x": Evil("torch_legacy")}, "evil_torch_legacy.pt",
               _use_new_zipfile_serialization=False)
    torch.save({"norm.weight": torch.ones(4), "x": Evil("bin")}, "evil.bin")
    # a .bin that is a zip with junk members
    with zipfile.ZipFile("zip_junk.bin", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x04junkjunkjunk")
        z.writestr("archive/version", b"3\n")
    with zipfile.ZipFile("zip_random.bin", "w") as z:
        z.writestr("hello.txt", b"not a checkpoint")
    write("zip_truncated.pt", open("good.pt", "rb").read()[:200])
    write("not_a_pickle.pt", b"hello world, this is text\n" * 10)
    # sharded index
    os.makedirs("shard_outside", exist_ok=True)
    json.dump({"metadata": {}, "weight_map": {"norm.weight": "../../../../../../../../etc/passwd",
                                              "bn.weight": "/etc/hostname"}},
              open("shard_outside/model.safetensors.index.json", "w"))
    os.makedirs("shard_missing", exist_ok=True)
    json.dump({"weight_map": {"norm.weight": "model-00001-of-00002.safetensors"}},
              open("shard_missing/model.safetensors.index.json", "w"))
    os.makedirs("shard_dir_as_shard", exist_ok=True)
    os.makedirs("shard_dir_as_shard/model-00001-of-00001.safetensors", exist_ok=True)
    json.dump({"weight_map": {"norm.weight": "model-00001-of-00001.safetensors"}},
              open("shard_dir_as_shard/model.safetensors.index.json", "w"))
    os.makedirs("shard_weird_map", exist_ok=True)
    json.dump({"weight_map": ["not", "a", "dict"]}, open("shard_weird_map/model.safetensors.index.json", "w"))
    os.makedirs("shard_nonstr", exist_ok=True)
    json.dump({"weight_map": {"norm.weight": 5}}, open("shard_nonstr/model.safetensors.index.json", "w"))
    os.makedirs("shard_pt_outside", exist_ok=True)
    json.dump({"weight_map": {"norm.weight": "../good.pt"}}, open("shard_pt_outside/pytorch_model.bin.index.json", "w"))
    os.makedirs("shard_devzero", exist_ok=True)
    if not os.path.lexists("shard_devzero/model-00001-of-00001.safetensors"):
        os.symlink("/dev/zero", "shard_devzero/model-00001-of-00001.safetensors")
    json.dump({"weight_map": {"norm.weight": "model-00001-of-00001.safetensors"}},
              open("shard_devzero/model.safetensors.index.json", "w"))
    # symlink loops
    for a, b in (("loop_a.safetensors", "loop_b.safetensors"), ("loop_b.safetensors", "loop_a.safetensors")):
        if not os.path.lexists(a):
            os.symlink(b, a)
    os.makedirs("dirloop", exist_ok=True)
    if not os.path.lexists("dirloop/self"):
        os.symlink(".", "dirloop/self")
    save_file(base, "dirloop/model.safetensors")
    if not os.path.lexists("devzero.safetensors"):
        os.symlink("/dev/zero", "devzero.safetensors")
    if not os.path.lexists("fifo.safetensors"):
        os.mkfifo("fifo.safetensors")
    # HF-style directories
    os.makedirs("hf_noconfig", exist_ok=True); open("hf_noconfig/README.md", "w").write("nothing here\n")
    for name, content in (("hf_badjson", b"{not json"), ("hf_empty", b""), ("hf_nonutf8", b'{"model_type": "bert\xff\xfe"}'),
                          ("hf_list", b"[]"), ("hf_unknown_type", b'{"model_type": "no-such-model"}'),
                          ("hf_neg_hidden", b'{"model_type": "bert", "hidden_size": -8, "num_attention_heads": 2}'),
                          ("hf_deep", b'{"a": ' * 100000 + b'1' + b'}' * 100000),
                          ("hf_huge_layers", b'{"model_type": "bert", "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "num_hidden_layers": 100000}'),
                          ("hf_remote_code", b'{"model_type": "custom", "auto_map": {"AutoModel": "modeling_custom.CustomModel"}}')):
        os.makedirs(name, exist_ok=True)
        open(os.path.join(name, "config.json"), "wb").write(content)
    open("hf_remote_code/modeling_custom.py", "w").write(f"import os\nos.system('touch {HERE}/PWNED_remote_code')\n")
    # a bare config.json that is 0 bytes, one that is a directory
    os.makedirs("cfgdir/config.json", exist_ok=True)
    open("zero_config.json", "wb").close()
    # YAML bomb for --config
    open("bomb.yaml", "w").write("""a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
layer_norm_eps: 1.0e-5
""")
    open("python_tag.yaml", "w").write(f"!!python/object/apply:os.system ['touch {HERE}/PWNED_yaml']\n")
    pass


    # --- cases added during the session -------------------------------------------------------------
    h = json.loads(json.dumps(header)); h["__metadata__"] = {"format": "pt", "config": "[" * 5000 + "]" * 5000}
    write("st_meta_deep_config.safetensors", st(h))          # the fuzzer's only crash: exit 3 RecursionError
    os.makedirs("shard_st_outside", exist_ok=True)
    json.dump({"weight_map": {"norm.weight": "../good.safetensors"}}, open("shard_st_outside/model.safetensors.index.json", "w"))
    os.makedirs("shard_abs", exist_ok=True)                   # absolute shard path, written at run time
    json.dump({"weight_map": {"norm.weight": os.path.abspath("good.safetensors")}}, open("shard_abs/model.safetensors.index.json", "w"))
    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "rms_norm_eps": 1e-6}
    for name, extra_keys in (("hf_llama_tiny", {}), ("hf_flash", {"attn_implementation": "flash_attention_2"}),
                             ("hf_quant", {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}})):
        os.makedirs(name, exist_ok=True)
        json.dump(dict(tiny, **extra_keys), open(os.path.join(name, "config.json"), "w"))
    os.makedirs("hf_escape", exist_ok=True)
    open("hf_escape/config.json", "w").write('{"model_type": "\\u001b[31mred\\u001b]0;title\\u0007\\n::error file=a.py,line=1::forged"}')
    pass


if __name__ == "__main__":
    make_all(sys.argv[1] if len(sys.argv) > 1 else ".")
    print("made")
