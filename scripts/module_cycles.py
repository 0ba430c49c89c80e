#!/usr/bin/env python3
"""Checks that the module import graph inside each crate has no cycles (standard library only).

Usage: scripts/module_cycles.py [--report] [--crate NAME ...] [--refs] [--edges]
                                [--exclude-tests] [--root DIR]

For every crate under crates/*/src the nodes are the crate's top-level modules: src/foo.rs and
everything under src/foo/ are module `foo`; the crate root (lib.rs, main.rs) is not a node.
Module A has an edge to module B when code in A names B through

  - a `crate::` path, anywhere: `use` lines (grouped ones too, `use crate::{a, b::c}`) and
    inline paths in code (`crate::b::f()`, types, patterns, macro arguments, `pub(in ...)`);
  - a `super::` path that climbs up to the crate root (`super::b` in src/a.rs,
    `super::super::b` in src/a/x.rs, counting inline `mod m { ... }` blocks);
  - a name the crate root imports or re-exports (`pub use b::Thing;` in lib.rs makes
    `crate::Thing` in A an edge A -> b, shown as "via crate::Thing").

Comments (line, doc, nested block) and string/char literals (raw and byte strings too) are
blanked before the search, so `crate::x` in prose or in a string is not an edge. `self::` paths
and self-edges (A -> A) are ignored.

Test code counts: `#[cfg(test)]` items (inline `mod tests { ... }`, `#[cfg(test)] mod tests;`
files, `#[test]` functions, anything whose cfg needs `test`) add edges like production code.
The graph is checked as the compiler sees it under `cargo test`, the strictest choice. Each
cycle says whether production code alone still has it ("also without test code") or only
the test code closes it ("test code only"); --exclude-tests drops test code, for analysis only.

Exits 1 when any checked crate has a cycle (a strongly connected component with more than one
module), printing each cycle's modules and, for every edge inside it, the number of references
and one example file:line. There is no allowlist: the goal is zero. --report prints the same
and exits 0 (for wiring CI in before the last cycle is gone). --crate limits the check to the
named crates (directory name, e.g. kvgate-gateway, or package name kvgate_gateway); --refs
lists every reference of each edge in a cycle; --edges prints each crate's whole graph.
Exit 2 on usage errors (an unknown crate, no crates found).
"""
import argparse
import os
import re
import sys
from collections import defaultdict

IDENT_START = re.compile(r"[A-Za-z_]")
IDENT_CHAR = re.compile(r"[A-Za-z0-9_]")
# String literal prefixes: "...", b"...", c"...", r"...", r#"..."#, br##"..."##, cr"...".
STRING_PREFIX = re.compile(r'(?:[bc]?r(#*)"|[bc]?")')


# ----------------------------------------------------------------------------------------------
# Lexing: blank comments and literals, keep every newline (so line numbers survive).


def _blank(s):
    """`s` with every character but newlines replaced by a space."""
    return re.sub(r"[^\n]", " ", s)


