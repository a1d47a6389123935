"""The shell commands of the manual (README.md, docs/*.md and the rule pages docs/rules/*.md, not docs/experiments/
or docs/results/),
collected from its fenced blocks, and how tests/test_docs_commands.py runs each one.

A ```bash (or ```sh / ```shell) fence holds commands: each line is one, a line ending in ``\\`` goes on
into the next, a here-document (``<<'PY'`` ... ``PY``) belongs to its command, lines starting with ``#``
are comments. Every command runs as written unless HTML comments on the lines right above the fence
say otherwise, one directive each (rendered Markdown shows nothing of them):

    <!-- docs-test: tiny num-server-rounds=1 train-subsample=0.02 -->   run-config overrides appended to
                                              each command that takes a run config (-c / --run-config)
    <!-- docs-test: 2: exempt over-60s -->    not run; the reason is one of EXEMPTIONS
    <!-- docs-test: set RUN=$(ls runs | tail -n1) -->  a placeholder's value (shell text, replaced literally)
    <!-- docs-test: setup hospitrust task export ... -->  run before the fence's first command (its inputs)
    <!-- docs-test: 1: server url:http://127.0.0.1:8080/ -->  a long-running command: started, checked
                                              ready (url:, port:N or log:TEXT), stopped; `keep` keeps it to
                                              the page's end (later fences use it)

``N:`` (or ``N,M:``) in front of a directive limits it to the fence's N-th command (from 1). What runs is
what the reader copies, with the placeholders' values and the declared tiny budget: the test prints it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHELL_LANGS = {"bash", "sh", "shell"}
# the only reasons a command may be left unrun (issue 35)
EXEMPTIONS = {"gpu": "needs a GPU", "second-machine": "needs a second machine",
              "over-60s": "longer than 60 s at its smallest budget"}
# how each program takes run-config overrides (a later value wins over an earlier one in each of them)
RUN_CONFIG_FLAGS = {("hospitrust", "simulate"): "-c", ("python", "benchmarks/attack_matrix.py"): "-c",
                    ("flwr", "run"): "--run-config"}
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
# a line of a command in a fence that is not marked as shell (```text is output, and says so)
_COMMAND_LIKE = re.compile(r"^\s*(\$ )?(hospitrust|python3?|flwr|flower-[a-z]+|pip|bash|sudo)\s")


def scope() -> list[Path]:
    """The manual's pages whose commands are tested: README.md, docs/*.md and the rule pages."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "rules").glob("*.md"))]


@dataclass
class Command:
    page: str
    line: int  # the fence's first line (1-based)
    index: int  # the command's place in its fence (1-based)
    text: str  # as the reader copies it
    tiny: str = ""
    exempt: str = ""
    sets: list[tuple[str, str]] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    server: list[str] = field(default_factory=list)  # readiness checks
    keep: bool = False

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} #{self.index}"

    def program(self) -> tuple[str, str]:
        words = self.text.split()
        return (words[0], words[1]) if len(words) > 1 else (words[0], "")

    def runnable(self) -> str:
        """The command that runs: the placeholders replaced, the tiny overrides appended."""
        text = self.text
        for old, new in self.sets:
            text = text.replace(old, new)
        if self.tiny:
            body = strip_comment(text)
            text = f"{body} {RUN_CONFIG_FLAGS[self.program()]} {shlex.quote(self.tiny)}"
        return text


@dataclass
class Fence:
    page: str
    line: int
    lang: str
    body: list[str]
    markers: list[str]


class MarkerError(ValueError):
    pass


