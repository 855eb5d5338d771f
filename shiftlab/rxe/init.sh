#!/bin/sh
# The guest's init (pid 1): the mounts a test needs, the work share at its host path, guest.py, power off.
# The kernel's command line names the work share's path, the Python to run and the tree it imports;
# guest.py needs only the standard library (-S: no site-packages to scan, seconds under TCG).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null  # virtme's initramfs may have mounted it already
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^shiftlab\.$1=//p"; }
# the host's folders the job needs under /tmp, /run or /dev/shm (a checkout in /tmp): held on a staging
# tmpfs (the root is read-only) while the guest's own tmpfs go on, then moved back to their paths
keep=$(arg keep | tr ':' ' ')
if [ -n "$keep" ]; then
    mount -t tmpfs tmpfs /mnt
    n=0; for path in $keep; do mkdir /mnt/$n; mount --bind "$path" /mnt/$n; n=$((n + 1)); done
fi
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
n=0; for path in $keep; do mkdir -p "$path"; mount --move /mnt/$n "$path"; n=$((n + 1)); done
work=$(arg work)
mkdir -p "$work" && mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 work "$work"
echo "shiftlab-rxe: init at $(cut -d' ' -f1 /proc/uptime) s of guest time"
PYTHONPATH=$(arg code) "$(arg python)" -S -m shiftlab.rxe.guest "$work"
sync
echo o >/proc/sysrq-trigger
sleep 30
