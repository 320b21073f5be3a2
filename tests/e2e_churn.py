#!/usr/bin/env python3
"""An application that keeps a log of every change it makes to a directory,
so that what must be there at the end is known exactly.

  e2e_churn.py run DIR LOG [--seconds N] [--seed S] [--rate OPS]
      Until SIGTERM (or N seconds): creates files (written under a temporary
      name, then renamed into place), replaces them the same way, deletes
      them and renames them, in DIR/d0 .. DIR/d7, by name, as a cache does.
      Every operation that succeeded is appended to LOG once it returned
      (an operation that failed, e.g. ENOENT because the directory it works
      in was just switched to the other side, is logged as failed and
      changes nothing). Runs again with the same LOG append to it.

  e2e_churn.py check DIR LOG [WINDOWS]
      Replays LOG and compares the result with DIR: prints the counts and
      exits 1 when a name is missing (lost), present though deleted or never
      written (resurrected), or a file holds a torn or foreign content.
      A file holding an older version of its own name is counted (stale), not
      failed: the write-back's documented conflict rule (a rename or deletion
      the application made on its stale view, after a switch, wins over the
      RAM's later version; docs/writeback.md "What is not covered").
      WINDOWS (lines "START END", HH:MM:SS.mmm) are the times apply ran:
      a lost or resurrected name written in one is marked so.

File contents: "churn ID SIZE\\n", filler, "end ID\\n"; IDs are unique.
"""
import errno
import os
import random
import signal
import sys
import time

DIRS = [f"d{i}" for i in range(8)]


