# hsx's Mooncake helper: drives mooncake.store.MooncakeDistributedStore (the Python API
# the PyPI wheels ship; they ship no C++ headers) for hsx's MooncakeClient. hsx starts it
# with `python3 -c <this file> FD,FD,...`: SOCK_SEQPACKET channels, one per writer. Each
# channel is one writer: a JSON request, a JSON reply. A staging buffer arrives as a memfd
# (SCM_RIGHTS) that hsx fills; the helper maps and registers it, so put_from reads hsx's
# bytes with no copy here. Objects live in this process's mounted segment: it stays up as
# long as hsx, and exits when channel 0 closes (PR_SET_PDEATHSIG covers a killed hsx).
import ctypes
import json
import mmap
import os
import socket
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def send(chan, obj):
    chan.send(json.dumps(obj).encode())


def serve_channel(store, chan):
    from mooncake.store import ReplicateConfig
    pinned = ReplicateConfig()
    pinned.with_hard_pin = True
    buf, size = None, 0
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(chan, 1 << 20, 1)
        except OSError:
            return
        if not data:
            return
        msg = json.loads(data)
        op = msg["op"]
        try:
            if op == "buffer":  # a new, larger staging buffer replaces the old one
                if buf is not None:
                    store.unregister_buffer(buf)
                    libc.munmap(buf, size)
                    buf = None
                size = msg["size"]
                addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fds[0], 0)
                os.close(fds[0])
                if addr in (None, ctypes.c_void_p(-1).value):
                    send(chan, {"status": -1, "error": "mmap of the staging buffer failed: errno %d" % ctypes.get_errno()})
                    continue
                buf = addr
                send(chan, {"status": store.register_buffer(buf, size)})
            elif op == "put_from":
                send(chan, {"status": store.put_from(msg["key"], buf, msg["size"])})
            elif op == "put":  # an error marker: hard-pinned, so that no eviction takes it before its reader
                send(chan, {"status": store.put(msg["key"], msg["value"].encode("utf-8"), pinned)})
            else:
                send(chan, {"status": -1, "error": "unknown op " + op})
        except Exception as e:  # noqa: BLE001 - reported to hsx, which fails the request
            send(chan, {"status": -1, "error": "%s: %s" % (type(e).__name__, e)})


def main():
    chans = [socket.socket(fileno=int(fd)) for fd in sys.argv[1].split(",")]
    setup = json.loads(chans[0].recv(1 << 20))
    try:
        from mooncake.store import MooncakeDistributedStore
    except Exception as e:  # noqa: BLE001 - ImportError, or a missing shared library
        send(chans[0], {"status": -1, "missing": True, "error": "%s: %s" % (type(e).__name__, e)})
        return
    store = MooncakeDistributedStore()
    status = store.setup(setup["local_hostname"], setup["metadata_server"], setup["global_segment_size"],
                         setup["local_buffer_size"], setup["protocol"], setup["device_name"],
                         setup["master_server_address"])
    send(chans[0], {"status": status})
    if status != 0:
        return
    for chan in chans[1:]:
        threading.Thread(target=serve_channel, args=(store, chan), daemon=True).start()
    serve_channel(store, chans[0])
    store.close()


main()
