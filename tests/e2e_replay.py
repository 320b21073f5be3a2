#!/usr/bin/env python3
"""What an application left in a directory, from its own system calls.

  e2e_replay.py DIR INITIAL STRACE_LOG [TRACED_AS]

INITIAL lists the files below DIR (relative paths, one a line) when the trace
began; STRACE_LOG is `strace -f [-ttt] -e trace=... -o` output of every
process that changed DIR, in the order the calls returned (a call split by
another one, "<unfinished ...>" then "<... resumed>", counts when it
resumed; failed calls change nothing). (Not -z: strace 6.1 drops the
resumed half of a successful call with it.) Files created (open with O_CREAT, mknod, link, symlink), renamed
and deleted below DIR are replayed, and the result is compared with the files
below DIR now: lost (should be there, is not) and resurrected (is there,
though deleted or never made). A name deleted or renamed away successfully
while the replay has it gone was resurrected too, whatever the end shows
(a cleaner such as htcacheclean deletes it again), unless that happened
while a `down` merged (E2E_DOWNS: lines "START END", HH:MM:SS.mmm): the
application then sees the disk's older entries until the merge reaches
them, documented in docs/writeback.md; those are counted apart. Two calls on
one name whose times overlap (one entered before the other returned: Apache
renaming a name in while htcacheclean deletes it) ran in an order the trace
cannot tell; until the next call on that name, it may be there or not, and is
neither lost nor resurrected (counted apart as well). E2E_WINDOWS
(the same, for apply) marks names made while an apply seeded. Directories are not compared: a directory
emptied by a cleaner while the other side still held files is the merge's
documented choice. Exit status 1 on any difference.
"""
import os
import re
import sys

STR = r'"((?:[^"\\]|\\.)*)"'
CALL = re.compile(r"^(?:\d+\s+)?(?:[\d.:]+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)")


def unescape(s):
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode(
        "utf-8", "surrogateescape")


def stamp(line):
    parts = line.split()
    return float(parts[1]) if len(parts) > 1 and re.match(r"^\d+\.\d+$", parts[1]) else 0.0


def clock(epoch):
    """HH:MM:SS.mmm, local time, as the scripts log it."""
    import time
    return time.strftime("%H:%M:%S", time.localtime(float(epoch))) + f".{int(float(epoch) * 1000) % 1000:03d}"


