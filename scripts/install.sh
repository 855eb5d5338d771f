#!/usr/bin/env bash
# Install shiftd on this host: the console scripts, the systemd unit, the sysusers file and
# /etc/shift/shiftd.toml (an existing config is never overwritten). docs/operations.md says more.
#
# usage: scripts/install.sh [--prefix DIR] [--venv DIR] [--destdir DIR]
#   --prefix DIR   bin/, lib/ and share/ go under DIR (default /usr/local). systemd reads units
#                  from /usr/local/lib/systemd/system and sysusers from /usr/local/lib/sysusers.d.
#   --venv DIR     link the console scripts of this existing environment, which has shift
#                  installed, instead of building one at PREFIX/lib/shift with pip.
#   --destdir DIR  stage everything under DIR (or DESTDIR=DIR), for packages and tests; the
#                  host is left alone (no groups, no daemon-reload). Needs --venv: a Python
#                  environment cannot be moved after it is built.
set -euo pipefail

die() {
    echo "install.sh: $*" >&2
    exit 1
}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=/usr/local
venv=""
destdir=${DESTDIR:-}
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --venv) venv=${2:?--venv needs a directory}; shift 2 ;;
        --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
        -h | --help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
case $prefix in /*) ;; *) die "--prefix must be an absolute path, not $prefix" ;; esac
prefix=${prefix%/}
destdir=${destdir%/}

if [ -z "$venv" ]; then
    [ -z "$destdir" ] || die "staging into $destdir needs --venv (an environment cannot be moved once built)"
    venv=$prefix/lib/shift
    echo "install.sh: building $venv"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet "$repo"
fi
[ -x "$venv/bin/shiftd" ] || die "$venv/bin/shiftd is missing: shift is not installed in $venv"

# Console scripts: the names pyproject.toml declares, linked from the environment.
bindir=$destdir$prefix/bin
install -d "$bindir"
for script in $("$venv/bin/python" -c '
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["scripts"]))' "$repo/pyproject.toml"); do
    if [ -x "$venv/bin/$script" ]; then
        ln -sfn "$(cd "$venv/bin" && pwd)/$script" "$bindir/$script"
    else
        echo "install.sh: warning: $venv/bin/$script is missing; reinstall shift there to get it" >&2
    fi
done

# The unit and the docs it points to, with /usr/local replaced by the prefix.
unitdir=$destdir$prefix/lib/systemd/system
install -d "$unitdir" "$destdir$prefix/lib/sysusers.d" "$destdir$prefix/share/doc/shift"
for unit in shiftd.service shiftd.socket; do
    sed "s#/usr/local/#$prefix/#g" "$repo/deploy/systemd/$unit" >"$unitdir/$unit"
    chmod 0644 "$unitdir/$unit"
done
install -m 0644 "$repo/deploy/systemd/shift.conf" "$destdir$prefix/lib/sysusers.d/shift.conf"
install -m 0644 "$repo/docs/operations.md" "$destdir$prefix/share/doc/shift/operations.md"

config=$destdir/etc/shift/shiftd.toml
if [ -e "$config" ]; then
    echo "install.sh: keeping the existing $config"
else
    install -d "$destdir/etc/shift"
    install -m 0644 "$repo/deploy/config/shiftd.toml" "$config"
fi

if [ -n "$destdir" ]; then
    echo "install.sh: staged under $destdir"
    exit 0
fi
if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$prefix/lib/sysusers.d/shift.conf"
else
    groupadd -r -f shift
    groupadd -r -f shift-admin
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "install.sh: installed. Edit /etc/shift/shiftd.toml, then: systemctl enable --now shiftd"
