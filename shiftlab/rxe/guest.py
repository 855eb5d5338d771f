"""Inside the guest (`python -m shiftlab.rxe.guest WORKDIR`, run by init.sh): the rxe fabric, the perftest
sanity check, the command; then status.json in the work share says how it ended.

Lines starting with MARK on the console are the host's progress lines; the command's own output goes to
output.log in the work share, which the host relays as it grows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from shiftlab.rxe import network
from shiftlab.rxe.perftest import sanity_check

MARK = "shiftlab-rxe: "
JOB, OUTPUT, STATUS = "job.json", "output.log", "status.json"


def say(text: str) -> None:
    print(f"{MARK}{text} (at {time.monotonic():.1f} s of guest time)", flush=True)


def main(work: Path) -> None:
    job = json.loads((work / JOB).read_text())
    status: dict[str, object]
    keeper = None
    try:
        if job["setup"]:
            say("setting up rxe devices")
            network.setup()
            keeper = network.RouteKeeper()
            keeper.start()
            say(f"rxe devices up: {' '.join(network.DEVICES)}")
        if job["check"]:
            for line in sanity_check():
                say(line)
        say(f"running {' '.join(job['argv'])}")
        with (work / OUTPUT).open("wb") as out:
            rc = subprocess.run(
                job["argv"], cwd=job["cwd"], env=job["env"], stdout=out, stderr=subprocess.STDOUT
            ).returncode
        status = {"rc": rc}
        say(f"command exited with {rc}")
    except Exception as exc:  # anything before the command: reported to the host as one line
        status = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        say(f"failed: {status['error']}")
    finally:
        if keeper is not None:
            keeper.stop()
    (work / STATUS).write_text(json.dumps(status))
    os.sync()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
