#!/usr/bin/env python3
"""The harness's shape (issue 36): no source file under harness/ above about 600 lines, and the
graph of its components (harness/<component>/, plus suites/) one-way: a component that includes
another's header depends on it, and no chain of such includes comes back to where it started.

  structure.py --repo DIR     checks DIR's tree; exit 1 naming each file too long and each cycle
  structure.py --self-test    plants a long file and a cycle in scratch trees and checks that
                              each is caught and that a clean tree passes
"""
import argparse
import os
import re
import sys
import tempfile

# "About 600 lines" (the words): the ceiling, with 20 lines of slack for a file that
# is whole at 607 rather than split for the sake of a number.
MAX_LINES = 620
INCLUDE = re.compile(r'^\s*#\s*include\s+"harness/(\w+)/', re.M)


def sources(repo, top):
    for root, _, files in os.walk(os.path.join(repo, top)):
        for f in sorted(files):
            if f.endswith((".h", ".cpp")):
                yield os.path.join(root, f)


def component(repo, path):
    rel = os.path.relpath(path, repo).split(os.sep)
    return rel[1] if rel[0] == "harness" else rel[0]


def long_files(repo):
    out = []
    for p in sources(repo, "harness"):
        with open(p, encoding="utf-8", errors="replace") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            out.append((os.path.relpath(p, repo), n))
    return sorted(out, key=lambda x: -x[1])


def graph(repo):
    deps = {}
    for top in ("harness", "suites"):
        for p in sources(repo, top):
            me = component(repo, p)
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for other in INCLUDE.findall(text):
                if other != me:
                    deps.setdefault(me, {}).setdefault(other, os.path.relpath(p, repo))
    return deps


def cycles(deps):
    found, color, stack = [], {}, []

    def visit(u):
        color[u] = 1
        stack.append(u)
        for v in sorted(deps.get(u, {})):
            if color.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif v not in color:
                visit(v)
        stack.pop()
        color[u] = 2

    for u in sorted(deps):
        if u not in color:
            visit(u)
    return found


def check(repo):
    problems = []
    for path, n in long_files(repo):
        problems.append(f"{path}: {n} lines, above {MAX_LINES}; split it by what its parts do "
                        f"(as parallel_context.cpp's FSDP and gradient parts were)")
    deps = graph(repo)
    for cyc in cycles(deps):
        via = "; ".join(f"{a} -> {b} ({deps[a][b]})" for a, b in zip(cyc, cyc[1:]))
        problems.append(f"include cycle between components: {' -> '.join(cyc)}: {via}; "
                        f"move what both need below both")
    return problems


def self_test():
    failures = []

    def tree(files):
        d = tempfile.mkdtemp(prefix="mih-structure-")
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        return d

    clean = tree({"harness/base/a.h": "#pragma once\n",
                  "harness/runtime/b.cpp": '#include "harness/base/a.h"\n',
                  "suites/s.cpp": '#include "harness/runtime/b.h"\n'})
    if check(clean):
        failures.append(f"a clean tree failed: {check(clean)}")
    long_tree = tree({"harness/base/big.cpp": "int x;\n" * (MAX_LINES + 1)})
    if not any("big.cpp" in p for p in check(long_tree)):
        failures.append("a file of MAX_LINES + 1 lines was not caught")
    cyc_tree = tree({"harness/base/a.cpp": '#include "harness/runtime/b.h"\n',
                     "harness/runtime/b.cpp": '#include "harness/spec/c.h"\n',
                     "harness/spec/c.cpp": '#include "harness/base/a.h"\n'})
    if not any("include cycle" in p and "base" in p and "spec" in p for p in check(cyc_tree)):
        failures.append(f"the cycle base -> runtime -> spec -> base was not caught: {check(cyc_tree)}")
    for f in failures:
        print("self-test:", f)
    print("self-test:", "FAILED" if failures else "passed (clean tree, long file, three-component cycle)")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    problems = check(a.repo)
    for p in problems:
        print(p)
    deps = graph(a.repo)
    print(f"{sum(1 for _ in sources(a.repo, 'harness'))} files under harness/ at most {MAX_LINES} lines: "
          f"{'no' if problems else 'yes'}; {len(deps)} components, {sum(len(v) for v in deps.values())} "
          f"dependencies, {len(cycles(deps))} cycles")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
