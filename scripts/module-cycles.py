#!/usr/bin/env python3
"""Lists the import circles between the modules of each crate (or of the crates named).

A module is a source file; module A "uses" module B when A's product code names a path into
B: `crate::b::...`, `super::...`, `self::b::...` or a child module `b::...` it declares, with
re-exports (`pub use b::X` in a parent) followed to the module that defines the name. Test code
(`#[cfg(test)]` modules, `tests.rs`, `tests/`) is left out: tests may reach anywhere. Exit 1 when
any crate has a circle, so `make lint` can hold the line.

    python3 scripts/module-cycles.py [crates/NAME ...]
"""

import pathlib
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """Product code only: comments, strings and test modules removed."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*(\{|;)", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        if m.group(1) == ";":
            i = m.end()
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def modules(src):
    """Module path (tuple) -> file, for every product source file of a crate."""
    found = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        parts = list(rel.with_suffix("").parts)
        if "tests" in parts or parts[0] in ("bin", "main"):
            continue
        if parts[-1] in ("lib", "mod"):
            parts = parts[:-1]
        found[tuple(parts)] = path
    return found


def use_paths(text):
    """Every path a file names, expanded from `use` trees, as (path tuple, is re-export)."""
    paths = []
    for m in re.finditer(r"(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
        for p in expand(m.group(2).replace(" ", "").replace("\n", "")):
            paths.append((tuple(p), bool(m.group(1))))
    body = re.sub(r"(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", text)
    for m in re.finditer(rf"\b((?:{IDENT}::)+{IDENT})", body):
        paths.append((tuple(m.group(1).split("::")), False))
    return paths


def expand(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    m = re.match(r"^([^{]*)\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"as\w+$", "", tree).split("::")] if tree else []
    prefix = [p for p in m.group(1).split("::") if p]
    out, depth, cur = [], 0, ""
    for ch in m.group(2) + ",":
        if ch == "," and depth == 0:
            out.extend(prefix + p for p in expand(cur) if cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    return out


def resolve(path, here, mods):
    """The module a path names, from module `here`, or None when it leaves the crate."""
    if path[0] == "crate":
        base, rest = (), list(path[1:])
    elif path[0] == "super":
        base, rest = here[:-1], list(path[1:])
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif path[0] == "self":
        base, rest = here, list(path[1:])
    elif here + (path[0],) in mods:
        base, rest = here, list(path)
    else:
        return None
    target = base
    for part in rest:
        if target + (part,) in mods:
            target = target + (part,)
        else:
            return target, part
    return target, None


def cycles(crate):
    src = crate / "src"
    mods = modules(src)
    texts = {m: strip(f.read_text()) for m, f in mods.items()}
    parsed = {m: use_paths(t) for m, t in texts.items()}
    # A name re-exported by a module (`pub use child::Name`) lives in the module it came from.
    reexport = {}
    for m, uses in parsed.items():
        for path, is_pub in uses:
            if is_pub:
                r = resolve(path, m, mods)
                if r and path[-1] != "*":
                    reexport[(m, path[-1])] = r[0]
    edges = {m: set() for m in mods}
    for m, uses in parsed.items():
        for path, is_pub in uses:
            if is_pub:
                continue
            r = resolve(path, m, mods)
            if not r:
                continue
            target, name = r
            seen = set()
            while name and (target, name) in reexport and (target, name) not in seen:
                seen.add((target, name))
                target = reexport[(target, name)]
            if target != m:
                edges[m].add(target)
    return scc(edges)


def scc(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    crates = [pathlib.Path(a) for a in sys.argv[1:]] or sorted((root / "crates").iterdir())
    found = 0
    for crate in crates:
        if not (crate / "src").is_dir():
            continue
        for comp in cycles(crate):
            found += 1
            names = ["/".join(m) or "lib" for m in comp]
            print(f"{crate.name}: {' <-> '.join(names)}")
    if found:
        print(f"{found} import circle(s)")
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
