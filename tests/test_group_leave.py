"""A rank that leaves its torch group frees the peers waiting on it in a collective, even while
something still holds the group (a DDP model the user's code keeps): the connections the group
opened are shut (``connections.forming_group``, ``TorchProcess.leave_group``). Plain ``torch.multiprocessing``, no Ray.

Without it, a rank that raised kept its sockets open for as long as its model lived: in an 8-rank
ring, the ranks waiting on the raising ones stayed blocked in C++ until the controller gave up on
them (10 s) and replaced them with new processes.
"""

from __future__ import annotations

import os
import queue
import time

WORLD = 6
DEAD_RANK = 1
#: How long every rank keeps its model (and so its group) after it left: longer than the test.
HOLD_S = 300


def _rank(rank: int, port: int, said: queue.Queue) -> None:
    import torch

    from trainers.torch.process import TorchProcess
    from trainers.torch.rendezvous import join_at_store

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
    join_at_store("127.0.0.1", port, "test/", "gloo", 600, {})  # a collective waits 10 minutes
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    features = torch.randn(8, 256)
    try:
        for step in range(100_000):
            if step == 20 and rank == DEAD_RANK:
                os._exit(1)
            model(features).sum().backward()
    except RuntimeError:  # a peer's connection closed: this rank's collective failed
        pass
    TorchProcess.leave_group()  # while the model still holds the group, as a user's loop may
    said.put(rank)
    time.sleep(HOLD_S)
    del model


def test_every_survivor_gets_out_of_a_ring_whose_rank_died_while_all_still_hold_their_models():
    import torch.distributed as dist
    import torch.multiprocessing as mp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    context = mp.get_context("spawn")
    said = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, store.port, said), daemon=True) for rank in range(WORLD)]
    for process in processes:
        process.start()
    survivors = set(range(WORLD)) - {DEAD_RANK}
    out: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while out != survivors and time.monotonic() < deadline:
            try:
                out.add(said.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                break
        # Every survivor still holds its model, so none got out through another one's exit.
        assert [rank for rank in survivors if not processes[rank].is_alive()] == []
        assert out == survivors, f"rank(s) still waiting in the collective: {sorted(survivors - out)}"
    finally:
        for process in processes:
            process.kill()
