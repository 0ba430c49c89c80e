#!/usr/bin/env python3
"""Relative links in the repository's Markdown resolve: every `[text](path#anchor)` in a
tracked `*.md` file names an existing file and, for a Markdown target, a heading that GitHub
would give that anchor. Links with a scheme (https:, mailto:) are not checked. Exits 1 on any
broken link (run by .ci/run).

    python3 scripts/check_links.py [ROOT]
"""
import os
import re
import subprocess
import sys
import unicodedata

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    out = []
    for ch in re.sub(r"<[^>]+>", "", heading.strip().lower()):
        if ch == " ":
            out.append("-")
        elif ch in "-_" or unicodedata.category(ch)[0] in "LN":
            out.append(ch)
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        seen, found, fenced = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
                s = slug(text.replace("`", "").replace("*", ""))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        cache[path] = found
    return cache[path]


def main():
    os.chdir(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = subprocess.run(["git", "ls-files", "*.md"], capture_output=True, text=True).stdout.split()
    bad = 0
    for f in files:
        fenced = False
        for i, line in enumerate(open(f, encoding="utf-8"), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target) or target.startswith("//"):
                    continue
                path, _, anchor = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                if not os.path.exists(resolved):
                    print(f"{f}:{i}: missing file {target}")
                    bad += 1
                elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                    print(f"{f}:{i}: missing anchor {target}")
                    bad += 1
    print(f"markdown links: {bad} broken in {len(files)} files")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
