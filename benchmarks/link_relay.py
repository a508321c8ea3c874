"""A slow or lossy link without ``sch_netem``: ``python -m benchmarks.link_relay DEVICE DELAY_S LOSS SEED``,
run inside a host's network namespace (``benchmarks.hosts.NamespaceCluster.impair`` starts it).

Some kernels ship without netem (this machine's has no ``sch_netem``), but with ``clsact`` and
``mirred``. The host's outgoing frames are redirected from ``DEVICE`` (its ``eth0``) to a TAP device
this process owns; it reads each one, drops it with probability ``LOSS``, and sends the rest out of
``DEVICE`` ``DELAY_S`` later, in order, through a packet socket that bypasses the device's queueing
(so, past the redirect). That is ``tc qdisc add dev eth0 root netem delay D loss L``: the host's
egress only, so a peer's round trip to it grows by ``D``.

It prints ``ready TAP`` once the TAP device is up (the caller then adds the redirect), and on
SIGTERM sends what it still holds at its time and exits, printing how many frames it sent and
dropped; the TAP device goes with it.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_SOL_PACKET = 263
_PACKET_QDISC_BYPASS = 20
_ETH_P_ALL = 0x0003
#: The TAP device's name (one relay per namespace).
TAP = "ftimp0"


def open_tap(name: str) -> int:
    """A TAP device named ``name``, up; its file descriptor (the device goes when it is closed)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    os.set_blocking(fd, False)
    return fd


def relay(device: str, delay_s: float, loss: float, seed: int) -> None:
    rng = random.Random(seed)
    tap = open_tap(TAP)
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    out.setsockopt(_SOL_PACKET, _PACKET_QDISC_BYPASS, 1)
    out.bind((device, 0))
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print(f"ready {TAP}", flush=True)
    held: list[tuple[float, int, bytes]] = []
    sent = dropped = seq = 0
    while not (stopping and not held):
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, frame = heapq.heappop(held)
            try:
                out.send(frame)
                sent += 1
            except OSError:
                dropped += 1  # the device is down (its link cut): the frame is lost, as on a wire
        wait = max(0.0, held[0][0] - now) if held else 0.5
        try:
            readable, _, _ = select.select([tap], [], [], wait)
        except InterruptedError:
            continue
        if not readable:
            continue
        while True:
            try:
                frame = os.read(tap, 65536)
            except BlockingIOError:
                break
            if loss and rng.random() < loss:
                dropped += 1
                continue
            seq += 1
            heapq.heappush(held, (time.monotonic() + delay_s, seq, frame))
    print(f"sent {sent} dropped {dropped}", flush=True)


if __name__ == "__main__":
    relay(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
