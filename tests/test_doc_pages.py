"""The README and docs/ pages: every relative link and anchor resolves, every command shown parses.

Links: each relative link (and `#anchor`) of README.md and docs/*.md must name a file that exists and, for a
Markdown target, a heading of that file, slugged the way GitHub does (lowercase, punctuation but `-` and `_`
removed, each space a hyphen, `-1`, `-2` ... for repeated headings). External http(s) and mailto links are not
fetched. Commands: every `emulator ...` command in the fenced code blocks of README.md and docs/*.md is parsed by
the CLI's own argparse parser (nothing runs), and the run, sweep, cluster and program files it names must exist
in the repository. Each checker has a self-test feeding it broken input. (The README's ```python examples are run
by tests/emulator/results/test_docs.py.)
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


# -- links and anchors ----------------------------------------------------------------------------------------------


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, line))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: formatting dropped, lowercase, punctuation out, spaces to hyphens."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file: its headings' slugs (repeats numbered) and explicit HTML ids."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        found.update(_HTML_ID.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition outside code."""
    out = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        m = _REFERENCE_DEF.match(line)
        if m:
            out.append((number, m.group(1)))
            continue
        bare = _CODE_SPAN.sub(lambda s: "x" * len(s.group(0)), line)
        out.extend((number, target) for target in _INLINE_LINK.findall(bare))
    return out


def broken_links(path: Path) -> list[str]:
    """One line per link of `path` whose file or anchor does not resolve; external links are skipped."""
    problems = []
    for number, target in links(path):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def test_doc_files_are_there():
    names = {p.name for p in DOC_FILES}
    assert {"README.md", "index.md"} <= names and len(DOC_FILES) > 5, names


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(path):
    assert broken_links(path) == []


def test_every_docs_page_is_reachable_from_the_readme_and_in_the_mkdocs_nav():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README) if t.startswith("docs/")}
    pages = set(DOC_FILES[1:])
    assert pages <= linked | {p for p in pages if p.name == "index.md"}, sorted(str(p) for p in pages - linked)
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert all(re.search(rf":\s*{re.escape(p.name)}\s*$", mkdocs, re.M) for p in pages), "a page missing from nav"


def test_slugs_follow_github():
    assert github_slug("The reference scenario, end to end: 3072 GPUs on four hosts, live in Grafana") == (
        "the-reference-scenario-end-to-end-3072-gpus-on-four-hosts-live-in-grafana"
    )
    assert github_slug("5. Run") == "5-run"
    assert github_slug("`ranks.csv`") == "rankscsv"
    assert github_slug("Or: the Ray cluster launcher") == "or-the-ray-cluster-launcher"
    assert github_slug("A - B_c") == "a---b_c"


def test_the_link_checker_reports_what_is_broken(tmp_path):
    """The checker itself: broken files and anchors are reported, good ones (repeats, other files) are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Part: one\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Sub\n\n## Sub\n\n```bash\n# not a heading\n[not a link](nowhere.md)\n```\n\n"
        "[fine](#sub) [repeat](#sub-1) [other](other.md#part-one) [web](https://example.com/x#y)\n"
        "[bad anchor](#nope) [too many](#sub-2) [no file](missing.md) [no anchor there](other.md#sub)\n"
        "`[in code](gone.md)` [ref]: also-missing.md\n\n[def]: also-missing.md\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    reported = [p.split(": ", 2)[1] for p in problems]
    assert reported == ["#nope", "#sub-2", "missing.md", "other.md#sub", "also-missing.md"], problems
    assert anchors(page) == {"title", "sub", "sub-1"}


# -- commands -------------------------------------------------------------------------------------------------------

_CONTROL = {"&&", "||", ";", "&"}
_UNPARSABLE = ("|", "<", ">", "(", ")", "$", "`", "*")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of every fenced code block."""
    blocks, current, fence, info = [], [], None, ""
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m and fence is None:
            fence, info, current = m.group(1), line.strip()[3:].strip(), []
        elif m and m.group(1) == fence and not line.strip()[3:].strip():
            blocks.append((info, current))
            fence = None
        elif fence is not None:
            current.append(line)
    return blocks


