"""`hsx verify-states`: a sound directory passes, and each fault a trainer could be fed
is reported with the file and the cause, and fails the run: another model's files, other
layers, a prompt whose tokens differ, a value flipped to NaN, a file the manifest lists
but that is gone, and a file with no layer contract."""
import json
import shutil
import struct
import subprocess

from conftest import HSX, MODEL

LAYERS = "0,2,4"


def run(*args):
    return subprocess.run([HSX, *map(str, args)], capture_output=True, text=True, timeout=120)


def extract(tmp_path, out, *extra):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"r{i}", "token_ids": list(range(1 + i, 9 + 2 * i))}) + "\n"
                               for i in range(4)))
    r = run("extract", "--model", MODEL, "--layers", LAYERS, "--input", prompts, "--output", out, *extra)
    assert r.returncode == 0, r.stderr
    return prompts


def verify(out, *extra, model=MODEL):
    r = run("verify-states", out, "--model", model, *extra)
    return r.returncode, r.stdout.splitlines()


def test_a_sound_directory_passes_and_each_fault_is_named(tmp_path):
    out = tmp_path / "out"
    prompts = extract(tmp_path, out)
    rc, lines = verify(out, "--input", prompts)
    summary = json.loads(lines[-1])
    assert rc == 0 and summary["sound"] == 4 and summary["problems"] == 0 and summary["layer_ids"] == [0, 2, 4], lines
    assert summary["prompts_checked"] == 4

    # Another model: the same shapes, one config value changed.
    other = tmp_path / "other"
    shutil.copytree(MODEL, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 10
    (other / "config.json").write_text(json.dumps(config))
    rc, lines = verify(out, model=other)
    assert rc == 1 and sum("was made by a model whose config hash is" in line for line in lines) == 4, lines
    # Reformatting config.json or adding transformers' bookkeeping keeps the hash.
    config = json.loads((MODEL / "config.json").read_text())
    config["_name_or_path"] = "somewhere"
    (other / "config.json").write_text(json.dumps(config, indent=7))
    rc, lines = verify(out, model=other)
    assert rc == 0, lines

    rc, lines = verify(out, "--layers", "0,2")
    assert rc == 1 and any("holds layers [0,2,4], expected [0,2]" in line for line in lines), lines

    changed = tmp_path / "changed.jsonl"
    changed.write_text(json.dumps({"id": "r1", "token_ids": [2, 3, 99]}) + "\n")
    rc, lines = verify(out, "--input", changed)
    assert rc == 1 and any("r1.safetensors: token_ids[2] is 4; the prompt, tokenized again, has 99" in line
                           for line in lines), lines

    # One bf16 value set to NaN in r2's states.
    path = out / "r2.safetensors"
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    begin = 8 + n + json.loads(raw[8:8 + n])["hidden_states"]["data_offsets"][0]
    row = 3 * 64 * 2  # one token: 3 layers of 64 bf16 values
    raw[begin + row + 64 * 2 + 10:begin + row + 64 * 2 + 12] = struct.pack("<H", 0x7FC0)
    path.write_bytes(bytes(raw))
    rc, lines = verify(out)
    assert rc == 1 and any("r2.safetensors: hidden_states at token 1, layer index 1 is not finite" in line
                           for line in lines), lines

    (out / "r3.safetensors").unlink()
    rc, lines = verify(out)
    assert rc == 1 and any("r3.safetensors" in line for line in lines), lines


def test_fp8_files_pass_and_a_file_without_a_contract_is_named(tmp_path):
    out = tmp_path / "fp8"
    extract(tmp_path, out, "--kv-transfer-config", json.dumps({"kv_connector": "FP8HiddenStatesConnector"}))
    rc, lines = verify(out)
    assert rc == 0, lines
    # A file written by another tool (no __metadata__): safetensors' own header, same tensors.
    path = out / "r0.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    del header["__metadata__"]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    rc, lines = verify(out)
    assert rc == 1 and any("r0.safetensors: __metadata__ has no 'hsx.contract'" in line for line in lines), lines