def content(ident, rng):
    size = rng.randrange(64, 8192)
    head = f"churn {ident} {size}\n".encode()
    tail = f"end {ident}\n".encode()
    fill = bytes(rng.randrange(97, 123) for _ in range(16)) * (size // 16 + 1)
    return head + fill[:size] + tail


def parse(data):
    """The ID of an intact file, else None."""
    try:
        first, rest = data.split(b"\n", 1)
        _, ident, size = first.split(b" ")
        size = int(size)
        if rest[size:] != b"end " + ident + b"\n":
            return None
        return ident.decode()
    except ValueError:
        return None


def run(root, logpath, seconds, seed, rate):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    rng = random.Random(seed)
    raw = open(logpath, "a", buffering=1)

    class Log:
        # Each line starts with the wall-clock time (HH:MM:SS.mmm), for a post-mortem.
        def write(self, line):
            now = time.time()
            raw.write(time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d} " + line)

        def close(self):
            raw.close()

    logf = Log()
    tag = f"{os.getpid()}x{rng.randrange(1 << 30):x}"
    counter = 0
    live = []  # names this process believes exist
    for d in DIRS:
        try:
            os.mkdir(os.path.join(root, d))
            logf.write(f"mkdir {d}\n")
        except FileExistsError:
            pass
    # Names from earlier runs (same LOG): replayed, so they are worked on too.
    state, _ = replay(logpath)
    live = [n for n, v in state.items() if v != "tmp" and v != "dir"]
    counts = {"put": 0, "replace": 0, "del": 0, "mv": 0, "failed": 0}
    end = time.monotonic() + seconds if seconds else None
    pause = 1.0 / rate if rate else 0

    def put(name, kind):
        nonlocal counter
        counter += 1
        ident = f"{tag}.{counter}"
        tmp = os.path.join(os.path.dirname(name), f".tmp.{ident}")
        path = os.path.join(root, tmp)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            logf.write(f"failed create {tmp} {errno.errorcode.get(e.errno)}\n")
            counts["failed"] += 1
            return
        logf.write(f"tmp {tmp}\n")
        try:
            os.write(fd, content(ident, rng))
        finally:
            os.close(fd)
        try:
            os.rename(path, os.path.join(root, name))
        except OSError as e:
            logf.write(f"failed put {tmp} {name} {errno.errorcode.get(e.errno)}\n")
            counts["failed"] += 1
            try:
                os.unlink(path)
                logf.write(f"del {tmp}\n")
            except OSError:
                pass
            return
        logf.write(f"put {tmp} {name} {ident}\n")
        counts[kind] += 1
        if kind == "put":
            live.append(name)

    while not stop and (end is None or time.monotonic() < end):
        r = rng.random()
        if r < 0.4 or len(live) < 20:
            counter += 0
            put(os.path.join(rng.choice(DIRS), f"f{tag}.{counter + 1}"), "put")
        elif r < 0.65:
            put(rng.choice(live), "replace")
        elif r < 0.85:
            name = live.pop(rng.randrange(len(live)))
            try:
                os.unlink(os.path.join(root, name))
                logf.write(f"del {name}\n")
                counts["del"] += 1
            except OSError as e:
                logf.write(f"failed del {name} {errno.errorcode.get(e.errno)}\n")
                counts["failed"] += 1
        else:
            name = live.pop(rng.randrange(len(live)))
            counter += 1
            new = os.path.join(rng.choice(DIRS), f"m{tag}.{counter}")
            try:
                os.rename(os.path.join(root, name), os.path.join(root, new))
                logf.write(f"mv {name} {new}\n")
                counts["mv"] += 1
                live.append(new)
            except OSError as e:
                logf.write(f"failed mv {name} {new} {errno.errorcode.get(e.errno)}\n")
                counts["failed"] += 1
        if pause:
            time.sleep(pause)
    logf.close()
    print(" ".join(f"{k}={v}" for k, v in counts.items()))


def replay(logpath):
    """name -> ID (or "tmp", "dir"); name -> every ID it ever held."""
    state, history = {}, {}
    try:
        lines = open(logpath).read().splitlines()
    except FileNotFoundError:
        return state, history
    for line in lines:
        op = line.split(" ")[1:]
        if op[0] == "mkdir":
            state[op[1]] = "dir"
        elif op[0] == "tmp":
            state[op[1]] = "tmp"
        elif op[0] == "put":
            _, tmp, name, ident = op
            state.pop(tmp, None)
            state[name] = ident
            history.setdefault(name, set()).add(ident)
        elif op[0] == "del":
            state.pop(op[1], None)
        elif op[0] == "mv":
            _, a, b = op
            state[b] = state.pop(a)
            history.setdefault(b, set()).update(history.get(a, ()))
        elif op[0] == "failed":
            pass
        else:
            raise SystemExit(f"e2e_churn: bad log line {line!r}")
    return state, history


def writes_in(logpath, windows):
    """name -> the apply windows during which the log wrote it ("put" or "mv" into it)."""
    found = {}
    for line in open(logpath).read().splitlines():
        t, op = line.split(" ", 1)
        op = op.split(" ")
        name = op[2] if op[0] in ("put", "mv") else None
        for start, end in windows:
            if name and start <= t <= end:
                found.setdefault(name, []).append(f"{t} (apply {start}-{end})")
    return found


def check(root, logpath, windows_path=None):
    state, history = replay(logpath)
    windows = []
    if windows_path and os.path.exists(windows_path):
        windows = [tuple(l.split()) for l in open(windows_path).read().splitlines() if l]
    during = writes_in(logpath, windows)
    actual = {}
    for d in DIRS:
        p = os.path.join(root, d)
        if not os.path.isdir(p):
            continue
        actual[d] = "dir"
        for n in os.listdir(p):
            actual[os.path.join(d, n)] = None
    expected = set(state)
    lost = sorted(expected - set(actual))
    resurrected = sorted(set(actual) - expected)
    stale, bad, temps = [], [], 0
    for name in sorted(expected & set(actual)):
        want = state[name]
        if want == "dir":
            continue
        if want == "tmp":
            temps += 1
            continue
        with open(os.path.join(root, name), "rb") as f:
            got = parse(f.read())
        if got == want:
            continue
        if got is not None and got in history.get(name, ()):
            stale.append((name, got, want))
        else:
            bad.append((name, got, want))
    files = sum(1 for v in state.values() if v not in ("dir", "tmp"))
    print(f"expected {files} files and {temps} temporaries, found {len(actual) - len(DIRS)} entries; "
          f"lost {len(lost)}, resurrected {len(resurrected)}, torn or foreign {len(bad)}, "
          f"older version (stale view) {len(stale)}")
    for name in lost[:10]:
        print(f"  lost: {name} (last written {state[name]})")
    for name in resurrected[:10]:
        why = during.get(name)
        print(f"  resurrected: {name}" + (f"; written on disk while apply ran: {why[-1]}" if why else ""))
    explained = sum(1 for n in lost + resurrected if n in during)
    if windows:
        print(f"  {explained} of the {len(lost) + len(resurrected)} lost or resurrected names were written "
              f"while an apply ran ({len(windows)} applies)")
    for name, got, want in bad[:10]:
        print(f"  torn or foreign: {name} holds {got}, expected {want}")
    for name, got, want in stale[:10]:
        print(f"  stale: {name} holds {got}, the application last wrote {want}")
    return 1 if lost or resurrected or bad else 0


def main():
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "run":
        opts = dict(zip(a[3::2], a[4::2]))
        run(a[1], a[2], float(opts.get("--seconds", 0)), opts.get("--seed"),
            float(opts.get("--rate", 300)))
    elif len(a) in (3, 4) and a[0] == "check":
        sys.exit(check(a[1], a[2], a[3] if len(a) == 4 else None))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
