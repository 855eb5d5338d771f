"""One process per lab host, all at once, for the benches whose ranks run on the lab's hosts."""

from __future__ import annotations

import subprocess

from shiftlab.lab import Lab

RANKS_TIMEOUT = 1800.0


def on_hosts(lab: Lab, bench: str, what: str, argvs: list[list[str]]) -> list[str]:
    """Run argvs[i] on host h{i}, all at once; their outputs, once every one has succeeded (else a one-line
    SystemExit naming the bench, the step and the host, with the end of what it said)."""
    procs = []
    for host, argv in enumerate(argvs):
        argv, env = lab.exec_command(f"h{host}", argv)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = [proc.communicate(timeout=RANKS_TIMEOUT) for proc in procs]
    for host, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        if proc.returncode != 0:
            raise SystemExit(f"{bench}: {what} on h{host} failed: {err.decode().strip()[-2000:]}")
    return [out.decode() for out, _ in outputs]
