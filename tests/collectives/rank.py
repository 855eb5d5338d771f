"""One rank of a collectives test, run inside a lab host (`lab.exec_command`).

    rank.py STORE OUT RANK WORLD cases CASES.json             # run each case, save results as .npy in OUT
    rank.py STORE OUT RANK WORLD loop COUNT [--iterations N]   # the all-reduce loop of the failover test
    rank.py STORE OUT RANK WORLD mismatch                      # arrays of different sizes on each rank

It prints JSON lines: {"ready", "resilient"} once the ring is connected; in the loop {"progress": i,
"at": time.time()} every PROGRESS_EVERY iterations and {"iterations": n} at its end; {"done": true} last.
A collective's failure in the loop is said too ({"error", "kind", "at"}) before it ends the rank. Errors go
to stderr, with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
from cases import LATE, Case, all_to_all_piece, make_input

from libshift.collectives import CollectiveError, Communicator, FileStore, ReduceOp

PROGRESS_EVERY = 5


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def handed(case: Case, array: np.ndarray) -> object:
    """What the collective gets: the array, or in a torch case a tensor over the same memory."""
    if not case.torch:
        return array
    import torch  # here only: torch takes seconds to load

    return torch.from_numpy(array)


def run_case(comm: Communicator, case: Case, index: int, out: Path) -> None:
    rank, world = comm.rank, comm.world_size
    mine = make_input(case, index, rank)
    results: list[np.ndarray] = []
    if case.late == rank:
        time.sleep(LATE)
    if case.collective == "all_reduce":
        comm.all_reduce(handed(case, mine), case.reduce_op)
        results = [mine]
    elif case.collective == "broadcast":
        if rank != case.root:
            mine[...] = 0
        comm.broadcast(handed(case, mine), case.root)
        results = [mine]
    elif case.collective == "all_gather":
        results = [np.zeros_like(mine) for _ in range(world)]
        comm.all_gather([handed(case, r) for r in results], handed(case, mine))
    elif case.collective == "reduce_scatter":
        inputs = [make_input(case, index, rank, part=q) for q in range(world)]
        results = [np.zeros_like(mine)]
        comm.reduce_scatter(handed(case, results[0]), [handed(case, x) for x in inputs], case.reduce_op)
    elif case.collective == "reduce":
        comm.reduce(handed(case, mine), case.root, case.reduce_op)
        results = [mine]
    elif case.collective == "gather":
        results = [np.zeros_like(mine) for _ in range(world)] if rank == case.root else []
        comm.gather([handed(case, r) for r in results] or None, handed(case, mine), case.root)
    elif case.collective == "scatter":
        inputs = [make_input(case, index, rank, part=q) for q in range(world)] if rank == case.root else []
        results = [np.zeros_like(mine)]
        comm.scatter(handed(case, results[0]), [handed(case, x) for x in inputs] or None, case.root)
    elif case.collective == "all_to_all":
        inputs = [all_to_all_piece(case, index, rank, q) for q in range(world)]
        results = [np.zeros_like(all_to_all_piece(case, index, q, rank)) for q in range(world)]
        comm.all_to_all([handed(case, r) for r in results], [handed(case, x) for x in inputs])
    else:
        comm.barrier()
    for k, result in enumerate(results):
        np.save(out / f"{index}-{rank}-{k}.npy", result)


def run_loop(comm: Communicator, count: int, iterations: int | None, out: Path) -> None:
    """x <- all_reduce(x) / world + the rank's input, over and over: a lost, doubled or stale chunk
    anywhere changes the final x. Each iteration also passes the all-reduced x on to the right neighbour
    by send and recv, and checks what came from the left. Without `iterations`, until rank 0 reads a
    line on stdin: every iteration all-reduces a stop flag too, so that all ranks stop after the same
    iteration."""
    mine = make_input(Case("all_reduce", "float32", count), 0, comm.rank)
    x = mine.copy()
    came = np.empty_like(x)  # the receive's array, the same every time, as a pipeline stage's are
    told = threading.Event()
    if iterations is None and comm.rank == 0:
        threading.Thread(target=lambda: (sys.stdin.readline(), told.set()), daemon=True).start()
    done = 0
    while done != iterations:
        try:
            if iterations is None:
                stop = np.array([told.is_set()], np.uint8)
                comm.all_reduce(stop, ReduceOp.MAX)
                if stop[0]:
                    break
            comm.all_reduce(x)
            np.divide(x, comm.world_size, out=x)
            pass_on(comm, x, came, done)
        except CollectiveError as exc:
            say(error=str(exc), kind=type(exc).__name__, at=time.time())
            raise
        x += mine
        done += 1
        if done % PROGRESS_EVERY == 0:
            say(progress=done, at=time.time())
    np.save(out / f"loop-{comm.rank}.npy", x)
    say(iterations=done)


def pass_on(comm: Communicator, x: np.ndarray, came: np.ndarray, tag: int) -> None:
    """Point to point in the loop: x (all-reduced, so the same bits on every rank) goes to the right
    neighbour while the left's comes into `came` (1 MiB, so from the third iteration on straight into it:
    collectives/direct.py); what comes must be x, bit for bit."""
    n = comm.world_size
    came.fill(0)
    ended: list[BaseException | None] = []
    both = threading.Semaphore(0)

    def end(error: BaseException | None) -> None:
        ended.append(error)
        both.release()

    comm.send(x, (comm.rank + 1) % n, tag, end)
    comm.recv(came, (comm.rank - 1) % n, tag, end)
    for _ in range(2):
        if not both.acquire(timeout=60):
            raise CollectiveError(f"rank {comm.rank}: the neighbours' exchange {tag} did not end in 60 s")
    if any(ended):
        raise next(error for error in ended if error)
    if not np.array_equal(came, x):
        raise CollectiveError(f"rank {comm.rank}: exchange {tag} brought other bits than the all-reduce's")


def run_mismatch(comm: Communicator) -> None:
    """A user mistake: every rank all-reduces an array of a different size. Report both errors: the
    collective's, and the next call's."""
    errors = []
    for _ in range(2):
        try:
            comm.all_reduce(np.zeros(1000 * (comm.rank + 1), np.float32))
        except CollectiveError as exc:
            errors.append(str(exc))
    say(errors=errors)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("out", type=Path)
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    sub = parser.add_subparsers(dest="mode", required=True)
    cases = sub.add_parser("cases")
    cases.add_argument("file", type=Path)
    loop = sub.add_parser("loop")
    loop.add_argument("count", type=int)
    loop.add_argument("--iterations", type=int, help="default: until rank 0 reads a line on stdin")
    sub.add_parser("mismatch")
    args = parser.parse_args()
    with Communicator(FileStore(args.store), args.rank, args.world, timeout=60) as comm:
        say(ready=True, resilient=comm.resilient)
        if args.mode == "mismatch":
            run_mismatch(comm)
        elif args.mode == "loop":
            run_loop(comm, args.count, args.iterations, args.out)
        else:
            for index, fields in enumerate(json.loads(args.file.read_text())):
                run_case(comm, Case(**fields), index, args.out)
        if args.mode != "mismatch":
            comm.barrier()
    say(done=True)


if __name__ == "__main__":
    main()
