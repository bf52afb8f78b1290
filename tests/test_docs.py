"""The README and docs/ as a reader meets them: every command, option and op they show exists, every link lands,
and every figure they cite has one source (or all of its citations agree with the thing it measures)."""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```[ \t]*$", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]`]|`[^`]*`)*\]\(([^()\s]+)\)")
SEPARATORS = {";", "|", "||", "&&", "&"}


def pages() -> dict[Path, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {path: path.read_text(encoding="utf-8") for path in paths}


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- commands, options and ops ------------------------------------------------------------------------------------


def cli_tree() -> Any:
    """The click command tree typer builds, with every command module registered (as tests/test_cli_options.py)."""
    import typer.main

    import drover.cli.main  # noqa: F401 - registers every command on the apps
    from drover.cli.app import app

    return typer.main.get_command(app)


def shown_lines(text: str) -> Iterator[str]:
    """What a page shows as something to type: the `$ ` lines of console blocks, every line of sh and crontab
    blocks, and every inline code span of its prose (a span may wrap across lines)."""
    for match in FENCE.finditer(text):
        lang, body = match.group(1), match.group(2)
        if lang == "console":
            yield from (line[2:] for line in body.splitlines() if line.startswith("$ "))
        elif lang in ("sh", "crontab"):
            yield from body.splitlines()
    for span in INLINE.findall(FENCE.sub("", text)):
        yield " ".join(span.split())


def invocations(line: str, commands: set[str], groups: frozenset[str] = frozenset()) -> Iterator[list[str]]:
    """The argument lists of each `drover` a shell line runs (after env assignments or a crontab's time fields).
    An inline span that starts with a drover command and an option (`send --expect-engine`), or with a command
    group and a word (`fleet check`), counts as one too."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in a fragment of prose
        words = line.split()
    if len(words) > 1 and words[0] in commands and words[1].startswith("--"):
        words = ["drover", *words]
    elif len(words) > 1 and words[0] in groups and re.fullmatch(r"[a-z][a-z-]*", words[1]):
        words = ["drover", *words]
    segment: list[str] = []
    for word in [*words, ";"]:
        if word not in SEPARATORS:
            segment.append(word)
            continue
        for i, w in enumerate(segment):
            if Path(w.removeprefix("$(")).name == "drover":
                if all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*|[\d*/,-]+", before) for before in segment[:i]):
                    args = []
                    for arg in segment[i + 1 :]:
                        if re.match(r"\d*[<>]", arg):  # a redirection ends the command's arguments
                            break
                        args.append(arg.removesuffix(")"))
                    if args and re.match(r"-|[a-z][a-z-]*$", args[0]):  # not prose like `drover (ACTOR)`
                        yield args
                break
        segment = []


def options(command: Any) -> dict[str, Any]:
    return {
        opt: param for param in command.params if param.param_type_name == "option" for opt in param.opts + param.secondary_opts
    }


def problems_of(argv: list[str], root: Any, ops: set[str]) -> list[str]:
    """What is wrong with `drover ARGV` as the CLI sees it: a command or subcommand it does not have, an option
    neither that command nor the top level takes, an op that is not registered."""
    found = []
    command, path, positionals = root, ["drover"], 0
    i = 0
    while i < len(argv):
        word = argv[i].strip("[]")
        i += 1
        if word == "--":
            break
        if word in ("…", "...", "-") or not word:
            continue
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            opt = options(command).get(flag) or options(root).get(flag)
            if flag == "--help":
                continue
            if opt is None:
                found.append(f"`{' '.join(path)}` has no option {flag}")
            elif not opt.is_flag and not opt.count and "=" not in word:
                i += 1  # its value
            continue
        if hasattr(command, "commands") and not positionals:
            if word in command.commands:
                command = command.commands[word]
                path.append(word)
                continue
            found.append(f"`{' '.join(path)}` has no command {word!r}")
            break
        if path == ["drover", "op"] and not positionals and re.fullmatch(r"[a-z][a-z_]*(\.[a-z_]+)*", word):
            if word not in ops:
                found.append(f"`drover op {word}`: no such op")
        positionals += 1
    return found


def command_problems(texts: dict[Path, str]) -> list[str]:
    from drover.ops import REGISTRY

    root = cli_tree()
    commands = set(root.commands)
    groups = frozenset(word for word, command in root.commands.items() if getattr(command, "commands", None))
    found = []
    for path, text in texts.items():
        for line in shown_lines(text):
            for argv in invocations(line, commands, groups):
                found += [f"{name(path)}: {line!r}: {problem}" for problem in problems_of(argv, root, set(REGISTRY))]
    return found


def test_every_command_option_and_op_shown_exists() -> None:
    assert command_problems(pages()) == []


def test_the_command_check_sees_what_is_wrong() -> None:
    """The checker itself, on lines a page could hold: each wrong one is caught, each right one passes."""
    bad = {
        "$ drover sned local:%1 hi": "no command 'sned'",
        "drover fleet list": "no command 'list'",
        "drover send local:%1 hi --wait": "no option --wait",
        "DROVER_DAEMON=0 drover ls --held-since 1d": "no option --held-since",
        "echo hi | drover op sessions.mesage -": "no such op",
        "send --no-such-flag": "no option --no-such-flag",
        "fleet trust": "no command 'trust'",
        "* * * * * /usr/bin/drover nudge run --dyr-run >>log 2>&1": "no option --dyr-run",
    }
    good = [
        "drover --actor alice send local:%3 hi --actor bob",
        "drover send local:%3 -- --force is fine",
        "drover op fleet.add '{\"name\": 1}'",
        "drover op VERB JSON",
        "drover spawn HOST --engine claude|codex --cwd DIR [--name NAME] --brief TEXT",
        "drover log show msg_1 ; drover wait-file box-a f --changed",
        'from-name="drover (ACTOR)"',
    ]
    for line, why in bad.items():
        page = f"```console\n{line}\n```\n" if line.startswith("$ ") else f"`{line}`"
        found = command_problems({ROOT / "x.md": page})
        assert len(found) == 1 and why in found[0], (line, found)
    assert command_problems({ROOT / "x.md": "".join(f"`{line}`\n" for line in good)}) == []


# -- links --------------------------------------------------------------------------------------------------------


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces as `-`, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def link_problems(texts: dict[Path, str]) -> list[str]:
    found = []
    for path, text in texts.items():
        for target in LINK.findall(FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if dest not in texts and not dest.exists():
                found.append(f"{name(path)}: {target}: no such file")
            elif anchor:
                dest_text = texts.get(dest) or dest.read_text(encoding="utf-8")
                if anchor not in anchors(dest_text):
                    found.append(f"{name(path)}: {target}: no heading with that anchor")
    return found


def test_every_link_between_the_pages_lands() -> None:
    texts = pages()
    assert link_problems(texts) == []
    # and the README links every page of docs/
    readme = texts[ROOT / "README.md"]
    for path in texts:
        if path.parent.name == "docs":
            assert f"(docs/{path.name})" in readme, f"the README does not link {name(path)}"


def test_the_link_check_sees_a_missing_file_or_anchor() -> None:
    page = ROOT / "docs" / "x.md"
    text = "# Title\n## A `b` (c)\n[ok](#a-b-c) [ok](../README.md#set-up) [bad](#a-b) [bad](nope.md) [bad](../README.md#nope)"
    found = link_problems({page: text})
    assert [f.split(": ")[1] for f in found] == ["#a-b", "nope.md", "../README.md#nope"], found


# -- figures ------------------------------------------------------------------------------------------------------


def everything() -> str:
    return "\n".join(pages().values())


def citations(pattern: str, text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(pattern, text)]


def test_figures_without_a_source_here_are_cited_once() -> None:
    """The test count and the suite's minutes come from a measured run: one place states them."""
    text = everything()
    assert len(citations(r"\b(\d[\d,]*) tests\b", text)) == 1
    assert len(citations(r"about (\d+) minutes", text)) == 1


def agrees(cited: str, pinned: str) -> bool:
    """`0.169` cites `0.169.0`; `0.16` does not."""
    return pinned == cited or pinned.startswith(cited + ".")


VERSION = r"(\d+(?:\.\d+)+)(?![\d.]*\d)"


def test_engine_versions_cited_are_the_ones_the_tests_run() -> None:
    from tests.support import claudelab, codexlab, geminilab

    text = " ".join(everything().split())
    pins = {
        r"(?:Claude Code|`claude` binary) \(?" + VERSION + r"(?! and later)": claudelab.VERSION,
        r"Codex(?: CLI)? \(?" + VERSION: codexlab.VERSION,
        r"gemini-cli \(?" + VERSION: geminilab.VERSION,
        r"installs Node (\d+)\b": geminilab.NODE_VERSION,
    }
    for pattern, pinned in pins.items():
        cited = citations(pattern, text)
        assert cited, f"no citation of {pattern}"
        assert all(agrees(c, pinned) for c in cited), (pattern, cited, pinned)


def test_python_versions_cited_are_the_ones_drover_requires() -> None:
    """`X.Y+` near `python3`, a host, the helper or the remote side is the remote side's minimum
    (drover/remote/protocol.py); anywhere else it is drover's own, from pyproject.toml's requires-python."""
    from drover.remote import protocol

    remote = ".".join(str(part) for part in protocol.MIN_PYTHON)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    required = re.fullmatch(r">=\s*(\d+\.\d+)", project["requires-python"])
    assert required, project["requires-python"]
    local = required.group(1)
    text = " ".join(everything().split())
    sides: dict[str, list[str]] = {"remote": [], "local": []}
    for m in re.finditer(r"(?<![\d.])(\d+\.\d+)\+", text):
        before = text[max(0, m.start() - 80) : m.start()]
        side = "remote" if re.search(r"python3|host|helper|remote", before) else "local"
        sides[side].append(m.group(1))
    assert sides["remote"] and set(sides["remote"]) == {remote}, sides
    assert sides["local"] and set(sides["local"]) == {local}, sides


def remote_bundle() -> tuple[int, int]:
    from drover.transport import bundle

    blob, _hash = bundle.build()
    source = sum(len(path.read_bytes()) for path in bundle.REMOTE_DIR.glob("*.py"))
    return len(blob), source


def test_the_bundle_size_is_cited_once_and_measured() -> None:
    text = " ".join(everything().split())
    assert len(citations(r"(\d+) KB\b", text)) == 2, "the bundle's size and its source's, in one place"
    (cited,) = re.findall(r"about (\d+) KB, compressed from about (\d+) KB of source", text)
    compressed, source = remote_bundle()
    for figure, real in zip(cited, (compressed, source), strict=True):
        assert abs(int(figure) * 1000 - real) <= 0.1 * real, f"{figure} KB is cited; it is {real / 1000:.0f} KB now"


# -- navigation ---------------------------------------------------------------------------------------------------


def test_each_page_has_its_own_contents() -> None:
    """Each page opens with a list of its sections (the README's `Contents`, a docs page's `On this page`)."""
    for path, text in pages().items():
        heads = re.findall(r"^## (.+)$", FENCE.sub("", text), re.M)
        assert heads, f"{name(path)} has no sections"
        marker = "**Contents:**" if path.name == "README.md" else "**On this page**"
        assert marker in text, f"{name(path)} has no contents"
        contents = text.split(marker, 1)[1].split("\n## ", 1)[0]
        for head in heads:
            assert f"[{head}](#" in contents, f"{name(path)}: '{head}' is not in its contents"


def test_every_command_is_shown_somewhere() -> None:
    """A reader finds each command of the CLI in the docs, with how it is typed."""
    shown = {" ".join(argv[:2]) for text in pages().values() for line in shown_lines(text) for argv in invocations(line, set())}
    root = cli_tree()
    for word, command in root.commands.items():
        names = [f"{word} {sub}" for sub in getattr(command, "commands", {})] or [word]
        for typed in names:
            assert any(s == typed or s.startswith(typed + " ") for s in shown), f"`drover {typed}` is shown nowhere"


def layout_problems(text: str) -> list[str]:
    """docs/layout.md's tables against the tree: every module of drover/ they name is there, and every module there
    is named. A path from the top is checked as written; a bare module name belongs to its row's directory (the
    remote table's rows name none: drover/remote/). tests/ and bench/ rows name their files loosely: not checked."""
    found = []
    named: set[Path] = set()
    for first, second in re.findall(r"^\| ([^|]*`[^|]*) \| (.+) \|$", text, re.M):
        where = next((cell for cell in re.findall(r"`([^`]+)`", first) if cell.endswith("/")), "drover/remote/")
        for module in re.findall(r"`([\w/.]+\.py)`", first + " " + second):
            if "/" not in module and not where.startswith("drover/"):
                continue
            path = ROOT / (module if "/" in module else where + module)
            named.add(path)
            if not path.exists():
                found.append(f"{module} ({where}) is named but does not exist")
    for module in sorted((ROOT / "drover").rglob("*.py")):
        if module.name not in ("__init__.py", "__main__.py") and module not in named:
            found.append(f"{module.relative_to(ROOT)} is not in the layout")
    return found


def test_the_layout_names_every_module_and_only_those() -> None:
    assert layout_problems((ROOT / "docs" / "layout.md").read_text(encoding="utf-8")) == []
