"""The ``curl`` examples of a Markdown page, run against a live server as a reader would run them.

Every fenced code block is read; a ``curl`` command (with its ``\\``-continued lines) is one
example. A comment line ``# Needs <what>: ...`` labels the examples after it, to the end of its
block, as needing something the demo does not have (a stream, another store): such an example is
reported with its label instead of run. A command is run in two steps so that it means what it
means in a shell: ``bash`` makes its words (quotes, ``$(...)``, trailing comments), then the words
are read as curl's options and sent with httpx. An option this reader does not know fails the
test rather than being ignored.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_FENCE = re.compile(r"^\s*```")
_NEEDS = re.compile(r"^\s*#\s*Needs (.+?):")


@dataclass(frozen=True)
class CurlExample:
    """One ``curl`` command of a page: where it is, its text, and what it needs (None: the demo)."""

    source: str
    command: str
    needs: str | None = None


@dataclass
class CurlRequest:
    """What a curl command sends: method, URL, headers, body, and where the answer is written."""

    url: str
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    output: str | None = None


def curl_examples(path: Path) -> list[CurlExample]:
    """Every ``curl`` command in the fenced code blocks of ``path``, in page order."""
    found: list[CurlExample] = []
    in_block, needs = False, None
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            in_block, needs = not in_block, None
        elif in_block and (label := _NEEDS.match(line)):
            needs = label[1]
        elif in_block and line.strip().startswith("curl "):
            start = i
            while lines[i].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
            found.append(CurlExample(f"{path.name}:{start + 1}", "\n".join(lines[start:i + 1]).strip(), needs))
        i += 1
    return found


def shell_words(command: str, cwd: Path) -> list[str]:
    """The words ``bash`` makes of ``command`` after its first (``curl``)."""
    script = "words() { printf '%s\\0' \"$@\"; }\nwords " + command.strip().removeprefix("curl")
    out = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, check=True, timeout=30).stdout
    return out.decode().split("\0")[:-1]


def parse_curl(words: list[str], cwd: Path) -> CurlRequest:
    """The request curl would send for ``words`` (the options the docs use)."""
    request = CurlRequest(url="")
    it = iter(words)
    for word in it:
        if word in ("-s", "--silent", "--path-as-is"):
            continue
        if word in ("-X", "--request"):
            request.method = next(it)
        elif word in ("-H", "--header"):
            name, _, value = next(it).partition(":")
            request.headers[name.strip().lower()] = value.strip()
        elif word in ("-d", "--data", "--data-binary"):
            data = next(it)
            request.body = (cwd / data[1:]).read_bytes() if data.startswith("@") else data.encode()
            if request.method == "GET":
                request.method = "POST"
        elif word in ("-o", "--output"):
            request.output = next(it)
        elif word.startswith("-"):
            raise AssertionError(f"curl option {word!r} is not known to tests/support/doc_examples.py")
        else:
            assert not request.url, f"two URLs: {request.url} and {word}"
            request.url = word
    assert request.url, f"no URL in {words}"
    return request


def run_curl(command: str, cwd: Path, timeout_s: float = 60) -> httpx.Response:
    """Send what ``command`` sends; write the body where ``-o`` says (relative to ``cwd``)."""
    request = parse_curl(shell_words(command, cwd), cwd)
    answer = httpx.request(request.method, request.url, headers=request.headers, content=request.body,
                           timeout=timeout_s)
    if request.output is not None:
        (cwd / request.output).write_bytes(answer.content)
    return answer
