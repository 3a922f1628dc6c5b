#!/usr/bin/env python3
"""Strangers on the network: opens many connections to every TCP port that
the given processes listen on and sends them what a port scanner, a health
checker or a misconfigured client would.

    stray_clients.py --pids 123,456 --seconds 20 [--max-connections 5000]

The ports come from the processes themselves (their socket inodes in
/proc/PID/fd matched against the listening sockets of /proc/PID/net/tcp*),
so every socket a node opens is covered, not a list written here. Every loop
is bounded by --seconds and --max-connections; every socket is closed before
exit. Prints one summary line per kind and the ports it found.
"""
import argparse
import os
import random
import socket
import ssl
import struct
import sys
import time

KINDS = [
    "random_bytes",      # random bytes of random length
    "basp_header",       # a CAF BASP header with random fields and a huge payload size
    "basp_handshake",    # a well-formed BASP client handshake with a made-up node id
    "preamble_wrong",    # troupe's preamble with the right magic and a wrong job token
    "truncated",         # the first bytes of a preamble or a BASP header, then close
    "tls_garbage",       # a TLS record header followed by random bytes
    "tls_anonymous",     # a real TLS handshake without a client certificate
    "empty",             # connect and close
]


def listening_ports(pid):
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address_hex, port_hex = local.split(":")
            port = int(port_hex, 16)
            if family == socket.AF_INET:
                address = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(address_hex, 16)))
                if address == "0.0.0.0":
                    address = "127.0.0.1"
            else:
                raw = bytes.fromhex(address_hex)
                address = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                if address == "::":
                    address = "::1"
            found.add((address, port, family))
    return sorted(found)


def basp_header(rng, operation=None, payload_len=None):
    operation = rng.randrange(0, 7) if operation is None else operation
    payload_len = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, rng.getrandbits(32)]) if payload_len is None else payload_len
    return struct.pack(">BBBBIQQQ", operation, 0, 0, rng.getrandbits(8), payload_len, rng.getrandbits(64),
                       rng.getrandbits(64), rng.randrange(1, 64))


def payload_for(kind, rng):
    if kind == "random_bytes":
        return rng.randbytes(rng.randrange(1, 8192))
    if kind == "basp_header":
        return basp_header(rng) + rng.randbytes(rng.randrange(0, 4096))
    if kind == "basp_handshake":
        node_id = struct.pack(">I", rng.getrandbits(32)) + rng.randbytes(20)  # process id, host id
        return basp_header(rng, operation=1, payload_len=len(node_id)) + node_id
    if kind == "preamble_wrong":
        # troupe's control-plane preamble: magic, version, reserved, token.
        return b"TROUPEcp" + struct.pack("<HHIQQ", 1, 0, 0, rng.getrandbits(64) | 1, 0)
    if kind == "truncated":
        whole = b"TROUPEcp" + struct.pack("<HHIQQ", 1, 0, 0, rng.getrandbits(64), 0) if rng.random() < 0.5 \
            else basp_header(rng)
        return whole[:rng.randrange(1, len(whole))]
    if kind == "tls_garbage":
        return b"\x16\x03\x01" + struct.pack(">H", rng.randrange(0, 65536)) + rng.randbytes(rng.randrange(0, 4096))
    return b""


