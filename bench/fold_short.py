#!/usr/bin/env python3
"""Shortens the frame names of folded stacks (inferno-collapse-perf output) for a readable,
small flame graph: drops Rust symbol hashes and generic arguments (`Foo<Bar<u8>>::f` becomes
`Foo<>::f`), then merges the stacks that became equal. Reads stdin, writes stdout."""
import collections
import re
import sys

HASH = re.compile(r"::h[0-9a-f]{16}$")
GENERIC = re.compile(r"<[^<>]*>")


def short(frame: str) -> str:
    frame = HASH.sub("", frame)
    while True:
        shorter = GENERIC.sub("<>", frame).replace("<<>>", "<>")
        if shorter == frame:
            return frame
        frame = shorter


counts = collections.Counter()
for line in sys.stdin:
    stack, _, count = line.rstrip("\n").rpartition(" ")
    if not stack:
        continue
    counts[";".join(short(f) for f in stack.split(";"))] += int(count)
for stack, count in sorted(counts.items()):
    sys.stdout.write(f"{stack} {count}\n")