def strip_comments_and_strings(text):
    """Returns `text` with comments and the contents of string and char literals blanked.

    Line and column positions are kept: every removed character becomes a space, newlines
    stay. A string keeps its quote marks (its content is blanked), so `f("crate::x")` becomes
    `f("         ")`. Lifetimes and labels (`'a`, `'outer:`) are code and stay.
    """
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(_blank(text[i:j]))
            i = j
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(_blank(text[i:j]))
            i = j
        elif c == '"' or (IDENT_START.match(c) and STRING_PREFIX.match(text, i)):
            m = STRING_PREFIX.match(text, i)
            start_quote = m.end() - 1
            if m.group(1) is not None and "r" in m.group(0):
                # Raw string: no escapes, ends at `"` followed by as many `#` as it opened with.
                close = '"' + m.group(1)
                j = text.find(close, start_quote + 1)
                j = n if j < 0 else j + len(close)
            else:
                j = start_quote + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j = min(j + 1, n)
            # The literal becomes `"` + blanks + `"` of the same length (prefix, hashes and
            # content blanked), so nothing inside it, `#` included, can look like code.
            lit = text[i:j]
            out.append('"' + _blank(lit[1:-1]) + '"' if len(lit) >= 2 else _blank(lit))
            i = j
        elif IDENT_START.match(c):
            j = i + 1
            while j < n and IDENT_CHAR.match(text[j]):
                j += 1
            # A byte char literal b'x' after an identifier `b`.
            if text[i:j] == "b" and j < n and text[j] == "'":
                out.append("b")
                i = j
                continue
            out.append(text[i:j])
            i = j
        elif c.isdigit():
            # Numbers (and their suffixes: 1u8, 0x_ff) in one piece, so `1` never starts a prefix.
            j = i + 1
            while j < n and IDENT_CHAR.match(text[j]):
                j += 1
            out.append(text[i:j])
            i = j
        elif c == "'":
            end = _char_literal_end(text, i)
            if end is None:  # a lifetime or a label
                out.append(c)
                i += 1
            else:
                out.append("'" + _blank(text[i + 1:end - 1]) + "'")
                i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _char_literal_end(text, i):
    """If a char literal starts at text[i] (a `'`), the index just after its closing `'`."""
    n = len(text)
    if i + 1 >= n:
        return None
    if text[i + 1] == "\\":
        # '\n', '\'', '\\', '\x7f', '\u{1F600}': the closing quote is the first one after the
        # escaped character.
        j = text.find("'", i + 3)
        return None if j < 0 else j + 1
    if i + 2 < n and text[i + 2] == "'" and text[i + 1] != "\n":
        return i + 3
    return None


# ----------------------------------------------------------------------------------------------
# Tokens.

TOKEN = re.compile(r"r#[A-Za-z_][A-Za-z0-9_]*|\$crate|[A-Za-z_][A-Za-z0-9_]*|::|\S")


def tokenize(clean):
    """(text, line) tokens of blanked source. Raw identifiers `r#x` come out as `x`."""
    toks = []
    line, last = 1, 0
    for m in TOKEN.finditer(clean):
        line += clean.count("\n", last, m.start())
        last = m.start()
        t = m.group(0)
        if t.startswith("r#"):
            t = t[2:]
        toks.append((t, line))
    return toks


def is_ident(t):
    return bool(t) and IDENT_START.match(t) is not None and t != "$crate"


def parse_use_tree(toks, i):
    """Parses a use tree (or a plain path) starting at toks[i].

    Returns (leaves, end): leaves is a list of (segments, alias, token_index) where segments
    is the list of path identifiers (`self`/`*` included as written) and token_index points
    at its first segment (inside a group `{..}` right after the root: the branch's first); end is the index just after the tree. Stops at the first token that
    cannot continue a path (`<`, `(`, `;`, `,` ...), so inline paths like
    `crate::a::B::<T>::new()` give [(["a", "B"], None, i)].
    """
    segs = []
    first = i
    n = len(toks)
    while i < n:
        t = toks[i][0]
        if t == "{":
            leaves = []
            i += 1
            while i < n and toks[i][0] != "}":
                if toks[i][0] == ",":
                    i += 1
                    continue
                sub, j = parse_use_tree(toks, i)
                for s, alias, idx in sub:
                    # Point at the path's first segment: the module name for `crate::m::{..}`.
                    leaves.append((segs + s, alias, first if segs else idx))
                if j == i:  # not a path: skip the token so that a stray one cannot stall us
                    j += 1
                i = j
            return leaves, min(i + 1, n)
        if t == "*":
            return [(segs + ["*"], None, first)], i + 1
        if not is_ident(t):
            break
        segs.append(t)
        i += 1
        if i < n and toks[i][0] == "::":
            i += 1
            continue
        break
    alias = None
    if segs and i + 1 < n and toks[i][0] == "as" and is_ident(toks[i + 1][0]):
        alias = toks[i + 1][0]
        i += 2
    return ([(segs, alias, first)] if segs else []), i