def main():
    windows = []
    if os.environ.get("E2E_WINDOWS") and os.path.exists(os.environ["E2E_WINDOWS"]):
        windows = [tuple(l.split()) for l in open(os.environ["E2E_WINDOWS"]).read().splitlines() if l]
    downs = []
    if os.environ.get("E2E_DOWNS") and os.path.exists(os.environ["E2E_DOWNS"]):
        downs = [tuple(l.split()) for l in open(os.environ["E2E_DOWNS"]).read().splitlines() if l]
    made_during = {}  # name -> when it was made while an apply ran
    stale = []  # deleted again while a down merged: the documented stale view

    def in_down(t):
        c = clock(t) if t else ""
        return next((f"{c} (down {a}-{b})" for a, b in downs if a <= c <= b), None)

    def note(name, line):
        t = line.split()[1] if len(line.split()) > 1 else ""
        if windows and re.match(r"^\d+\.\d+$", t):
            c = clock(t)
            for start, end in windows:
                if start <= c <= end:
                    made_during[name] = f"{c} (apply {start}-{end})"
    root, initial, trace = sys.argv[1:4]
    root = os.path.realpath(root)
    # [TRACED_AS]: DIR's path in the trace, when DIR is a copy
    traced = sys.argv[4] if len(sys.argv) > 4 else root
    files = set(l for l in open(initial).read().splitlines() if l)

    def rel(p):
        p = os.path.normpath(p)
        if p == traced or not p.startswith(traced + "/"):
            return None
        return p[len(traced) + 1:]

    ops = 0
    last = {}  # name -> when the last call on it returned
    unsure = set()  # names whose last two calls overlapped: there or not
    ambiguous = set()  # every name that was unsure when found gone, or at the end

    def touch(name, entry_t, exit_t):
        """A call on `name`: unsure if it overlapped the one before."""
        if entry_t < last.get(name, 0.0):
            unsure.add(name)
        else:
            unsure.discard(name)
        last[name] = max(last.get(name, 0.0), exit_t)
    ghosts = []  # names deleted or renamed away that the replay had as gone: they came back
    pending = {}  # pid -> the first half of a call another one interrupted
    for line in open(trace, errors="surrogateescape"):
        line = line.strip()
        pid = line.split(" ", 1)[0]
        if line.endswith("<unfinished ...>"):
            pending[pid] = line[: -len("<unfinished ...>")].rstrip()
            continue
        r = re.match(r"^(\d+)\s+(?:([\d.]+)\s+)?<\.\.\. \w+ resumed>\s?(.*)$", line)
        # When the call entered and when it returned (-ttt; 0 without):
        # calls on one name whose times overlap may be in either order.
        exit_t = entry_t = stamp(line)
        if r:
            if pid not in pending:
                continue
            first = pending.pop(pid)
            entry_t = stamp(first)
            line = first + r.group(3)
        m = CALL.match(line)
        if not m or int(m.group(3)) < 0:
            continue
        name, args = m.group(1), m.group(2)
        paths = [unescape(s) for s in re.findall(STR, args)]
        if name in ("open", "openat", "creat", "mknod", "mknodat"):
            if name in ("open", "openat") and "O_CREAT" not in args:
                continue
            r = rel(paths[0]) if paths else None
            if r is not None:
                files.add(r)
                note(r, line)
                touch(r, entry_t, exit_t)
                ops += 1
        elif name in ("rename", "renameat", "renameat2"):
            if len(paths) != 2 or "RENAME_EXCHANGE" in args:
                continue
            a, b = rel(paths[0]), rel(paths[1])
            if a is None:
                moved = set()
            elif a in files:
                moved = {a}
            else:  # a directory: everything below it
                moved = {f for f in files if f.startswith(a + "/")}
                if not moved and "/" in a and entry_t > last.get(a, 0.0):
                    if a in unsure:
                        ambiguous.add(a)
                    else:
                        (stale if in_down(entry_t) else ghosts).append(a)
            files -= moved
            if b is not None:
                for f in moved:
                    files.add(b + f[len(a):])
                    note(b + f[len(a):], line)
                    touch(b + f[len(a):], entry_t, exit_t)
            if a is not None:
                touch(a, entry_t, exit_t)
            ops += 1
        elif name in ("unlink", "unlinkat"):
            r = rel(paths[0]) if paths else None
            if r is not None and "AT_REMOVEDIR" not in args:
                # Gone already, and not racing with the call that made it gone
                # or put it back: it came back from elsewhere.
                if r not in files and entry_t > last.get(r, 0.0):
                    if r in unsure:
                        ambiguous.add(r)
                    else:
                        (stale if in_down(entry_t) else ghosts).append(r)
                files.discard(r)
                touch(r, entry_t, exit_t)
                ops += 1
        elif name in ("link", "linkat", "symlink", "symlinkat"):
            r = rel(paths[-1]) if paths else None
            if r is not None:
                files.add(r)
                touch(r, entry_t, exit_t)
                ops += 1
    actual = set()
    for dirpath, dirs, names in os.walk(root):
        for n in names:
            actual.add(os.path.relpath(os.path.join(dirpath, n), root))
    ambiguous |= unsure
    lost = sorted(files - actual - unsure)
    resurrected = sorted(actual - files - unsure)
    print(f"replayed {ops} file operations: expected {len(files)} files, found {len(actual)}; "
          f"lost {len(lost)}, resurrected {len(resurrected)}, "
          f"deleted again after they had gone {len(ghosts)} "
          f"(and {len(stale)} more while a down merged: the documented stale view); "
          f"{len(ambiguous)} names after overlapping calls in an order the trace cannot tell")
    def why(f):
        return f"; made on disk while apply ran: {made_during[f]}" if f in made_during else ""
    for f in lost[:10]:
        print(f"  lost: {f}{why(f)}")
    for f in resurrected[:10]:
        print(f"  resurrected: {f}{why(f)}")
    for f in ghosts[:10]:
        print(f"  deleted again: {f}{why(f)}")
    if windows:
        bad = lost + resurrected + ghosts
        print(f"  {sum(1 for f in bad if f in made_during)} of these {len(bad)} were made while an apply ran")
    sys.exit(1 if lost or resurrected or ghosts else 0)


if __name__ == "__main__":
    main()
