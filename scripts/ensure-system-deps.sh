#!/usr/bin/env bash
# Install the Debian packages shift needs (etcd, iproute2) when they are missing.
set -euo pipefail
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "shift: missing ${need[*]}; run as root or install them with apt-get" >&2
    exit 1
fi
echo "shift: installing ${need[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's packages start a system etcd and Prometheus where systemd runs; the lab and the tests
# start their own.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now etcd prometheus >/dev/null 2>&1 || true
fi
