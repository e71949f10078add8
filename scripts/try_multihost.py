#!/usr/bin/env python3
"""Try multi-host Horovod on one machine: hosts that are network namespaces, each with its own sshd, as the tests
build them (horovod/testing/netns.py), and horovodrun reaching them over real ssh.

    sudo .venv/bin/python scripts/try_multihost.py -- python examples/pytorch_digits.py
    sudo .venv/bin/python scripts/try_multihost.py --hosts 3 --slots 2 -- python examples/numpy_allreduce.py
    sudo .venv/bin/python scripts/try_multihost.py --keep            # hosts stay up for your own horovodrun
    sudo .venv/bin/python scripts/try_multihost.py --teardown        # removes what a killed --keep left behind

The first form makes the hosts (10.99.X.2, 10.99.X.3, ... on a bridge at 10.99.X.1), prints the horovodrun command
it runs (-H with those addresses, -np hosts x slots), runs it, and removes everything whatever happened: the
namespaces and every process in them, the veth pairs, the bridge, the session's keys. Its exit status is
horovodrun's. --keep prints the hosts and the variables to export (the session's ssh options and known-hosts file)
and waits until Enter or Ctrl-C, then removes them; --teardown removes a --keep session's hosts after that script
was killed. localhost and 127.x hosts would not do: horovodrun starts those locally, without ssh.

Needs root (network namespaces), ip, sshd, ssh and ssh-keygen (Debian: iproute2, openssh-server, openssh-client;
scripts/system-deps.sh installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from horovod.testing.netns import NetnsCluster, TestHost, unavailable_reason  # noqa: E402

STATE = os.path.join(tempfile.gettempdir(), "horovod-try-multihost.json")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripts/try_multihost.py", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="namespace hosts to make (default: 2)")
    parser.add_argument("--slots", type=int, default=1, help="processes per host (default: 1)")
    parser.add_argument("--keep", action="store_true", help="make the hosts and wait; run horovodrun yourself")
    parser.add_argument("--teardown", action="store_true", help="remove the hosts a killed --keep left behind")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the training command")
    return parser


def _env(cluster: NetnsCluster) -> dict:
    # The workers run this Python on the same paths (only the network is a namespace's): the checkout importable.
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return {**cluster.env(), "PYTHONPATH": path}


def _save(cluster: NetnsCluster) -> None:
    with open(STATE, "w", encoding="utf-8") as out:
        json.dump({"tag": cluster.tag, "bridge": cluster.bridge, "dir": cluster.dir,
                   "hosts": [[h.netns, h.address, h.iface, h.root_veth] for h in cluster.hosts]}, out)


def teardown() -> int:
    """Remove the hosts a --keep session recorded (and only those: tests may be using hosts of their own)."""
    try:
        with open(STATE, encoding="utf-8") as handle:
            state = json.load(handle)
    except FileNotFoundError:
        print(f"nothing to remove: no {STATE}")
        return 0
    cluster = NetnsCluster(len(state["hosts"]))
    cluster.tag, cluster.bridge, cluster.dir = state["tag"], state["bridge"], state["dir"]
    cluster.hosts = [TestHost(*fields) for fields in state["hosts"]]
    cluster.close()
    os.unlink(STATE)
    print(f"removed {len(state['hosts'])} namespace hosts and bridge {state['bridge']}")
    return 0


def _keep(cluster: NetnsCluster, hosts: str, np: int) -> int:
    _save(cluster)
    print("The hosts are up. In another shell (as root):")
    for name, value in _env(cluster).items():
        print(f"  export {name}={shlex.quote(value)}")
    print(f"  horovodrun -i {cluster.identity_file} -np {np} -H {hosts} {sys.executable} examples/pytorch_digits.py")
    print("Press Enter or Ctrl-C here to remove them.", flush=True)
    try:
        sys.stdin.readline()
    except KeyboardInterrupt:
        pass
    os.unlink(STATE)
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.teardown:
        return teardown()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and not args.keep:
        _parser().error("give the training command after --, or --keep")
    why = unavailable_reason()
    if why is not None:
        print(f"scripts/try_multihost.py: {why}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # a plain kill still removes the hosts
    print(f"making {args.hosts} namespace hosts with sshd ...", flush=True)
    with NetnsCluster(args.hosts) as cluster:
        hosts = ",".join(f"{h.address}:{args.slots}" for h in cluster.hosts)
        np = args.hosts * args.slots
        if args.keep:
            return _keep(cluster, hosts, np)
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        if command[0] in ("python", "python3"):     # an ssh session's PATH may find another Python: this one
            command = [sys.executable, *command[1:]]
        argv = [horovodrun, "-i", cluster.identity_file, "-np", str(np), "-H", hosts, *command]
        print("$ " + " ".join(shlex.quote(a) for a in argv), flush=True)
        code = subprocess.run(argv, env={**os.environ, **_env(cluster)}).returncode
        print(f"horovodrun exited with {code}; removing the hosts", flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main())
