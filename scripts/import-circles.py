#!/usr/bin/env python3
"""Lists the import circles between the source files of the workspace.

A Rust file imports another when it names one of its items through a path (`use
crate::engine::plan::…`, `super::driver::Driver`, `crate::store::rows::corrupt(…)`): the path
is resolved to the deepest module file it reaches. A module's declarations of its children
(`mod x;`) are not imports. A console script imports the files it names in `import … from
'./x.js'`, and `console.rs` the scripts it serves. Test modules (`#[cfg(test)] mod tests`) are
left out.

Usage: scripts/import-circles.py [DIR]   (default: the repository)
Prints each circle as `a -> b -> a` and the count; exits 1 when there is one.
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
CRATES = {"orchestrator": "orchestrator/src", "saga_dsl": "saga-dsl/src", "example_sagas": "example-sagas/src"}


def module_file(src, parts):
    """The file of module `parts` under `src`, or None."""
    base = os.path.join(ROOT, src, *parts)
    for path in (base + ".rs", os.path.join(base, "mod.rs")):
        if os.path.isfile(path):
            return path
    if not parts:
        for root_file in ("lib.rs", "main.rs"):
            path = os.path.join(ROOT, src, root_file)
            if os.path.isfile(path):
                return path
    return None


def module_of(src, path):
    """The module path of file `path` under `src`."""
    rel = os.path.relpath(path, os.path.join(ROOT, src))[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def resolve(src, parts):
    """The deepest module file a path of names reaches."""
    for n in range(len(parts), -1, -1):
        path = module_file(src, parts[:n])
        if path:
            return path
    return None


def rust_edges():
    edges = set()
    for src in CRATES.values():
        for dirpath, _, files in os.walk(os.path.join(ROOT, src)):
            for name in files:
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                text = open(path, encoding="utf-8").read()
                text = re.split(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod tests", text)[0]
                text = re.sub(r"//[^\n]*", "", text)
                here = module_of(src, path)
                # `use a::{b, c::{d}}` → a::b, a::c::d; plain paths elsewhere.
                paths = []
                for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)(?:::\{([^;]*?)\})?", text):
                    head = m.group(1).split("::")
                    if m.group(2):
                        for item in re.split(r"[,{}\s]+", m.group(2)):
                            if item and item not in ("self", "*"):
                                paths.append(head + item.split("::"))
                    paths.append(head)
                for parts in paths:
                    if parts[0] == "crate":
                        parts = parts[1:]
                    elif parts[0] == "self":
                        parts = here + parts[1:]
                    else:
                        base = list(here)
                        while parts and parts[0] == "super":
                            base = base[:-1]
                            parts = parts[1:]
                        parts = base + parts
                    target = resolve(src, parts)
                    if target and target != path:
                        edges.add((path, target))
    return edges


def js_edges():
    edges = set()
    console = os.path.join(ROOT, "orchestrator/src/http/console")
    if not os.path.isdir(console):
        return edges
    for name in os.listdir(console):
        if name.endswith(".js"):
            text = open(os.path.join(console, name), encoding="utf-8").read()
            for m in re.finditer(r"from\s+['\"]\./([\w.]+)['\"]", text):
                edges.add((os.path.join(console, name), os.path.join(console, m.group(1))))
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    found = circles(rust_edges() | js_edges())
    for comp in found:
        print(" <-> ".join(os.path.relpath(p, ROOT) for p in comp))
    print(f"{len(found)} import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
