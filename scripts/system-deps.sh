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
# Spark (horovod.spark and its tests) runs on Java: pyspark 4 needs 17 or newer; Debian's default JRE is.
java_ok() {  # a java of version 17 or newer on PATH (or under JAVA_HOME)
    local java="${JAVA_HOME:+$JAVA_HOME/bin/}java" major
    command -v "$java" >/dev/null || return 1
    major=$("$java" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -1)
    [ -n "$major" ] && [ "$major" -ge 17 ]
}
java_ok || need+=(default-jre-headless)
if [ "${#need[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