def shell_commands(info: str, lines: list[str]) -> list[str]:
    """The logical command lines of a block: continuations joined; in a text block, only `$ ` prompts."""
    shell = info in ("", "bash", "sh", "shell", "console")
    out, pending = [], ""
    for line in lines:
        if not shell:
            if line.startswith("$ "):
                out.append(line[2:])
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def tokens(command: str) -> list[str] | None:
    """Shell words and operators of a command line, comments dropped; None where it cannot be split."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:
        return None


def emulator_invocations(command: str) -> tuple[list[list[str]], list[str]]:
    """(argument lists of the `emulator` invocations, the ones skipped: shell syntax, `[--optional]` synopses)."""
    words = tokens(command)
    if words is None:
        return [], [command] if "emulator" in command else []
    found, skipped, segment = [], [], []
    for word in [*words, ";"]:
        if word not in _CONTROL:
            segment.append(word)
            continue
        rest = segment
        while rest and _ASSIGNMENT.match(rest[0]):
            rest = rest[1:]
        if "--" in rest and rest[0] == "ray":  # ray job submit ... -- emulator ...
            rest = rest[rest.index("--") + 1 :]
        start = 1 if rest[:1] == ["emulator"] else 3 if rest[:3] == ["python", "-m", "emulator"] else None
        if start is not None:
            if any(ch in w for w in rest for ch in _UNPARSABLE) or any(w.startswith("[") for w in rest):
                skipped.append(" ".join(segment))
            else:
                found.append(rest[start:])
        segment = []
    return found, skipped


def copies(commands: list[str]) -> set[Path]:
    """Files a block creates with `cp SRC DST` before it uses them."""
    made = set()
    for command in commands:
        words = tokens(command) or []
        if len(words) >= 3 and words[0] == "cp" and not words[2].startswith("-"):
            made.add((ROOT / words[2]).resolve())
    return made


def named_files(args) -> list[str]:
    """The repository files an invocation reads: run, sweep and cluster files, a --program file, a
    torchrun script."""
    out = []
    for attr in ("run_file", "sweep_file", "run", "script"):
        value = getattr(args, attr, None)
        if isinstance(value, str) and (value.endswith((".yaml", ".yml")) or "/" in value):
            out.append(value)
    cluster = getattr(args, "cluster", None)
    if cluster:  # a file, or a preset name: configs/clusters/<name>.yaml
        out.append(
            cluster if cluster.endswith((".yaml", ".yml")) or "/" in cluster else f"configs/clusters/{cluster}.yaml"
        )
    program = getattr(args, "program", None)
    if program:
        out.append(program.rsplit(":", 1)[0])
    return out


def check_commands(text: str) -> tuple[list[str], list[str], list[str]]:
    """(commands parsed, problems, skipped) for the emulator commands of a Markdown text's code blocks."""
    from emulator.cli import build_parser

    parser = build_parser()
    parsed, problems, skipped = [], [], []
    for info, lines in fenced_blocks(text):
        commands = shell_commands(info, lines)
        made = copies(commands)
        for command in commands:
            invocations, skips = emulator_invocations(command)
            skipped += skips
            for argv in invocations:
                shown = "emulator " + shlex.join(argv)
                err = io.StringIO()
                try:
                    with contextlib.redirect_stderr(err):
                        args = parser.parse_args(argv)
                except SystemExit:
                    problems.append(f"{shown}: {err.getvalue().strip().splitlines()[-1:]}")
                    continue
                parsed.append(shown)
                for name in named_files(args):
                    path = (ROOT / name).resolve()
                    if not path.exists() and path not in made:
                        problems.append(f"{shown}: {name} is not in the repository")
    return parsed, problems, skipped


def test_readme_commands_parse_and_name_existing_files():
    parsed, problems, skipped = check_commands(README.read_text(encoding="utf-8"))
    assert problems == []
    verbs = {c.split()[1] for c in parsed}
    assert parsed and "run" in verbs, parsed
    # the set-up command and one example of each verb of the tour are among those checked
    assert "emulator run configs/runs/megatron-175b-64gpu.yaml" in parsed
    assert verbs >= {"run", "check", "sweep", "plan", "goodput", "collbench", "validate", "report", "compare"}, verbs
    assert len(skipped) <= 2, skipped  # placeholders such as runs/<another run>, not whole blocks


@pytest.mark.parametrize("path", DOC_FILES[1:], ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_commands_parse_and_name_existing_files(path):
    parsed, problems, skipped = check_commands(path.read_text(encoding="utf-8"))
    assert problems == []


def test_the_command_checker_reports_what_is_wrong():
    text = (
        "```bash\n"
        "pip install -e . && emulator run configs/runs/megatron-175b-64gpu.yaml   # fine\n"
        "emulator run configs/runs/no-such-run.yaml\n"
        "emulator frobnicate --now\n"
        "emulator collbench --op all_reduce\n"
        "emulator collbench --cluster no-such-preset --gpus 8\n"
        "cp configs/runs/megatron-175b-64gpu.yaml mine.yaml\n"
        "ray job submit --working-dir . -- \\\n  emulator run mine.yaml --backend ray --shards 2\n"
        "emulator compare runs/a runs/<another run>\n"
        "emulator goodput RUN --days D [--json]\n"
        "```\n\n```text\n$ emulator check configs/examples/deadlock.yaml\nemulator run not-a-command.yaml\n```\n"
    )
    parsed, problems, skipped = check_commands(text)
    assert parsed == [
        "emulator run configs/runs/megatron-175b-64gpu.yaml",
        "emulator run configs/runs/no-such-run.yaml",
        "emulator collbench --cluster no-such-preset --gpus 8",
        "emulator run mine.yaml --backend ray --shards 2",
        "emulator check configs/examples/deadlock.yaml",
    ], parsed
    assert [p.split(":")[0] for p in problems] == [
        "emulator run configs/runs/no-such-run.yaml",
        "emulator frobnicate --now",
        "emulator collbench --op all_reduce",
        "emulator collbench --cluster no-such-preset --gpus 8",
    ], problems
    assert skipped == ["emulator compare runs/a runs/ < another run >", "emulator goodput RUN --days D [--json]"], (
        skipped
    )


def test_install_extras_named_in_the_docs_exist():
    """`pip install -e '.[a,b]'` in README and docs names only extras pyproject.toml defines."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    table = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    defined = set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", table, re.M))
    named = {
        extra.strip()
        for path in DOC_FILES
        for group in re.findall(r"pip install -e '?\.\[([^\]]+)\]", path.read_text(encoding="utf-8"))
        for extra in group.split(",")
    }
    assert {"test", "report", "docs"} <= named and named <= defined, (named, defined)