# ----------------------------------------------------------------------------------------------
# cfg(test) detection.


def _eval_cfg(toks, i):
    """Evaluates a cfg predicate at toks[i] for a build WITHOUT `test`: True, False or None
    (unknown: features, target_os ...). Returns (value, end)."""
    n = len(toks)
    if i >= n:
        return None, i
    t = toks[i][0]
    if t in ("all", "any", "not") and i + 1 < n and toks[i + 1][0] == "(":
        vals = []
        i += 2
        while i < n and toks[i][0] != ")":
            if toks[i][0] == ",":
                i += 1
                continue
            v, i = _eval_cfg(toks, i)
            vals.append(v)
        i += 1
        if t == "not":
            v = vals[0] if vals else None
            return (None if v is None else not v), i
        if t == "all":
            if any(v is False for v in vals):
                return False, i
            return (None if any(v is None for v in vals) else True), i
        if any(v is True for v in vals):
            return True, i
        return (None if any(v is None for v in vals) else False), i
    if t == "test":
        return False, i + 1
    # key, key = "value" (the value was blanked to `"   "`), or anything else: unknown.
    i += 1
    if i < n and toks[i][0] == "=":
        i += 1
        while i < n and toks[i][0] == '"':
            i += 1
    return None, i


def _attr_end(toks, i):
    """toks[i] is the `[` of an attribute: index just after its closing `]`."""
    depth = 0
    n = len(toks)
    while i < n:
        t = toks[i][0]
        if t in "([{":
            depth += 1
        elif t in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _attr_is_test_only(toks, lb, end):
    """The attribute toks[lb:end] (lb is its `[`) compiles its item only under `cargo test`."""
    body = [t for t, _ in toks[lb + 1:end - 1]]
    if body == ["test"]:
        return True
    if body and body[0] == "cfg" and len(body) > 1 and body[1] == "(":
        v, _ = _eval_cfg(toks, lb + 3)
        return v is False
    return False


ITEM_WORDS = {"pub", "fn", "mod", "impl", "struct", "enum", "union", "trait", "use", "const",
              "static", "type", "extern", "unsafe", "async", "macro_rules", "let", "default"}


def _item_end(toks, i):
    """Index just after the item starting at toks[i] (attributes already skipped): its `;` at
    depth 0, or the `}` closing its first top-level block (plus a `;` right after it). Something
    that is not an item (a field, a variant, a match arm) also ends at a `,` at depth 0."""
    depth = 0
    n = len(toks)
    opened_brace = False
    stops_at_comma = i < n and toks[i][0] not in ITEM_WORDS
    while i < n:
        t = toks[i][0]
        if t in "([{":
            if depth == 0 and t == "{":
                opened_brace = True
            depth += 1
        elif t in ")]}":
            depth -= 1
            if depth == 0 and t == "}" and opened_brace:
                if i + 1 < n and toks[i + 1][0] == ";":
                    return i + 2
                return i + 1
            if depth < 0:  # the enclosing block ended: the item ended before it
                return i
        elif (t == ";" or (t == "," and stops_at_comma)) and depth == 0:
            return i + 1
        i += 1
    return n


# ----------------------------------------------------------------------------------------------
# One file.


class Ref:
    """One reference from a module to another: where, the path (`name::item`), whether it is
    test code, the source line."""
    __slots__ = ("path", "line", "name", "item", "via", "test", "src")

    def __init__(self, path, line, name, item, via, test, src):
        self.path, self.line, self.name, self.item, self.via, self.test, self.src = (
            path, line, name, item, via, test, src)


