"""Every code example in ``docs/`` and the README runs, and the reference tables match the code.

How a document's fenced blocks are treated (STYLE.md convention 11):

* ```` ```python ```` — run as a script (``python block.py``) in the document's own fresh
  temporary directory; it must exit 0. Blocks of one document run in order and share that
  directory, so a later block sees the files and database an earlier one left.
* ```` ```python file=NAME ```` — written to ``NAME`` in that directory (a module the other blocks
  and commands import, e.g. ``shop.py`` for ``--app shop:app``); the test checks it imports.
* ```` ```python-fragment ```` — an excerpt that cannot run on its own; shown, not run.
* ```` ```sh ```` whose commands are ``pytest`` runs — each runs ``python -m pytest`` (the test
  kit's plugin installed) in that directory and must exit 0, or the ``# exit N`` code.
* ```` ```sh ```` whose first command starts with ``jobguard`` — each command runs with the
  installed entry point in that directory and must exit 0, or the code named by a trailing
  ``# exit N`` comment. A ``worker`` command without ``--burst`` (or a ``scheduler`` without
  ``--once``) runs until stopped, so it is run twice: first with ``--burst`` (``--once``)
  appended (the queues drain, so later examples see a settled store), then exactly as written,
  stopped with SIGTERM once started; it must exit 0.
  ``dashboard`` and ``exporter`` serve until stopped too: they run as written and get SIGTERM
  once they printed their address. Other shell blocks (installation commands) are not run here.

Every document runs once per backend, in a fresh directory each time:

* on ``sqlite``, exactly as written;
* on ``postgres``, with each ``sqlite:///NAME`` URL replaced by a fresh, migrated PostgreSQL store
  of its own (what the docs tell a reader to do: give the ``postgresql://`` URL instead, after
  ``jobguard migrate``), and each ``postgresql://app@localhost/NAME`` (the database the
  PostgreSQL examples name) by a fresh database of its own.
* A block with the option ``backend=sqlite`` or ``backend=postgres`` shows that backend itself
  (SQLite's file and pragmas, ``sqlite3`` business tables; psycopg and ``jobguard migrate``) and
  runs only in that backend's pass. A document is run on a backend only if some block runs there.

Reference tables are preceded by a marker comment and compared with the code:
``<!-- defaults: module:Callable -->`` (every parameter, with its default),
``<!-- options: COMMAND -->`` (every option of a CLI command, with its default) and
``<!-- fields: module:Class -->`` (every field of a model, or every value of an enum).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest

from jobguard.cli.main import cli
from tests.support import pg
from tests.support.procs import clean_env, entry_point
from tests.support.redisdb import claimed_database

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs"
# tour.md walks through the demo's report; the demo's own end-to-end test covers it.
NOT_HERE = {"tour.md"}
DOCUMENTS = [
    REPO_ROOT / "README.md",
    *sorted(path for path in DOCS.glob("*.md") if path.name not in NOT_HERE),
    *sorted(DOCS.glob("hosts/*.md")),
]
SHELL = {"sh", "bash", "shell", "console"}
UNMARKED_PYTHON = {"py", "python3", "pycon", "ipython"}
EXIT_COMMENT = re.compile(r"\s#\s*exit\s+(\d+)\s*$")
TIMEOUT_S = 60.0
BACKENDS = ("sqlite", "postgres")
SQLITE_URL = re.compile(r"sqlite:///([\w.-]+)")
EXAMPLE_DATABASE_URL = re.compile(r"postgresql://app@localhost/(\w+)")
# The Redis the host-queue examples name; each run gets a database of its own instead.
EXAMPLE_BROKER_URL = "redis://localhost:6379/0"


@dataclass
class Block:
    """One fenced code block of a document."""

    document: Path
    line: int
    lang: str
    options: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    code: str = ""

    @property
    def where(self) -> str:
        """``docs/x.md:LINE`` for failure messages."""
        shown = (
            self.document.relative_to(REPO_ROOT)
            if self.document.is_relative_to(REPO_ROOT)
            else self.document.name
        )
        return f"{shown}:{self.line}"


def runs_on(block: Block, backend: str) -> bool:
    """Whether the block runs in ``backend``'s pass (``backend=NAME`` restricts it to one)."""
    only = block.options.get("backend")
    assert only is None or only in BACKENDS, f"{block.where}: unknown backend={only}"
    return only is None or only == backend


