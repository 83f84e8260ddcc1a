#!/usr/bin/env python3
"""Checks that no source file imports, directly or through others, a file that imports it back.

For every crate of the workspace (fuzz/ aside), each `.rs` file under a `src/` directory is a
node. An edge runs from a file to the file that defines what it names through `use`
declarations and qualified paths: `crate::a::b::Item`, `super::Item`, `child::Item`, globs
(`super::*`) included. A name a module re-exports (`pub use x::Item`) leads on to the file that
defines it, so a crate root that only re-exports does not tie its modules into a circle. Code
under `#[cfg(test)]` and inline modules' own `super` (which names the file itself) are left out.
Prints every circle, with the names behind each of its edges, and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFINES = r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|fn|trait|type|const|static|union|mod|macro_rules!)\s+{}\b"


def source_files():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.rs"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [f for f in out if os.path.exists(os.path.join(ROOT, f)) and not f.startswith("fuzz/")]


def strip(text):
    """The text without comments, strings and `#[cfg(test)]` modules."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"//[^\n]*", "", text)
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def expand(use):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    use = use.strip()
    m = re.match(r"^(.*?)\{(.*)\}$", use, re.S)
    if not m:
        return [use]
    prefix, body = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out = []
    for it in filter(None, (i.strip() for i in items)):
        for e in expand(it):
            out.append(prefix.rstrip(":") if e == "self" else prefix + e)
    return out


def inline_depth(text, pos, spans):
    return sum(1 for a, b in spans if a < pos < b)


def inline_spans(text):
    """(start, end) of each inline `mod name { ... }` block."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += text[i] == "{"
            depth -= text[i] == "}"
            if depth == 0:
                break
            i += 1
        spans.append((m.start(), i))
    return spans


def main():
    mods, where = {}, {}
    for f in source_files():
        parts = f.split("/")
        if "src" not in parts:
            continue
        i = parts.index("src")
        base = "/".join(parts[: i + 1])
        rel = parts[i + 1 :]
        if rel in (["lib.rs"], ["main.rs"]):
            path = ()
        else:
            rel[-1] = rel[-1][:-3]
            path = tuple(rel[:-1] if rel[-1] == "mod" else rel)
        mods[(base, path)] = f
        where[f] = (base, path)
    texts = {f: strip(open(os.path.join(ROOT, f), encoding="utf-8").read()) for f in where}
    reexports = {}

    def reexported(f):
        if f not in reexports:
            found = {}
            for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([^;]+);", texts[f]):
                for full in expand(m.group(1)):
                    segs = full.split("::")
                    found[segs[-1].split(" as ")[-1].strip()] = [s.split(" as ")[0].strip() for s in segs]
            reexports[f] = found
        return reexports[f]

    def absolute(f, segs, extra_super=0):
        base, path = where[f]
        if segs[0] == "crate":
            return base, list(segs[1:])
        cur = list(path)
        skip = extra_super
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                if skip:
                    skip -= 1
                else:
                    cur = cur[:-1]
            segs = segs[1:]
        return base, cur + list(segs)

    def resolve(base, path, hops=0):
        for k in range(len(path), -1, -1):
            f = mods.get((base, tuple(path[:k])))
            if f is None:
                continue
            rest = path[k:]
            if not rest or hops > 10 or re.search(DEFINES.format(re.escape(rest[0])), texts[f]):
                return f
            names = reexported(f)
            target = names.get(rest[0])
            if target:
                b, p = absolute(f, target)
                if b == base:
                    return resolve(b, p, hops + 1) or f
            # Glob re-exports (`pub use record::*`): the module that defines the name.
            for glob in (t for n, t in names.items() if n == "*" or t[-1] == "*"):
                b, p = absolute(f, glob[:-1])
                g = mods.get((b, tuple(p))) if b == base else None
                if g and re.search(DEFINES.format(re.escape(rest[0])), texts[g]):
                    return resolve(b, p + list(rest), hops + 1) or g
            return f
        return None

    edges = {}
    for f, (base, path) in where.items():
        text = texts[f]
        spans = inline_spans(text)
        out = {}

        def add(segs, pos, why):
            segs = [s for s in segs if s and s != "*"]
            if not segs:
                return
            if segs[0] not in ("crate", "super", "self") and (base, path + (segs[0],)) not in mods:
                return
            b, p = absolute(f, segs, inline_depth(text, pos, spans) if segs[0] == "super" else 0)
            t = resolve(b, p)
            if t and t != f:
                out.setdefault(t, why)

        for m in re.finditer(r"(?<![\w])use\s+([^;]+);", text):
            for full in expand(m.group(1)):
                add([s.split(" as ")[0].strip() for s in full.split("::")], m.start(), full.strip())
        for m in re.finditer(r"(?<![\w:])((?:crate|super|[a-z_]\w*)(?:::(?:[A-Za-z_]\w*|\*))+)", text):
            add(m.group(1).split("::"), m.start(), m.group(1))
        edges[f] = out

    # Tarjan's strongly connected components.
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    if circles:
        print("source files that import each other (directly or through others):")
        for comp in circles:
            print("  " + ", ".join(comp))
            for a in comp:
                for b, why in sorted(edges[a].items()):
                    if b in comp:
                        print(f"    {a} -> {b} ({why})")
        sys.exit(1)
    print(f"no import circles among {len(edges)} source files")


if __name__ == "__main__":
    main()
