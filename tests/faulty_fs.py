"""A local filesystem behind pyarrow's PyFileSystem that records operations and fails on cue."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow.fs as pafs


class RecordingHandler(pafs.FileSystemHandler):
    """Forwards to the local disk; ``fail_when(op, path)`` returning True makes that call raise."""

    def __init__(self, fail_when: Callable[[str, str], bool] | None = None, delay_s: float = 0.0):
        self.local = pafs.LocalFileSystem()
        self.ops: list[tuple[str, str]] = []
        self.fail_when = fail_when or (lambda op, path: False)
        self.delay_s = delay_s

    def _hit(self, op: str, path: str) -> None:
        self.ops.append((op, path))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_when(op, path):
            raise OSError(f"injected failure: {op} {path}")

    # identity
    def get_type_name(self):
        return "faulty"

    def equals(self, other):
        return other is self

    def normalize_path(self, path):
        return path

    # metadata
    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    # changes
    def create_dir(self, path, recursive):
        self._hit("create_dir", path)
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self._hit("delete_dir", path)
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self._hit("delete_dir_contents", path)
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("not in tests")

    def delete_file(self, path):
        self._hit("delete_file", path)
        self.local.delete_file(path)

    def move(self, src, dest):
        self._hit("move", dest)
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self._hit("copy_file", dest)
        self.local.copy_file(src, dest)

    # streams
    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        self._hit("write", path)
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        self._hit("append", path)
        return self.local.open_append_stream(path)


def faulty_fs(**kwargs) -> tuple[pafs.PyFileSystem, RecordingHandler]:
    handler = RecordingHandler(**kwargs)
    return pafs.PyFileSystem(handler), handler
