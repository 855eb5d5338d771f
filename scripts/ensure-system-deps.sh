#!/usr/bin/env bash
# Install the Debian packages shift needs (etcd, iproute2, pyverbs, the C core's compilers and headers, the
# benchmarks' qperf and iperf3) when they are missing; with a venv directory as $1, also let that venv
# import Debian's pyverbs (and nothing else of dist-packages).
set -euo pipefail
venv="${1:-}"
system_pyverbs=/usr/lib/python3/dist-packages/pyverbs
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v promtool >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
# The peers' own tools, which the benchmarks run beside shift on the same netdevs (bench/peer_tools.py).
command -v qperf >/dev/null || need+=(qperf)
command -v iperf3 >/dev/null || need+=(iperf3)
# The C core: gcc builds it (pip install -e); clang and its runtimes build the fuzz target (tests/core).
command -v gcc >/dev/null || need+=(gcc)
command -v clang >/dev/null || need+=(clang)
[ -f "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)" ] || need+=(libclang-rt-dev)
# The core's verbs backend compiles against rdma-core's verbs.h (it loads libibverbs.so.1 at run time).
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
command -v valgrind >/dev/null || need+=(valgrind) # memcheck over the C core (tests/memcheck.py)
# The verbs provider: Debian's pyverbs is built against the system's rdma-core (PyPI's builds its own
# and then fails to load against older system libraries; see docs/hardware.md).
[ -d "$system_pyverbs" ] || need+=(python3-pyverbs)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "shift: missing ${need[*]}; run as root or install them with apt-get" >&2
        exit 1
    fi
    echo "shift: installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Debian's packages start a system etcd and Prometheus (and iperf3's server, if asked to) where
    # systemd runs; the lab, the tests and the benchmarks start their own.
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        systemctl disable --now etcd prometheus iperf3 >/dev/null 2>&1 || true
    fi
fi
if [ -n "$venv" ]; then
    # A .pth entry naming a directory that holds only a link to pyverbs: the venv sees pyverbs, not the
    # rest of dist-packages. Only when the venv's Python has the ABI pyverbs' extensions were built for.
    tag=$("$venv/bin/python" -c 'import sys; print(f"cpython-{sys.version_info[0]}{sys.version_info[1]}")')
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if compgen -G "$system_pyverbs/*.$tag-*.so" >/dev/null; then
        mkdir -p "$venv/system-pyverbs"
        ln -sfn "$system_pyverbs" "$venv/system-pyverbs/pyverbs"
        (cd "$venv/system-pyverbs" && pwd) >"$site/shift-system-pyverbs.pth"
    else
        rm -f "$site/shift-system-pyverbs.pth"
        echo "shift: Debian's pyverbs is not built for the venv's Python ($tag); the verbs provider" \
            "is off (see docs/hardware.md)" >&2
    fi
fi
