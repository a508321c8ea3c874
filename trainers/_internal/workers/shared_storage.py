"""Does every worker see the run's storage where the driver writes it?

A ``storage_path`` on the driver's own disk still "works" on the other nodes, each writing its
checkpoints to its own disk, and the run resumes from nothing after a crash. As Ray Train looks for
a marker file, every worker looks for the driver's lease file (which only this driver writes and
keeps fresh) before training starts: one ``stat`` each, on local disk and object stores alike.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from storage.errors import RunInProgressError, StorageNotSharedError
from storage.filesystem import ShippedFilesystem, display_path, exists, pafs


def what_this_node_sees(filesystem: ShippedFilesystem, path: str) -> tuple[str, str | None]:
    """Run in a worker: this host's name, and why ``path`` is not there for it (None: it is)."""
    host = socket.gethostname()
    try:
        if filesystem.local:  # one stat of this host's disk: no need to load pyarrow for it
            found = os.path.isfile(path)
        else:
            found = filesystem.get().get_file_info(path).type == pafs.FileType.File
    except OSError as error:  # credentials or a route this node lacks
        return host, f"cannot read it ({error})"
    return host, None if found else "does not see it"


def check_every_node_sees(
    filesystem: pafs.FileSystem, marker: str, answers: Sequence[tuple[str, str | None]], node_ids: Sequence[str]
) -> None:
    """Raise ``StorageNotSharedError`` naming each node whose workers answered (in ``answers``,
    beside their nodes' ids in ``node_ids``) that they do not see ``marker``, or
    ``RunInProgressError`` when the driver does not see it either."""
    # Imported here: a worker runs what_this_node_sees, and the cluster's descriptions are the driver's.
    from trainers._internal.workers.start_failure import node_name

    if any(problem for _, problem in answers) and not exists(filesystem, marker):
        # Gone for the driver too: not a storage that is not shared, but a lease this driver lost.
        raise RunInProgressError(
            f"this driver no longer holds the run's lease: its file {display_path(filesystem, marker)} is gone "
            "(another driver took the run over, or the storage failed the lease's heartbeat: the log above says "
            "which). Nothing was trained; rerun, and the run resumes from its last committed checkpoint."
        )
    blind: dict[str, str] = {}
    for (host, problem), node_id in zip(answers, node_ids, strict=True):
        if problem is not None:
            blind.setdefault(f"{node_name(node_id)} on host {host}", problem)
    if not blind:
        return
    folder = display_path(filesystem, marker.rpartition("/")[0])
    nodes = "; ".join(f"{node} {problem}" for node, problem in sorted(blind.items()))
    raise StorageNotSharedError(
        f"the run's folder {folder} is not shared with every node: the driver keeps its lease file "
        f"{marker.rpartition('/')[2]} there, and {nodes}. Its checkpoints would land on its own disk. "
        "Set RunConfig(storage_path=...) to storage every node reaches at the same path (a shared "
        "filesystem, or an object store such as s3://bucket/runs); `python -m trainers.doctor "
        "--storage-path PATH` checks it from every node. Nothing was trained."
    )