def scan_file(text, modpath, path="<src>"):
    """Finds the crate-root-relative names a file refers to.

    modpath: the file's module path below the crate root (src/a/b.rs: ["a", "b"]).
    Returns (refs, test_children, root_globs): refs are (name, item, line, is_test, how) with
    `name` the first path segment after the crate root (a module, or an item of the root),
    `item` the segment after it (None for `crate::name` alone), `how` "use" or "path";
    test_children are the module paths of `#[cfg(test)] mod x;` declarations; root_globs the
    lines of `use crate::*` / `use super::*` that reach the crate root.
    """
    clean = strip_comments_and_strings(text)
    toks = tokenize(clean)
    n = len(toks)

    # Pass 1: test-only token ranges, inner cfg(test) of the file, `#[cfg(test)] mod x;`.
    test_ranges = []
    test_children = []
    block_starts = []  # token index of each open `{`
    i = 0
    while i < n:
        t = toks[i][0]
        if t == "{":
            block_starts.append(i)
        elif t == "}":
            if block_starts:
                block_starts.pop()
        elif t == "#":
            inner = i + 1 < n and toks[i + 1][0] == "!"
            lb = i + 2 if inner else i + 1
            if lb < n and toks[lb][0] == "[":
                end = _attr_end(toks, lb)
                if _attr_is_test_only(toks, lb, end):
                    if inner:
                        if block_starts:
                            test_ranges.append((block_starts[-1], _item_end(toks, block_starts[-1])))
                        else:
                            test_ranges.append((0, n))
                    else:
                        j = end
                        while j < n and toks[j][0] == "#":  # further attributes
                            k = j + 2 if j + 1 < n and toks[j + 1][0] == "!" else j + 1
                            j = _attr_end(toks, k) if k < n and toks[k][0] == "[" else j + 1
                        item_end = _item_end(toks, j)
                        test_ranges.append((i, item_end))
                        # `#[cfg(test)] [pub] mod name;`
                        words = [w for w, _ in toks[j:item_end]]
                        if "mod" in words and words[-1] == ";" and "{" not in words:
                            k = words.index("mod")
                            if k + 1 < len(words):
                                inline = _inline_mods_at(toks, i)
                                test_children.append(tuple(modpath + inline + [words[k + 1]]))
                i = end
                continue
        i += 1

    def in_test(idx):
        return any(a <= idx < b for a, b in test_ranges)

    # Pass 2: paths, tracking inline `mod name { ... }` blocks for `super::`.
    refs = []
    root_globs = []
    mod_stack = []  # (name, depth of its `{`)
    depth = 0
    pending_mod = None
    i = 0
    while i < n:
        t = toks[i][0]
        prev = toks[i - 1][0] if i else ""
        if t == "mod" and i + 2 < n and is_ident(toks[i + 1][0]) and toks[i + 2][0] == "{":
            pending_mod = toks[i + 1][0]
            i += 2
            continue
        if t == "{":
            depth += 1
            if pending_mod is not None:
                mod_stack.append((pending_mod, depth))
                pending_mod = None
            i += 1
            continue
        if t == "}":
            if mod_stack and mod_stack[-1][1] == depth:
                mod_stack.pop()
            depth -= 1
            i += 1
            continue
        if prev == "::":
            i += 1
            continue
        if t in ("crate", "$crate") and i + 1 < n and toks[i + 1][0] == "::":
            leaves, end = parse_use_tree(toks, i + 2)
            _add_leaves(refs, root_globs, toks, leaves, in_test, prev == "use" or _in_use(toks, i))
            i = max(end, i + 2)
            continue
        if t == "super" and i + 1 < n and toks[i + 1][0] == "::":
            k, j = 0, i
            while j + 1 < n and toks[j][0] == "super" and toks[j + 1][0] == "::":
                k, j = k + 1, j + 2
            here = modpath + [name for name, _ in mod_stack]
            leaves, end = parse_use_tree(toks, j)
            if k == len(here):  # climbs to the crate root
                _add_leaves(refs, root_globs, toks, leaves, in_test, _in_use(toks, i))
            i = max(end, j)
            continue
        i += 1
    return refs, test_children, root_globs


