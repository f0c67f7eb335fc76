"""What hsx hands MooncakeDistributedStore.setup: every field of
kv_connector_extra_config.mooncake, unchanged, in setup's order. RDMA cannot run here (no
NICs), so the check is on the call itself: a stand-in `mooncake.store` module records the
arguments the helper passes, then fails setup, which hsx reports. No Mooncake is needed."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from conftest import HSX

PUT_TOOL = pathlib.Path(HSX).parent.parent / "tests" / "hsx_mooncake_put"

FAKE_STORE = '''
import json, os
class ReplicateConfig:
    pass
class MooncakeDistributedStore:
    def setup(self, *args):
        with open(os.environ["HSX_TEST_SETUP_RECORD"], "w") as f:
            json.dump(args, f)
        return -7
'''


@pytest.mark.parametrize("protocol,device", [("rdma", "mlx5_0,mlx5_1"), ("tcp", "")])
def test_setup_gets_the_config_unchanged(tmp_path, protocol, device):
    (tmp_path / "site" / "mooncake").mkdir(parents=True)
    (tmp_path / "site" / "mooncake" / "__init__.py").write_text("")
    (tmp_path / "site" / "mooncake" / "store.py").write_text(FAKE_STORE)
    python = tmp_path / "python_with_fake_mooncake"
    # -S: no site-packages, so a real Mooncake installed there is not found first.
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    record = tmp_path / "setup_args.json"
    with socket.socket() as listener:  # something at the master's address, so that hsx's probe passes
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        config = {"local_hostname": "10.1.2.3", "metadata_server": "P2PHANDSHAKE",
                  "master_server_address": "127.0.0.1:%d" % listener.getsockname()[1],
                  "global_segment_size": 3 << 30, "local_buffer_size": 1 << 29, "protocol": protocol,
                  "device_name": device, "num_writer_threads": 2}
        r = subprocess.run([str(PUT_TOOL), json.dumps(config)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "HSX_PYTHON": str(python), "HSX_TEST_SETUP_RECORD": str(record)})
    assert r.returncode == 1 and "setup" in r.stderr and "status -7" in r.stderr, r.stderr
    # MooncakeDistributedStore.setup(local_hostname, metadata_server, global_segment_size,
    # local_buffer_size, protocol, rdma_devices, master_server_addr), as hs_connectors calls it.
    assert json.loads(record.read_text()) == [
        "10.1.2.3", "P2PHANDSHAKE", 3 << 30, 1 << 29, protocol, device, config["master_server_address"]]