def strip_comment(text: str) -> str:
    """``text`` without a trailing ``# comment`` (a ``#`` outside quotes after a blank)."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


def fences(path: Path) -> list[Fence]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start, j = i, i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[j]):
            j += 1
        markers, k = [], start - 1
        while k >= 0 and (mk := _MARKER.match(lines[k])):
            markers.insert(0, mk.group(1))
            k -= 1
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[start + 1:j]]
        out.append(Fence(str(path.relative_to(REPO)), start + 1, lang, body, markers))
        i = j + 1
    return out


def split_commands(body: list[str]) -> list[str]:
    commands, i = [], 0
    while i < len(body):
        line = body[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [line]
        while parts[-1].rstrip().endswith("\\") and i < len(body):
            parts.append(body[i])
            i += 1
        text = "\n".join(parts)
        if m := _HEREDOC.search(text):
            while i < len(body):
                text += "\n" + body[i]
                i += 1
                if body[i - 1].strip() == m.group(2):
                    break
        commands.append(text.strip())
    return commands


def _apply(directive: str, targets: list[Command], fence: Fence) -> None:
    word, _, rest = directive.partition(" ")
    rest = rest.strip()
    if word == "tiny":
        takers = [c for c in targets if c.program() in RUN_CONFIG_FLAGS]
        if not takers or (len(targets) == 1 and not takers):
            raise MarkerError(f"tiny: none of its commands takes a run config ({sorted(' '.join(p) for p in RUN_CONFIG_FLAGS)})")
        for c in takers:
            c.tiny = f"{c.tiny} {rest}".strip()
    elif word == "exempt":
        if rest not in EXEMPTIONS:
            raise MarkerError(f"exempt {rest!r}: the reason must be one of {', '.join(EXEMPTIONS)} ({'; '.join(EXEMPTIONS.values())})")
        for c in targets:
            c.exempt = EXEMPTIONS[rest]
    elif word == "set":  # one placeholder per directive: the value is the rest of the line
        old, eq, new = rest.partition("=")
        if not eq or not old or " " in old:
            raise MarkerError(f"set {rest!r}: write PLACEHOLDER=VALUE")
        if not any(old in c.text for c in targets):
            raise MarkerError(f"set {old!r}: no command it applies to contains it")
        for c in targets:
            c.sets.append((old, new))
    elif word == "setup":
        targets[0].setup.append(rest)
    elif word == "server":
        checks = shlex.split(rest)
        for c in targets:
            c.keep = "keep" in checks
            c.server = [x for x in checks if x != "keep"]
            if not c.server or any(not x.startswith(("url:", "port:", "log:")) for x in c.server):
                raise MarkerError(f"server {rest!r}: say how it is ready: url:URL, port:N or log:TEXT (and keep, to keep it running)")
    else:
        raise MarkerError(f"unknown directive {word!r}: tiny, exempt, set, setup or server")


def commands(path: Path) -> list[Command]:
    """The page's shell commands with their directives applied; MarkerError names a bad marker."""
    out = []
    for fence in fences(path):
        if fence.lang not in SHELL_LANGS:
            if fence.markers:
                raise MarkerError(f"{fence.page}:{fence.line}: a docs-test marker above a ```{fence.lang} fence (only shell fences run)")
            continue
        cmds = [Command(fence.page, fence.line, i + 1, text) for i, text in enumerate(split_commands(fence.body))]
        for marker in fence.markers:
            m = re.match(r"^(\d+(?:,\d+)*):\s*(.*)$", marker)
            picked = cmds
            directive = marker
            if m:
                numbers = [int(n) for n in m.group(1).split(",")]
                if any(n < 1 or n > len(cmds) for n in numbers):
                    raise MarkerError(f"{fence.page}:{fence.line}: {marker!r}: the fence has {len(cmds)} command(s)")
                picked, directive = [cmds[n - 1] for n in numbers], m.group(2)
            try:
                _apply(directive, picked, fence)
            except MarkerError as err:
                raise MarkerError(f"{fence.page}:{fence.line}: {marker!r}: {err}") from None
        out += cmds
    return out


def fixed_ports(path: Path) -> set[str]:
    """The fixed ports the page's servers are checked on (``url:http://127.0.0.1:8080/``, ``port:9096``; not ``$PORTn``)."""
    return {m.group(1) for cmd in commands(path) if not cmd.exempt for check in cmd.server if not check.startswith("log:")
            for m in re.finditer(r":(\d{2,5})\b", check)}


def port_groups() -> dict[str, str]:
    """Page -> the first page (in scope order) it shares a fixed port with, through any chain of pages; only
    pages that share one. Two such pages must not run at once (tests/conftest.py runs them on one worker)."""
    ports = {str(p.relative_to(REPO)): fixed_ports(p) for p in scope()}
    group = {page: page for page in ports}
    for a in ports:
        for b in ports:
            if a < b and ports[a] & ports[b]:
                old, new = group[b], group[a]
                group = {k: (new if v == old else v) for k, v in group.items()}
    return {page: g for page, g in group.items() if sum(1 for v in group.values() if v == g) > 1}


def unmarked_problems(path: Path) -> list[str]:
    """Commands the test would miss: command lines in a fence not marked as shell (```text says output),
    and indented code blocks holding commands (write them as ```bash fences)."""
    problems = []
    for fence in fences(path):
        if fence.lang == "" and any(_COMMAND_LIKE.match(ln) for ln in fence.body):
            problems.append(f"{fence.page}:{fence.line}: a fence without a language holds command lines: "
                            f"```bash if the reader runs them, ```text if they show output or what a command starts")
    lines, in_fence = path.read_text().splitlines(), False
    for n, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.startswith("    ") and _COMMAND_LIKE.match(line) and (n == 0 or not lines[n - 1].strip()
                                                                                          or lines[n - 1].startswith("    ")):
            if not lines[n].lstrip().startswith(("-", "*")) and not re.match(r"^\s*\d+\.", lines[n]):
                problems.append(f"{path.relative_to(REPO)}:{n + 1}: an indented code block with a command: make it a ```bash fence")
    return problems