class PostgresStores:
    """The stores of one document's PostgreSQL pass, made on first mention, dropped at close."""

    def __init__(self) -> None:
        self.stores: dict[str, str] = {}
        self.databases: dict[str, str] = {}

    def store(self, name: str) -> str:
        """A fresh, migrated jobguard store standing in for ``sqlite:///NAME``."""
        if name not in self.stores:
            self.stores[name] = pg.fresh_store_url(pg.session_database())
        return self.stores[name]

    def database(self, name: str) -> str:
        """A fresh, empty database standing in for ``postgresql://app@localhost/NAME``."""
        if name not in self.databases:
            self.databases[name] = pg.create_database()
        return self.databases[name]

    def substitute(self, code: str) -> str:
        """The example's code with its URLs pointing at this pass's stores and databases."""
        code = SQLITE_URL.sub(lambda match: self.store(match.group(1)), code)
        return EXAMPLE_DATABASE_URL.sub(lambda match: self.database(match.group(1)), code)

    def close(self) -> None:
        """Drop the databases made here (stores live in the session's database)."""
        while self.databases:
            pg.drop_database(self.databases.popitem()[1])


def parse_blocks(document: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order."""
    found: list[Block] = []
    current: Block | None = None
    fence = ""
    for number, line in enumerate(document.read_text().splitlines(), start=1):
        stripped = line.strip()
        if current is None:
            match = re.match(r"^(`{3,}|~{3,})(.*)$", stripped)
            if match:
                fence = match.group(1)
                words = match.group(2).split()
                current = Block(document, number, words[0] if words else "")
                for word in words[1:]:
                    key, sep, value = word.partition("=")
                    if sep:
                        current.options[key] = value
                    else:
                        current.flags.add(word)
        elif stripped.startswith(fence) and not stripped.strip(fence[0]):
            found.append(current)
            current = None
        else:
            current.code += line + "\n"
    assert current is None, f"{document}: unclosed code fence at line {current.line}"
    return found


def shell_commands(block: Block) -> list[tuple[str, int]]:
    """The block's commands (continuations joined) with the exit code each must return."""
    commands: list[tuple[str, int]] = []
    pending = ""
    for raw in block.code.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        match = EXIT_COMMENT.search(line)
        commands.append((line, int(match.group(1)) if match else 0))
    return commands


def run_in(workdir: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run an example's command in its folder, without JOBGUARD_* from the outside."""
    return subprocess.run(
        command,
        cwd=workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,  # the caller asserts the exit code, with the output in the message
    )


def run_python(block: Block, workdir: Path) -> None:
    script = workdir / f"_example_line_{block.line}.py"
    script.write_text(block.code)
    done = run_in(workdir, [sys.executable, script.name])
    assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"


def write_module(block: Block, workdir: Path) -> None:
    target = workdir / block.options["file"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.code)
    if target.suffix == ".py":
        module = ".".join(target.relative_to(workdir).with_suffix("").parts)
        done = run_in(workdir, [sys.executable, "-c", f"import {module}"])
        assert done.returncode == 0, f"{block.where}: {module} does not import:\n{done.stderr}"


# Commands that serve until stopped: what they print on stderr once started, and once stopped.
SERVING = {
    "worker": ("worker ", "worker stopped"),
    "scheduler": ("scheduler ", "scheduler stopped"),
    "dashboard": ("dashboard at ", "dashboard stopped"),
    "exporter": ("exporter serving ", "exporter stopped"),
}
# The flag that makes a serving command return once it has done what is due.
ONE_SHOT = {"worker": "--burst", "scheduler": "--once"}


def long_running(args: list[str]) -> str | None:
    """The serving command ``args`` runs until stopped, if any (``worker --burst`` ends)."""
    if "--help" in args or any(flag in args for flag in ONE_SHOT.values()):
        return None
    return next((name for name in SERVING if name in args), None)


def run_until_started_then_sigterm(
    block: Block, command: str, args: list[str], cwd: Path, serving: str
) -> None:
    started, stopped = SERVING[serving]
    proc = subprocess.Popen(
        [*entry_point(), *args],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # e.g. "worker ID on queues ..." once it is about to fetch
        while first.startswith("metrics at "):  # printed before the worker's line
            first = proc.stderr.readline()
        assert first.startswith(started), f"{block.where}: `{command}` did not start: {first}"
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{block.where}: `{command}` after SIGTERM:\n{first}{rest}"
    assert stopped in rest, f"{block.where}: `{command}` did not stop cleanly:\n{rest}"


def run_shell(block: Block, workdir: Path) -> None:
    for command, expected in shell_commands(block):
        words = shlex.split(command, comments=True)
        if words[0] == "pytest":
            # the test kit's guide: a reader's own test session, with the plugin installed
            done = run_in(workdir, [sys.executable, "-m", "pytest", *words[1:]])
            assert done.returncode == expected, (
                f"{block.where}: `{command}` exited {done.returncode}, expected {expected}:\n"
                f"{done.stdout}\n{done.stderr}"
            )
            continue
        assert words[0] == "jobguard", (
            f"{block.where}: a jobguard block runs only jobguard: {command}"
        )
        args = words[1:]
        serving = long_running(args) if expected == 0 else None  # `# exit 2` ends at once
        if serving in ONE_SHOT:
            run_shell_command(block, command, [*args, ONE_SHOT[serving]], workdir, 0)
        if serving is not None:
            run_until_started_then_sigterm(block, command, args, workdir, serving)
        else:
            run_shell_command(block, command, args, workdir, expected)


def run_shell_command(
    block: Block, command: str, args: list[str], cwd: Path, expected: int
) -> None:
    done = run_in(cwd, [*entry_point(), *args])
    assert done.returncode == expected, (
        f"{block.where}: `{command}` exited {done.returncode}, expected {expected}:\n"
        f"{done.stdout}\n{done.stderr}"
    )


def is_jobguard_shell(block: Block) -> bool:
    """A block of ``jobguard`` commands, or of ``pytest`` runs (the test kit's guide)."""
    commands = shell_commands(block)
    return bool(commands) and commands[0][0].split()[0] in ("jobguard", "pytest")


def is_executed(block: Block) -> bool:
    """Python that runs (a script or a module) or a block of ``jobguard`` commands."""
    return block.lang == "python" or (block.lang in SHELL and is_jobguard_shell(block))


def run_document(
    document: Path,
    workdir: Path,
    backend: str = "sqlite",
    postgres: PostgresStores | None = None,
    broker_url: str | None = None,
) -> None:
    """Run a document's examples for ``backend`` in order in ``workdir``; raise AssertionError
    on the first that fails. See the module docstring for the rules."""
    for written in parse_blocks(document):
        assert written.lang not in UNMARKED_PYTHON, (
            f"{written.where}: mark Python as ```python (run) or ```python-fragment (not run)"
        )
        if not runs_on(written, backend):
            continue
        block = written
        if backend == "postgres":
            assert postgres is not None, "the PostgreSQL pass needs its stores"
            block = dataclasses.replace(written, code=postgres.substitute(written.code))
        if broker_url is not None:
            block = dataclasses.replace(
                block, code=block.code.replace(EXAMPLE_BROKER_URL, broker_url)
            )
        if block.lang == "python" and "file" in block.options:
            write_module(block, workdir)
        elif block.lang == "python":
            run_python(block, workdir)
        elif block.lang in SHELL and is_jobguard_shell(block):
            run_shell(block, workdir)


RUNS = [
    pytest.param(document, backend, id=f"{document.name}-{backend}")
    for document in DOCUMENTS
    for backend in BACKENDS
    if any(is_executed(b) and runs_on(b, backend) for b in parse_blocks(document))
]


@pytest.mark.parametrize(("document", "backend"), RUNS)
def test_every_example_of_the_document_runs(document: Path, backend: str, tmp_path: Path) -> None:
    """Each python block exits 0 and each jobguard command exits as documented (STYLE 11), on
    SQLite as written and on PostgreSQL with the store URLs replaced."""
    postgres = PostgresStores()
    try:
        if EXAMPLE_BROKER_URL in document.read_text():
            with claimed_database() as broker_url:
                run_document(document, tmp_path, backend, postgres, broker_url)
        else:
            run_document(document, tmp_path, backend, postgres)
    finally:
        postgres.close()


@pytest.mark.parametrize(
    ("markdown", "needle"),
    [
        ("```python\nraise SystemExit(3)\n```\n", "broken.md:1 failed"),
        ("```python\nassert 1 + 1 == 3\n```\n", "AssertionError"),
        ("```python file=mod.py\nimport no_such_module_anywhere\n```\n", "does not import"),
        ("```sh\njobguard --url sqlite:///missing.db jobs\n```\n", "exited 3, expected 0"),
        ("```sh\njobguard --help   # exit 1\n```\n", "exited 0, expected 1"),
        ("```sh\njobguard --help\nrm -rf build\n```\n", "runs only jobguard"),
        ("```py\nprint('unmarked')\n```\n", "mark Python"),
        (
            "```python file=test_it.py\ndef test_it():\n    assert False\n```\n"
            "```sh\npytest -q -p no:cacheprovider test_it.py\n```\n",
            "exited 1, expected 0",
        ),
    ],
    ids=[
        "exit-code",
        "assertion",
        "module",
        "shell-code",
        "expected-code",
        "mixed-shell",
        "unmarked",
        "pytest-code",
    ],
)
def test_the_runner_fails_on_a_broken_example(tmp_path: Path, markdown: str, needle: str) -> None:
    """The runner itself can fail: a broken example of each kind is reported with its place."""
    document = tmp_path / "broken.md"
    document.write_text(markdown)
    workdir = tmp_path / "work"
    workdir.mkdir()

    with pytest.raises(AssertionError, match=re.escape(needle)):
        run_document(document, workdir)


def test_each_pass_runs_only_the_blocks_of_its_backend(tmp_path: Path) -> None:
    """``backend=NAME`` blocks run in that backend's pass only; an unknown name is an error."""
    document = tmp_path / "marked.md"
    document.write_text(
        "```python backend=postgres\nraise SystemExit('not on sqlite')\n```\n"
        "```python backend=sqlite\nraise SystemExit('not on postgres')\n```\n"
    )
    postgres = PostgresStores()
    try:
        with pytest.raises(AssertionError, match="not on sqlite"):
            run_document(document, tmp_path, "postgres", postgres)
        with pytest.raises(AssertionError, match="not on postgres"):
            run_document(document, tmp_path, "sqlite")
    finally:
        postgres.close()
    document.write_text("```python backend=mysql\nprint('never')\n```\n")
    with pytest.raises(AssertionError, match="unknown backend=mysql"):
        run_document(document, tmp_path)


def test_the_postgres_pass_gives_each_named_store_and_database_its_own(tmp_path: Path) -> None:
    """On PostgreSQL a ``sqlite:///NAME`` URL is one fresh store for the whole document, in code
    and in commands alike, and ``postgresql://app@localhost/NAME`` is one fresh database."""
    document = tmp_path / "both.md"
    document.write_text(
        "```python\n"
        "from jobguard import App\n"
        "app = App('sqlite:///a.db')\n"
        "assert app.url.startswith('postgresql://'), app.url\n"
        "@app.task(name='t')\n"
        "def t(ctx): ...\n"
        "t.enqueue()\n"
        "assert len(App('sqlite:///b.db').jobs()) == 0\n"
        "```\n"
        "```sh\njobguard --url sqlite:///a.db attempts --job 1\n```\n"
        "```python\n"
        "import psycopg\n"
        "with psycopg.connect('postgresql://app@localhost/shop') as conn:\n"
        "    assert conn.execute('SELECT count(*) FROM pg_tables WHERE schemaname = %s',\n"
        "                        ['public']).fetchone() == (0,)\n"
        "```\n"
    )
    postgres = PostgresStores()
    try:
        run_document(document, tmp_path, "postgres", postgres)
        assert set(postgres.stores) == {"a.db", "b.db"}
        assert set(postgres.databases) == {"shop"}
    finally:
        postgres.close()
    assert postgres.databases == {}


def test_the_runner_skips_fragments_and_non_jobguard_shell(tmp_path: Path) -> None:
    """Fragments and installation commands are shown, not run."""
    document = tmp_path / "fine.md"
    document.write_text(
        "```python-fragment\nthis is not python\n```\n"
        "```sh\npython3 -m venv .venv && false\n```\n"
        "```text\nanything\n```\n"
    )

    run_document(document, tmp_path)


@pytest.mark.parametrize(
    "document",
    [p for p in DOCUMENTS if p.parent == DOCS],
    ids=[p.name for p in DOCUMENTS if p.parent == DOCS],
)
def test_every_document_has_examples_that_run(document: Path) -> None:
    """A document cannot hide all its code in blocks that are never executed."""
    executed = [b for b in parse_blocks(document) if is_executed(b)]
    assert executed, f"{document.name} has no executed example"


# -- reference tables against the code ----------------------------------------------------------


def marked_tables(kind: str) -> list[tuple[Path, str, list[list[str]]]]:
    """``(document, target, rows)`` for every ``<!-- KIND: target -->`` table in the docs."""
    marker = re.compile(rf"^<!--\s*{kind}:\s*(.+?)\s*-->$")
    tables = []
    for document in DOCUMENTS:
        lines = document.read_text().splitlines()
        for index, line in enumerate(lines):
            match = marker.match(line.strip())
            if not match:
                continue
            rows = []
            for row in lines[index + 1 :]:
                if not row.startswith("|"):
                    if rows:
                        break
                    continue
                cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
                rows.append(cells)
            tables.append((document, match.group(1), rows[2:]))  # minus header and rule
    return tables


def first_code(cell: str) -> str:
    """The first ```code``` span of a table cell."""
    match = re.search(r"`([^`]+)`", cell)
    assert match, f"no `code` in table cell {cell!r}"
    return match.group(1)


def resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def documented_default(text: str) -> Any:
    """A default as written in a table: a Python literal, ``required``, or a dotted name."""
    if text == "required":
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return resolve(text.replace(".", ":", 1)) if "." in text else text


def test_documented_defaults_match_the_signatures() -> None:
    """Every parameter of App, App.task, Task.options, Worker... is documented with its real
    default, and nothing documented is missing from the code (the docs cannot drift)."""
    tables = marked_tables("defaults")
    assert {target for _, target, _ in tables} >= {
        "jobguard.app:App",
        "jobguard.app:App.task",
        "jobguard.task:Task.options",
        "jobguard.worker:Worker",
        "jobguard.app:App.lock",
        "jobguard.backends.sqlite:SQLiteBackend",
        "jobguard.backends.postgres:PostgresBackend",
    }
    for document, target, rows in tables:
        signature = inspect.signature(resolve(target))
        params = {
            name: p
            for name, p in signature.parameters.items()
            if name not in ("self", "app")
            and p.kind is not inspect.Parameter.POSITIONAL_ONLY
            and p.kind is not inspect.Parameter.VAR_KEYWORD
        }
        documented = {first_code(row[0]): documented_default(first_code(row[1])) for row in rows}
        assert set(documented) == set(params), f"{document.name} {target}"
        for name, default in documented.items():
            assert default == params[name].default, f"{document.name} {target} {name}"


def command(path: str) -> click.Command:
    """``worker`` or ``dlq purge`` as a click command (``jobguard`` for the group)."""
    found: click.Command = cli
    context = click.Context(cli)
    for name in path.split()[1:] if path.startswith("jobguard") else path.split():
        assert isinstance(found, click.Group)
        sub = found.get_command(context, name)
        assert sub is not None, path
        found = sub
    return found


def test_documented_cli_options_match_the_commands() -> None:
    """Every option of every documented command is listed with its real default (docs/cli.md)."""
    tables = marked_tables("options")
    assert {target for _, target, _ in tables} >= {
        "jobguard",
        "migrate",
        "worker",
        "enqueue",
        "jobs",
        "attempts",
        "dlq list",
        "dlq show",
        "dlq purge",
        "exporter",
        "dashboard",
    }
    for document, target, rows in tables:
        found = command(target)
        # Parse an empty command line: the values a command gets when an option is not given.
        parsed = found.make_context(target, [], resilient_parsing=True).params
        options = {
            max(p.opts, key=len): p
            for p in found.params
            if isinstance(p, click.Option) and p.expose_value
        }
        documented = {first_code(row[0]): first_code(row[1]) for row in rows}
        assert set(documented) == set(options), f"{document.name} {target}"
        for name, text in documented.items():
            option = options[name]
            # A callback turns the default into something else (--kwargs' "{}" into a dict).
            expected = option.default if option.callback is not None else parsed[option.name]
            assert documented_default(text) == expected, f"{document.name} {target} {name}"


def test_documented_fields_match_the_models() -> None:
    """Field tables (the attempt log of G10.1, outcomes, job states) list exactly the code's."""
    tables = marked_tables("fields")
    assert {target for _, target, _ in tables} >= {
        "jobguard.models:Attempt",
        "jobguard.models:Outcome",
    }
    for document, target, rows in tables:
        kind: Callable[..., Any] = resolve(target)
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            expected = {member.value for member in kind}
        else:
            expected = {f.name for f in dataclasses.fields(kind)}
        assert {first_code(row[0]) for row in rows} == expected, f"{document.name} {target}"


def test_relative_links_in_the_docs_resolve() -> None:
    """Links between documents (README included) point at files that exist."""
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", document.read_text()):
            assert (document.parent / target).exists(), f"{document.name} links to {target}"