def _inline_mods_at(toks, idx):
    """Names of the inline `mod x { ... }` blocks enclosing toks[idx]."""
    stack, depth, pending = [], 0, None
    for i in range(idx):
        t = toks[i][0]
        if t == "mod" and i + 2 < len(toks) and is_ident(toks[i + 1][0]) and toks[i + 2][0] == "{":
            pending = toks[i + 1][0]
        elif t == "{":
            depth += 1
            if pending is not None:
                stack.append((pending, depth))
                pending = None
        elif t == "}":
            if stack and stack[-1][1] == depth:
                stack.pop()
            depth -= 1
    return [name for name, _ in stack]


def _in_use(toks, i):
    """Whether toks[i] sits inside a `use` declaration (walks back to `use` or a `;`/`}`)."""
    j = i - 1
    while j >= 0:
        t = toks[j][0]
        if t == "use":
            return True
        if t in (";", "}", "(", ")", "=", "<", ">"):
            return False
        j -= 1
    return False


def _add_leaves(refs, root_globs, toks, leaves, in_test, is_use):
    for segs, _alias, idx in leaves:
        if not segs:
            continue
        name = segs[0]
        line = toks[idx][1] if idx < len(toks) else toks[-1][1]
        if name == "*":
            root_globs.append(line)
            continue
        if name == "self":
            continue
        item = segs[1] if len(segs) > 1 else None
        refs.append((name, item, line, in_test(idx), "use" if is_use else "path"))


def root_imports(text):
    """Names the crate root brings in with `use`/`pub use` at its top level, mapped to the
    first path segment they come from: {"Thing": "b"} for `pub use b::x::Thing;`. Also the
    list of glob imports (`pub use b::*;`: their first segments)."""
    toks = tokenize(strip_comments_and_strings(text))
    names, globs = {}, []
    depth = 0
    i, n = 0, len(toks)
    while i < n:
        t = toks[i][0]
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
        elif t == "use" and depth == 0:
            j = i + 1
            if j < n and toks[j][0] == "::":
                j += 1
            leaves, end = parse_use_tree(toks, j)
            for segs, alias, _ in leaves:
                while segs and segs[0] in ("crate", "self"):
                    segs = segs[1:]
                if not segs:
                    continue
                if segs[-1] == "*":
                    globs.append(segs[0])
                    continue
                leaf = alias or (segs[-2] if segs[-1] == "self" and len(segs) > 1 else segs[-1])
                names[leaf] = segs[0]
            i = end
            continue
        i += 1
    return names, globs


# ----------------------------------------------------------------------------------------------
# One crate.


def module_of(rel):
    """Module path below the crate root of a file path relative to src/, or None for a root."""
    parts = rel.replace(os.sep, "/").split("/")
    if len(parts) == 1 and parts[0] in ("lib.rs", "main.rs"):
        return None
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


class CrateGraph:
    def __init__(self, name):
        self.name = name
        self.modules = set()
        self.edges = defaultdict(list)  # (a, b) -> [Ref]
        self.warnings = []


