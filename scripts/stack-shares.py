#!/usr/bin/env python3
"""Shares of a profile's samples by call stack: the attribution behind docs/benchmarks.md's
"Where the pipeline's own CPU goes now" table.

Reads `perf script` output (samples recorded with `--call-graph dwarf`, as
scripts/profile-ceiling.sh records them) and prints, for each row, the share of all samples
whose stack has a frame containing the pattern's first part, frames containing each of its `+`
parts, and no frame containing a `!` part; ` | ` separates alternatives. Shares include what
each frame calls, so rows overlap.

    scripts/stack-shares.py perf.txt                 # the table's rows
    scripts/stack-shares.py perf.txt 'Persist::finish' 'sha2!Persist::finish'
"""
import collections
import sys

# (label, pattern): the rows of docs/benchmarks.md's table, and what they are made of.
ROWS = [
    ("persist stage", "Persist::finish"),
    ("  its transaction", "Store>::finish_step"),
    ("  next state: parsed by reference", "from_stored_json+Persist::finish"),
    ("  next state: the answer applied", "apply_answer+Persist::finish"),
    ("  next state: written as a parameter", "Serialize for aptix::assemble::state+write_step"),
    ("invoke stage", "stages::invoke::"),
    ("  the saved answer encoded", "SavedRoundTrip::encode"),
    ("publishing", "Settler::publish"),
    ("decoding stage messages", "messages::decode"),
    ("validate (admission)", "stages::admit::"),
    (
        "assemble's read of the state",
        "from_stored_json!Persist::finish | StoredState::packed | texts::in_place",
    ),
    ("  parsed by reference", "from_stored_json!Persist::finish"),
    ("  written out to be carried", "StoredState::packed"),
    ("  texts put in", "texts::in_place"),
    ("SHA-256", "sha2"),
    ("  the stage messages' MACs", "config::keys::mac"),
]


def samples(path):
    """Each sample: (thread name, frames innermost first)."""
    out, thread, frames = [], None, None
    for line in open(path, errors="replace"):
        if not line.strip():
            if frames is not None:
                out.append((thread, frames))
            thread, frames = None, None
        elif not line[0].isspace():
            thread, frames = line.split()[0], []
        elif frames is not None:
            parts = line.strip().split(" ", 1)
            frames.append(parts[1] if len(parts) > 1 else parts[0])
    if frames is not None:
        out.append((thread, frames))
    return out


def matches(frames, pattern):
    """Whether the stack matches one of the pattern's alternatives."""
    return any(matches_one(frames, p.strip()) for p in pattern.split(" | "))


def matches_one(frames, pattern):
    """Whether some frame holds the first part, frames hold each `+` part and none a `!` part."""
    want, *avoid = pattern.split("!")
    first, *also = want.split("+")
    if not any(first in f for f in frames):
        return False
    if not all(any(a in f for f in frames) for a in also):
        return False
    return not any(a in f for a in avoid for f in frames)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    got = samples(sys.argv[1])
    if not got:
        sys.exit("no samples")
    n = len(got)
    rows = [(p, p) for p in sys.argv[2:]] or ROWS
    print(f"{n} samples")
    threads = collections.Counter(t for t, _ in got)
    for thread, count in threads.most_common():
        print(f"{100 * count / n:6.1f} %  thread {thread}")
    kernel = sum(1 for _, f in got if f and "[kernel." in f[0])
    print(f"{100 * kernel / n:6.1f} %  in the kernel")
    for label, pattern in rows:
        count = sum(1 for _, f in got if matches(f, pattern))
        print(f"{100 * count / n:6.1f} %  {label}")


if __name__ == "__main__":
    main()
