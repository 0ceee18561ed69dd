#!/usr/bin/env python3
"""Shares of a profile's samples by function, from folded stacks (bench/load.sh PROFILE=...).

    bench/fold_top.py FILE [N] [REGEX]

Prints the N (30) functions with the most self samples, then, with REGEX, every function whose
name matches it with its inclusive share (samples with it anywhere on the stack, each stack
counted once per function). Shares are of all the process's samples, threads included."""
import collections
import re
import sys


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    pattern = re.compile(sys.argv[3]) if len(sys.argv) > 3 else None
    own = collections.Counter()
    inclusive = collections.Counter()
    total = 0
    with open(path, encoding="utf-8") as folded:
        for line in folded:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            n = int(count)
            total += n
            own[frames[-1]] += n
            if pattern:
                for frame in set(frames):
                    if pattern.search(frame):
                        inclusive[frame] += n
    print(f"{total} samples")
    for name, n in own.most_common(top):
        print(f"{100 * n / total:5.1f} %  self  {name[:140]}")
    for name, n in inclusive.most_common():
        print(f"{100 * n / total:5.1f} %  incl  {name[:140]}")


if __name__ == "__main__":
    main()
