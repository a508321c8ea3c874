"""The documentation's runnable examples run, and the README stays the front door.

A code block is runnable when the line right before its opening fence is ``<!-- runnable -->``
(docs/contributing.md says how to write one). Each runs with ``exec`` in a fresh namespace, in a
temporary working directory, beside the shared local Ray of the test session.
"""

from __future__ import annotations

import pathlib
import re
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = "<!-- runnable -->"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_FENCE = re.compile(r"^(`{3,})(.*)$")


def runnable_blocks(path: pathlib.Path) -> tuple[list[tuple[int, str]], list[str]]:
    """The runnable blocks of ``path`` as (line of the fence, code), and the misplaced markers.

    Markers inside another fenced block (an example of the marker itself) are text, not markers.
    """
    lines = path.read_text().splitlines()
    blocks: list[tuple[int, str]] = []
    problems: list[str] = []
    fence: str | None = None  # the backticks of the block we are inside, if any
    start = 0
    runnable = False
    for number, line in enumerate(lines, start=1):
        match = _FENCE.match(line)
        if fence is not None:
            if match and match.group(1) == fence and not match.group(2).strip():
                if runnable:
                    blocks.append((start, "\n".join(lines[start : number - 1]) + "\n"))
                fence, runnable = None, False
            continue
        if match:
            fence, start = match.group(1), number
            runnable = number > 1 and lines[number - 2].strip() == MARKER
            if runnable and match.group(2).strip() != "python":
                problems.append(f"{path.name}:{number}: a runnable block must be ```python, not {line!r}")
                runnable = False
        elif line.strip() == MARKER and not (number < len(lines) and _FENCE.match(lines[number])):
            problems.append(f"{path.name}:{number}: {MARKER} is not right before a ```python fence")
    return blocks, problems


EXAMPLES = [
    pytest.param(path, line, code, id=f"{path.name}:{line}")
    for path in PAGES
    for line, code in runnable_blocks(path)[0]
]


def test_markers_sit_on_python_blocks():
    problems = [problem for path in PAGES for problem in runnable_blocks(path)[1]]
    assert not problems, "\n".join(problems)
    # The guides that promise examples keep at least one each.
    pages_with_examples = {param.values[0].name for param in EXAMPLES}
    assert {"getting-started.md", "checkpoints.md", "fault-tolerance.md", "data.md"} <= pages_with_examples


def test_marker_parsing(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n<!-- runnable -->\n```python\nx = 1\n```\n"  # runnable
        "```python\ny = 2\n```\n"  # not marked
        "````markdown\n<!-- runnable -->\n```python\nz\n```\n````\n"  # a marker shown as an example
        "<!-- runnable -->\n```bash\nls\n```\n"  # wrong language
        "<!-- runnable -->\n\n```python\nw\n```\n"  # not right before the fence
    )
    blocks, problems = runnable_blocks(page)
    assert blocks == [(3, "x = 1\n")]
    assert len(problems) == 2 and "```bash" in problems[0] and ":19:" in problems[1]


@pytest.mark.parametrize(("path", "line", "code"), EXAMPLES)
def test_runnable_example(ray_local, path, line, code, tmp_path, monkeypatch):
    # An example shows what it promises with an assert, so a change that breaks the promise fails here.
    assert "assert " in code, f"{path.name}:{line}: a runnable example must assert what it shows"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # mkdtemp() and friends land in tmp_path
    # A module name no process can import: Ray pickles the example's functions by value.
    exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), {"__name__": "docs_example"})


def test_readme_is_the_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 160
    # The two commands, exactly as a new user first reads them.
    assert "\nmake demo    # " in text and "\nmake test    # " in text
    # mkdocs checks the links between docs pages; the README is not one of them, so check its own.
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert targets and not [target for target in targets if not (ROOT / target).exists()]
    # The docs stand on their own: nothing points outside the repository.
    assert not [page.name for page in PAGES if "../shared" in page.read_text()]
