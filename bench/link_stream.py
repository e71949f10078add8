"""The link's own limit: one plain TCP stream between two namespace hosts, nothing else (bench/crosshost.py).

    python bench/link_stream.py recv PORT            # prints "ready", then "<bytes> <seconds>" once the sender closes
    python bench/link_stream.py send ADDR PORT BYTES

Both sides use 4 MiB ``sendall``/``recv_into`` calls and the kernel's default socket buffers (autotuned); the
receiver times from the first byte to the end of the stream.
"""

from __future__ import annotations

import socket
import sys
import time

CHUNK = 4 << 20


def recv(port: int) -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
        listener.listen(1)
        print("ready", flush=True)
        conn, _ = listener.accept()
        with conn:
            buf = memoryview(bytearray(CHUNK))
            got = conn.recv_into(buf)
            start = time.perf_counter()
            total = got
            while got:
                got = conn.recv_into(buf)
                total += got
            print(f"{total} {time.perf_counter() - start}", flush=True)


def send(addr: str, port: int, nbytes: int) -> None:
    data = memoryview(bytearray(CHUNK))
    with socket.create_connection((addr, port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            conn.sendall(data[:n])
            left -= n


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
