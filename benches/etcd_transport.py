#!/usr/bin/env python3
"""etcd's own CPU per call through its JSON gateway and over gRPC, on this
machine: why the coordinator speaks gRPC (docs/coordination.md).

Starts its own etcd (Debian's etcd-server), sends the same 200-byte puts
from 32 threads through each transport twice, alternated, and prints the
puts per second and etcd's CPU time per put (utime + stime from /proc).
Needs grpcio (`pip install grpcio`); the protobuf of a PutRequest is
written by hand, as Strata's client writes it.

    python3 benches/etcd_transport.py [--puts 4000] [--threads 32]
"""
import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import grpc


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(no, b):
    return varint(no << 3 | 2) + varint(len(b)) + b


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--puts", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=32)
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    cp, pp = free_port(), free_port()
    url = f"http://127.0.0.1:{cp}"
    etcd = subprocess.Popen(
        ["etcd", "--data-dir", d, "--listen-client-urls", url,
         "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{pp}", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", cp), 1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        time.sleep(1)

        def cpu():
            f = open(f"/proc/{etcd.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        val = b"x" * 200
        per = a.puts // a.threads

        def grpc_worker():
            ch = grpc.insecure_channel(f"127.0.0.1:{cp}")
            put = ch.unary_unary("/etcdserverpb.KV/Put")

            def w(t):
                for i in range(per):
                    put(field_bytes(1, f"g/{t}/{i}".encode()) + field_bytes(2, val))
            return w

        def gateway_worker():
            def w(t):
                c = http.client.HTTPConnection("127.0.0.1", cp)
                for i in range(per):
                    body = json.dumps({
                        "key": base64.b64encode(f"h/{t}/{i}".encode()).decode(),
                        "value": base64.b64encode(val).decode()})
                    c.request("POST", "/v3/kv/put", body,
                              {"Content-Type": "application/json"})
                    c.getresponse().read()
            return w

        for name, make in [("gateway", gateway_worker), ("grpc", grpc_worker)] * 2:
            w = make()
            c0, t0 = cpu(), time.time()
            ts = [threading.Thread(target=w, args=(t,)) for t in range(a.threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt, dc = time.time() - t0, cpu() - c0
            n = per * a.threads
            print(f"{name:8} {n / dt:7.0f} puts/s  etcd CPU {dc * 1e6 / n:5.0f} us/put")
    finally:
        etcd.kill()
        etcd.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