def one_connection(address, port, family, kind, rng, anonymous_tls):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((address, port))
        if kind == "tls_anonymous":
            try:
                with anonymous_tls.wrap_socket(s, server_hostname="troupe") as t:
                    t.sendall(rng.randbytes(64))
                    t.recv(16)
            except (ssl.SSLError, OSError):
                pass
            return "sent"
        data = payload_for(kind, rng)
        if data:
            s.sendall(data)
        # No waiting for the node's answer: a stranger does not wait either
        # (the unit tests check that the node closes each kind itself).
        return "sent"
    except OSError as e:
        return "refused" if isinstance(e, ConnectionRefusedError) else "error"
    finally:
        s.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pids", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-connections", type=int, default=5000)
    parser.add_argument("--held-open", type=int, default=64, help="silent connections held for the whole run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--until-pid", type=int, default=0, help="also stop once this process has ended")
    parser.add_argument("--expect-closed-within", type=float, default=0.0,
                        help="fail unless every held-open and slow connection is closed by the node "
                             "within this many seconds of being opened (0: only report)")
    parser.add_argument("--wait-ports", type=int, default=1,
                        help="wait (at most 30 s) until the processes listen on this many ports in all")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    targets = []
    wait_until = time.monotonic() + 30
    while True:
        targets = []
        for pid in args.pids.split(","):
            try:
                targets.extend(listening_ports(int(pid)))
            except OSError:
                pass  # the process has ended
        if len(targets) >= args.wait_ports or time.monotonic() > wait_until:
            break
        time.sleep(0.1)
    if not targets:
        print("stray_clients: the processes listen on no TCP port", file=sys.stderr)
        return 1
    print("stray_clients: ports " + " ".join(f"{a}:{p}" for a, p, _ in targets), flush=True)
    anonymous_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous_tls.check_hostname = False
    anonymous_tls.verify_mode = ssl.CERT_NONE

    held = []
    held_since = time.monotonic()
    for i in range(args.held_open):
        address, port, family = targets[i % len(targets)]
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect((address, port))
            held.append((s, port))
        except OSError:
            s.close()
    # One "slow" client per port: a byte of a preamble every 200 ms.
    slow = []
    for address, port, family in targets:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect((address, port))
            slow.append([s, 0, port])
        except OSError:
            s.close()

    pids = [int(p) for p in args.pids.split(",")]

    def all_alive():
        for pid in pids:
            try:
                os.kill(pid, 0)
            except OSError:
                return False
        return True

    def closed_now(s):
        try:
            s.setblocking(False)
            return s.recv(1) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    # A connection counts as closed by the node only if it was seen closed
    # while every node process was still running (an ended job closes all).
    seen_closed = set()

    def observe_closures():
        candidates = [s for s, _ in held] + [entry[0] for entry in slow if entry[0] is not None]
        closed = [s for s in candidates if id(s) not in seen_closed and closed_now(s)]
        if closed and all_alive():
            seen_closed.update(id(s) for s in closed)

    counts = {k: {"sent": 0, "refused": 0, "error": 0} for k in KINDS}
    total = 0
    start = time.monotonic()
    next_slow = start
    def watched_alive():
        if not args.until_pid:
            return True
        try:
            os.kill(args.until_pid, 0)
            return True
        except OSError:
            return False

    while time.monotonic() - start < args.seconds and total < args.max_connections:
        if total % 64 == 0 and not watched_alive():
            break
        address, port, family = targets[total % len(targets)]
        kind = KINDS[rng.randrange(len(KINDS))]
        counts[kind][one_connection(address, port, family, kind, rng, anonymous_tls)] += 1
        total += 1
        if time.monotonic() >= next_slow:
            next_slow += 0.2
            observe_closures()
            for entry in slow:
                if id(entry[0]) in seen_closed:
                    continue
                try:
                    entry[0].send(b"TROUPEcp"[entry[1] % 8:entry[1] % 8 + 1])
                    entry[1] += 1
                except OSError:
                    if all_alive():
                        seen_closed.add(id(entry[0]))
    elapsed = time.monotonic() - start

    # The node must close silent and slow clients by itself (a bounded
    # handshake time on every port): wait for it, within the given bound.
    deadline = held_since + args.expect_closed_within
    while time.monotonic() < deadline:
        observe_closures()
        if len(seen_closed) == len(held) + len(slow) or not all_alive():
            break
        time.sleep(0.2)
    observe_closures()
    open_ports = [port for s, port in held if id(s) not in seen_closed]
    open_ports += [entry[2] for entry in slow if id(entry[0]) not in seen_closed]
    held_closed = sum(1 for s, _ in held if id(s) in seen_closed)
    closed_slow = sum(1 for entry in slow if id(entry[0]) in seen_closed)
    for entry in slow:
        entry[0].close()
    for s, _ in held:
        s.close()
    for kind in KINDS:
        c = counts[kind]
        print(f"stray_clients: {kind:15s} sent {c['sent']:5d} refused {c['refused']:4d} errors {c['error']:4d}")
    print(f"stray_clients: {total} connections in {elapsed:.1f} s ({total / max(elapsed, 1e-9):.0f}/s); "
          f"held open {len(held)}, closed by the node {held_closed}; slow clients {len(slow)}, "
          f"closed by the node {closed_slow}", flush=True)
    if args.expect_closed_within > 0 and open_ports:
        print(f"stray_clients: FAILED: {len(open_ports)} silent or slow connection(s) still open "
              f"{args.expect_closed_within:.0f} s after connecting, on port(s) "
              + " ".join(str(p) for p in sorted(set(open_ports))), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