def analyze_crate(src_dir, name=None, display_root=None, include_tests=True):
    """Builds the module graph of the crate whose sources are in `src_dir`."""
    g = CrateGraph(name or os.path.basename(os.path.dirname(os.path.abspath(src_dir))))
    files = []
    for dirpath, dirnames, filenames in os.walk(src_dir):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, src_dir)
        if rel_dir == "bin" or rel_dir.startswith("bin" + os.sep):
            g.warnings.append("src/bin/ holds separate binary crates; not checked")
            dirnames[:] = []
            continue
        for f in sorted(filenames):
            if f.endswith(".rs"):
                files.append(os.path.normpath(os.path.join(rel_dir, f)))

    roots = [f for f in files if module_of(f) is None]
    if len(roots) > 1:
        g.warnings.append("both lib.rs and main.rs: their modules are checked as one graph")
    for f in files:
        mp = module_of(f)
        if mp:
            g.modules.add(mp[0])

    reexports, globs = {}, []
    for r in roots:
        with open(os.path.join(src_dir, r), encoding="utf-8") as fh:
            names, gl = root_imports(fh.read())
        reexports.update({k: v for k, v in names.items() if v in g.modules})
        globs += [x for x in gl if x in g.modules]
    for m in globs:
        g.warnings.append(f"the crate root glob-imports {m}::*; names it brings in are not resolved")

    def shown(f):
        p = os.path.join(src_dir, f)
        return os.path.relpath(p, display_root) if display_root else p

    # Scan every module file; collect test-only child modules to mark whole files as test.
    scanned = []
    test_mods = set()
    for f in files:
        mp = module_of(f)
        if not mp:
            continue
        with open(os.path.join(src_dir, f), encoding="utf-8") as fh:
            text = fh.read()
        refs, test_children, root_globs = scan_file(text, mp, f)
        test_mods.update(test_children)
        scanned.append((f, mp, refs, text.splitlines()))
        for line in root_globs:
            g.warnings.append(
                f"{shown(f)}:{line}: glob import of the crate root; names it brings in are not tracked")
    # Roots may declare test-only modules too (`#[cfg(test)] mod testutil;`).
    for r in roots:
        with open(os.path.join(src_dir, r), encoding="utf-8") as fh:
            _, test_children, _ = scan_file(fh.read(), [], r)
        test_mods.update(test_children)

    def file_is_test(mp):
        return any(tuple(mp[:k]) in test_mods for k in range(1, len(mp) + 1))

    for f, mp, refs, lines in scanned:
        whole_test = file_is_test(mp)
        if mp[0] not in g.modules:
            continue
        for name, item, line, is_test, _how in refs:
            is_test = is_test or whole_test
            if is_test and not include_tests:
                continue
            via = None
            if name in g.modules:
                target = name
            elif name in reexports:
                target, via = reexports[name], name
            else:
                continue  # an item of the crate root itself
            if target == mp[0]:
                continue
            src = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            if via:
                item = name
            g.edges[(mp[0], target)].append(Ref(shown(f), line, name, item, via, is_test, src))
    return g


# ----------------------------------------------------------------------------------------------
# Strongly connected components.


def tarjan(nodes, succ):
    """Strongly connected components of the graph (iterative Tarjan), each a sorted list;
    components in reverse topological order."""
    index, low, on_stack = {}, {}, set()
    stack, comps = [], []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def cycles(g, production_only=False):
    """The SCCs of `g` with more than one module."""
    succ = defaultdict(set)
    for (a, b), refs in g.edges.items():
        if production_only and all(r.test for r in refs):
            continue
        succ[a].add(b)
    return sorted((c for c in tarjan(g.modules, succ) if len(c) > 1), key=lambda c: (-len(c), c))


def shortest_cycle(comp, edges, start):
    """A shortest cycle through `start` inside `comp` (BFS), as a list of modules."""
    inside = set(comp)
    succ = defaultdict(list)
    for (a, b) in edges:
        if a in inside and b in inside:
            succ[a].append(b)
    prev = {start: None}
    queue = [start]
    while queue:
        nxt = []
        for v in queue:
            for w in sorted(succ[v]):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        queue = nxt
    return [start]


# ----------------------------------------------------------------------------------------------
# Command line.


def find_crates(root):
    base = os.path.join(root, "crates")
    if not os.path.isdir(base):
        return []
    return sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d, "src")))


def _example(refs):
    """One reference to show: production before test, `use`-free inline ones are as good."""
    prod = [r for r in refs if not r.test]
    return (prod or refs)[0]


def _fmt_ref(r):
    via = f" (via crate::{r.via})" if r.via else ""
    test = " [test]" if r.test else ""
    src = r.src if len(r.src) <= 110 else r.src[:107] + "..."
    return f"{r.path}:{r.line}{via}{test}  {src}"


