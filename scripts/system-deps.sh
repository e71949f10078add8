#!/usr/bin/env bash
# System packages the multi-host tests need (a real sshd in network namespaces, Open MPI's mpirun and headers for
# mpi4py, ip): installed once,
# quietly, only when missing and when we are root (about 20 s on a fresh Debian machine). Without them those tests
# skip with the reason.
set -euo pipefail
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)   # mpi4py (test extra) builds against it when no wheel fits
command -v ip >/dev/null || need+=(iproute2)
if [ "${#need[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
