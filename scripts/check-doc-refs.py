#!/usr/bin/env python3
"""Checks that every file the sources and the documentation cite exists in the repository.

Scanned: the repository's own text files (.rs, .sh, .py, .toml, .md), tracked or new, not
ignored. Cited are:

- paths from the repository root that start with one of its top-level directories
  (`docs/protocol-notes.md`, `tests/data/siw/siw-rping.pcap`, `scripts/check-deps.py`; in a
  member package's Cargo.toml, paths from its own directory), and
  the old homes of notes and captures outside the repository (see GONE), which always fail;
- paths starting with `../`, taken relative to the citing file;
- bare Markdown file names (`README.md`), which must sit next to the citing file or at the root;
- bare names of the siw captures (`siw-rping.pcap`, `host-probe-*.pcap`), which must be in
  `tests/data/siw/`;
- Markdown links (`[text](../docs/interop.md#network-rule)`), relative to the Markdown file.

A `*` in a cited path must match at least one file. An `#anchor` after a Markdown path must
name one of that file's headings (GitHub's anchor rules). Prints each citation that does not
resolve, with its file and line, and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys
from fnmatch import fnmatchcase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = (".rs", ".sh", ".py", ".toml", ".md")
# Not in the repository: a citation of these is always stale.
GONE = ("testdata", "shared")
# Top-level directories cited even before they hold a file.
EXPECTED = ("docs",)
# Where the captures that comments cite by name live.
CAPTURES = "tests/data/siw"
# Characters that may not come right before a path (so that `a/src/x.rs`, `$HERE/lib.sh` or
# `https://host/docs/x.md` are not read as citations of this repository).
BEFORE = r"(?<![\w./$@~:-])"
PATH_CHARS = r"[\w.*/-]*[\w*/]"


def repo_files():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    files = [f for f in out.split("\0") if f and os.path.exists(os.path.join(ROOT, f))]
    dirs = {""}
    for f in files:
        d = os.path.dirname(f)
        while d not in dirs:
            dirs.add(d)
            d = os.path.dirname(d)
    return set(files), dirs


def slugs(text):
    """The anchors GitHub gives the headings of a Markdown text."""
    seen = {}
    out = set()
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def main():
    files, dirs = repo_files()
    tops = sorted({f.split("/", 1)[0] for f in files if "/" in f} | set(GONE) | set(EXPECTED))
    rooted = re.compile(BEFORE + r"((?:" + "|".join(map(re.escape, tops)) + r")/" + PATH_CHARS + r")(#[\w-]+)?")
    relative = re.compile(BEFORE + r"(\.\./" + PATH_CHARS + r")(#[\w-]+)?")
    bare_md = re.compile(BEFORE + r"([\w-]+\.md)(#[\w-]+)?(?![\w/])")
    capture = re.compile(BEFORE + r"((?:siw|rxe|host-probe)-[\w*-]*\.pcap(?:ng)?)(?![\w/])")
    md_link = re.compile(r"\]\(([^)\s]+)\)")
    anchors = {}

    def anchor_ok(path, anchor):
        if not anchor or not path.endswith(".md"):
            return True
        if path not in anchors:
            with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
                anchors[path] = slugs(fh.read())
        return anchor[1:] in anchors[path]

    def resolve(path, anchor):
        """None when `path` (from the root, normalized) exists, else why not."""
        if path.split("/", 1)[0] in GONE:
            return "not in the repository"
        if "*" in path:
            ok = any(fnmatchcase(f, path) for f in files)
            return None if ok else "matches no file"
        p = path.rstrip("/")
        if p in files:
            return None if anchor_ok(p, anchor) else f"no such heading in {p}"
        if p in dirs:
            return None
        return "no such file"

    bad = []
    scanned = 0
    for f in sorted(files):
        if not f.endswith(SCANNED) or f.startswith("fuzz/corpus/"):
            continue
        scanned += 1
        here = os.path.dirname(f)
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for no, line in enumerate(text.splitlines(), 1):
            cites = []
            for m in rooted.finditer(line):
                path = m.group(1)
                # A member package's manifest names its files from its own directory.
                if f.endswith("Cargo.toml") and here and os.path.join(here, path) in files:
                    path = os.path.join(here, path)
                cites.append((m.group(1), path, m.group(2)))
            for m in relative.finditer(line):
                cites.append((m.group(1), os.path.normpath(os.path.join(here, m.group(1))), m.group(2)))
            for m in bare_md.finditer(line):
                if f.endswith(".md") and line[: m.start()].endswith(("[", "](")):
                    continue  # a Markdown link's text or target: checked as a link below
                name = m.group(1)
                near = os.path.join(here, name) if here else name
                cites.append((name, near if near in files else name, m.group(2)))
            for m in capture.finditer(line):
                cites.append((m.group(1), f"{CAPTURES}/{m.group(1)}", None))
            if f.endswith(".md"):
                for m in md_link.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z]+:", target):
                        continue
                    path, _, anchor = target.partition("#")
                    full = os.path.normpath(os.path.join(here, path)) if path else f
                    cites.append((target, full, "#" + anchor if anchor else None))
            seen = set()
            for shown, path, anchor in cites:
                path = path.replace(os.sep, "/")
                if (path, anchor) in seen:
                    continue
                seen.add((path, anchor))
                why = "outside the repository" if path.startswith("../") else resolve(path, anchor)
                if why:
                    label = shown if not anchor or shown.endswith(anchor) else shown + anchor
                    bad.append(f"{f}:{no}: {label}: {why}")
    if bad:
        print("citations that do not resolve inside the repository:", *bad, sep="\n  ")
        sys.exit(1)
    print(f"every cited path resolves ({scanned} files scanned)")


if __name__ == "__main__":
    main()