def report_crate(g, out, show_refs=False, show_edges=False):
    comps = cycles(g)
    prod = cycles(g, production_only=True)
    prod_sets = [set(c) for c in prod]
    n_edges = len(g.edges)
    for w in g.warnings:
        print(f"warning: {g.name}: {w}", file=out)
    if show_edges:
        print(f"{g.name}: modules {', '.join(sorted(g.modules))}", file=out)
        for (a, b) in sorted(g.edges):
            refs = g.edges[(a, b)]
            tag = " [test only]" if all(r.test for r in refs) else ""
            print(f"  {a} -> {b} ({len(refs)}){tag}", file=out)
    if not comps:
        print(f"{g.name}: no cycle ({len(g.modules)} modules, {n_edges} edges)", file=out)
        return 0
    print(f"{g.name}: {len(comps)} cycle(s) ({len(g.modules)} modules, {n_edges} edges)", file=out)
    for k, comp in enumerate(comps, 1):
        cs = set(comp)
        inner_prod = [p for p in prod_sets if p <= cs]
        if inner_prod and any(p == cs for p in inner_prod):
            tag = "also without test code"
        elif inner_prod:
            added = sorted(cs - set().union(*inner_prod))
            tag = ("without test code: "
                   + "; ".join("{" + ", ".join(sorted(p)) + "}" for p in inner_prod)
                   + (f"; test code adds {', '.join(added)}" if added else
                      "; test code joins them"))
        else:
            tag = "test code only: production code has no cycle here"
        print(f"  cycle {k}: {{{', '.join(comp)}}} ({tag})", file=out)
        print(f"    e.g. {' -> '.join(shortest_cycle(comp, g.edges, comp[0]))}", file=out)
        for (a, b) in sorted(e for e in g.edges if e[0] in cs and e[1] in cs):
            refs = g.edges[(a, b)]
            n_test = sum(r.test for r in refs)
            counts = f"{len(refs)} ref{'s' if len(refs) != 1 else ''}"
            if n_test:
                counts += f", {n_test} in test code"
            items = sorted({r.item for r in refs if r.item})
            if items:
                counts += f"; {', '.join(items[:6])}{', ...' if len(items) > 6 else ''}"
            if show_refs:
                print(f"    {a} -> {b} ({counts}):", file=out)
                seen = set()
                for r in refs:  # one line per source line (a grouped `use` names several items)
                    if (r.path, r.line) not in seen:
                        seen.add((r.path, r.line))
                        print(f"      {_fmt_ref(r)}", file=out)
            else:
                print(f"    {a} -> {b} ({counts}): {_fmt_ref(_example(refs))}", file=out)
    return len(comps)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Fails when the module graph inside a crate has a cycle.",
        epilog="See the module docstring (scripts/module_cycles.py) for what counts as an edge.")
    ap.add_argument("--report", action="store_true", help="print the cycles and exit 0")
    ap.add_argument("--crate", action="append", default=[], metavar="NAME",
                    help="check only this crate (repeatable)")
    ap.add_argument("--refs", action="store_true", help="list every reference of a cycle's edges")
    ap.add_argument("--edges", action="store_true", help="print every crate's whole graph")
    ap.add_argument("--exclude-tests", action="store_true",
                    help="ignore test code (analysis only; CI checks with it)")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="workspace root (default: this script's repository)")
    args = ap.parse_args(argv)

    crates = find_crates(args.root)
    if not crates:
        print(f"error: no crates/*/src under {args.root}", file=sys.stderr)
        return 2
    if args.crate:
        wanted = []
        for c in args.crate:
            match = [d for d in crates if d == c or d.replace("-", "_") == c.replace("-", "_")]
            if not match:
                print(f"error: no crate {c!r} (have: {', '.join(crates)})", file=sys.stderr)
                return 2
            wanted += [m for m in match if m not in wanted]
        crates = wanted

    total = 0
    for c in crates:
        g = analyze_crate(os.path.join(args.root, "crates", c, "src"), name=c,
                          display_root=args.root, include_tests=not args.exclude_tests)
        total += report_crate(g, sys.stdout, show_refs=args.refs, show_edges=args.edges)
    if total:
        what = "report only" if args.report else "the module graph must have no cycle"
        print(f"{total} cycle(s) in {len(crates)} crate(s) ({what})")
        return 0 if args.report else 1
    print(f"ok: no module cycle in {len(crates)} crate(s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`
        sys.stderr.close()
        sys.exit(1)
