//! Everything tmpfsctl prints goes through here: where it goes, what a reader
//! that went away means, and how strings from the host look in human output.
//!
//! A closed stdout is no failure (`tmpfsctl apply SPEC | head -1`): the
//! command has done or still does its work and exits with the status that
//! work earned; it only stops printing. The Rust runtime ignores SIGPIPE, so
//! a write to a pipe nobody reads fails with EPIPE instead of killing the
//! process part way through a mount; `print!`/`eprint!` would panic on that
//! error, these functions remember it and attempt nothing more on that
//! stream. Any other error writing stdout (a full disk behind `> file`) is
//! kept for [`stdout_failure`], so the command can say so at the end.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Mutex, PoisonError};

enum StreamState {
    Open,
    /// The reader went away (EPIPE).
    Closed,
    /// Another write error; nothing more is attempted.
    Failed(io::Error),
}

struct Stream {
    state: Mutex<StreamState>,
    write: fn(&[u8]) -> nix::Result<usize>,
}

static STDOUT: Stream = Stream {
    state: Mutex::new(StreamState::Open),
    write: write_stdout,
};
static STDERR: Stream = Stream {
    state: Mutex::new(StreamState::Open),
    write: write_stderr,
};

fn write_stdout(buf: &[u8]) -> nix::Result<usize> {
    nix::unistd::write(io::stdout(), buf)
}

fn write_stderr(buf: &[u8]) -> nix::Result<usize> {
    nix::unistd::write(io::stderr(), buf)
}

impl Stream {
    /// Writes all of `buf` straight to the descriptor (no buffer of std's that
    /// could keep bytes and retry them at exit), holding the lock so that lines
    /// of concurrent threads do not interleave.
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(*state, StreamState::Open) {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut rest = buf;
        while !rest.is_empty() {
            match (self.write)(rest) {
                Ok(0) => {
                    *state = StreamState::Failed(io::ErrorKind::WriteZero.into());
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => rest = &rest[n..],
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EPIPE) => {
                    *state = StreamState::Closed;
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                Err(e) => {
                    *state = StreamState::Failed(e.into());
                    return Err(io::Error::from(e));
                }
            }
        }
        Ok(())
    }
}

/// Prints to stdout; see the module documentation for a closed stdout.
pub fn print(text: &str) {
    let _ = STDOUT.write_all(text.as_bytes());
}

/// Prints to stderr, never panicking: there is nowhere left to report a
/// failure to write an error message.
pub fn eprint(text: &str) {
    let _ = STDERR.write_all(text.as_bytes());
}

/// Stdout as an `io::Write`, for output written piecewise (a streamed report,
/// the manual page). A write after the reader went away returns `BrokenPipe`.
pub fn stdout() -> Writer {
    Writer(&STDOUT)
}

/// Stderr as an `io::Write` (the agent's log).
pub fn stderr() -> Writer {
    Writer(&STDERR)
}

pub struct Writer(&'static Stream);

impl io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(buf).map(|()| buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A write error on stdout other than a closed pipe: the output the user asked
/// for is incomplete.
pub fn stdout_failure() -> Option<String> {
    match &*STDOUT.state.lock().unwrap_or_else(PoisonError::into_inner) {
        StreamState::Failed(e) => Some(e.to_string()),
        _ => None,
    }
}

/// A string from the host (a path, a file or process name, an error message
/// that embeds them) as it may appear in human output: every character that
/// is not printable is shown as an escape, so no name can move the cursor,
/// retitle the terminal, reorder the text around it or start a line of its
/// own. The rule:
///
/// - `\t`, `\n`, `\r` for tab, newline and carriage return;
/// - `\xNN` for every other ASCII control character (ESC is `\x1b`, BEL
///   `\x07`, DEL `\x7f`) and for every byte that is not UTF-8;
/// - `\u{NN}` for the other Unicode control characters (U+0080–U+009F; some
///   terminals read U+009B as the start of an escape sequence), the
///   bidirectional formatting marks (U+061C, U+200E, U+200F, U+202A–U+202E,
///   U+2066–U+2069) and the line and paragraph separators (U+2028, U+2029);
/// - everything else, a backslash included, as it is.
///
/// ESC, BEL and the U+0080–U+009F controls look the same as in the agent's
/// log, whose formatter escapes those the same way. JSON output does not use
/// this: serde's string escaping keeps it exact.
pub fn escape<S: AsRef<OsStr> + ?Sized>(text: &S) -> Cow<'_, str> {
    let bytes = text.as_ref().as_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.chars().any(hidden) {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if c.is_ascii_control() => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if hidden(c) => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'
        )
}

/// JSON for paths and names read from the host (the mount table, /proc): a
/// path that is not UTF-8 is written with U+FFFD for its bad bytes, where
/// serde's own form of a path would fail the whole report.
pub mod lossy {
    use std::ffi::OsStr;
    use std::path::PathBuf;

    use serde::Serializer;

    pub fn path<P: AsRef<OsStr>, S: Serializer>(p: &P, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&p.as_ref().to_string_lossy())
    }

    pub fn opt_path<S: Serializer>(p: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match p {
            Some(p) => s.serialize_some(&*p.to_string_lossy()),
            None => s.serialize_none(),
        }
    }

    pub fn named_paths<S: Serializer>(v: &[(String, PathBuf)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(n, p)| (n, p.to_string_lossy())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};

    fn esc(bytes: &[u8]) -> String {
        escape(OsStr::from_bytes(bytes)).into_owned()
    }

    /// A stream over a scripted descriptor: each call takes the next result
    /// (bytes accepted, or an errno) and records what it was offered.
    macro_rules! scripted {
        ($name:ident, $script:expr) => {
            mod $name {
                use std::sync::Mutex;
                pub static CALLS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
                pub fn write(buf: &[u8]) -> nix::Result<usize> {
                    let mut calls = CALLS.lock().unwrap();
                    let script: &[Result<usize, nix::errno::Errno>] = &$script;
                    let r = script[calls.len()];
                    calls.push(buf.to_vec());
                    r
                }
            }
        };
    }

    fn stream(write: fn(&[u8]) -> nix::Result<usize>) -> Stream {
        Stream {
            state: Mutex::new(StreamState::Open),
            write,
        }
    }

    scripted!(pipe_closes, [Ok(3), Err(nix::errno::Errno::EPIPE)]);

    #[test]
    fn a_closed_pipe_is_remembered_and_never_written_again() {
        let s = stream(pipe_closes::write);
        s.write_all(b"one").unwrap();
        let e = s.write_all(b"two").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        assert!(matches!(*s.state.lock().unwrap(), StreamState::Closed));
        for _ in 0..3 {
            assert_eq!(
                s.write_all(b"more").unwrap_err().kind(),
                io::ErrorKind::BrokenPipe
            );
        }
        assert_eq!(
            *pipe_closes::CALLS.lock().unwrap(),
            [b"one".to_vec(), b"two".to_vec()]
        );
    }

    scripted!(
        short_and_interrupted,
        [Ok(2), Err(nix::errno::Errno::EINTR), Ok(1), Ok(3)]
    );

    #[test]
    fn short_writes_and_signals_still_write_everything_in_order() {
        let s = stream(short_and_interrupted::write);
        s.write_all(b"abcdef").unwrap();
        let calls = short_and_interrupted::CALLS.lock().unwrap();
        assert_eq!(
            *calls,
            [
                b"abcdef".to_vec(),
                b"cdef".to_vec(),
                b"cdef".to_vec(),
                b"def".to_vec()
            ]
        );
        assert!(matches!(*s.state.lock().unwrap(), StreamState::Open));
    }

    scripted!(disk_full, [Err(nix::errno::Errno::ENOSPC)]);

    #[test]
    fn another_error_is_kept_for_the_end_and_stops_the_stream() {
        let s = stream(disk_full::write);
        assert_eq!(
            s.write_all(b"report").unwrap_err().raw_os_error(),
            Some(libc::ENOSPC)
        );
        assert!(
            matches!(&*s.state.lock().unwrap(), StreamState::Failed(e) if e.raw_os_error() == Some(libc::ENOSPC))
        );
        assert!(s.write_all(b"more").is_err());
        assert_eq!(disk_full::CALLS.lock().unwrap().len(), 1);
    }

    scripted!(takes_nothing, [Ok(0)]);

    #[test]
    fn a_descriptor_that_takes_nothing_ends_the_stream_instead_of_a_loop() {
        let s = stream(takes_nothing::write);
        assert_eq!(s.write_all(b"x").unwrap_err().kind(), io::ErrorKind::WriteZero);
        assert!(s.write_all(b"y").is_err());
        assert_eq!(takes_nothing::CALLS.lock().unwrap().len(), 1);
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in [
            "",
            "nginx",
            "/var/cache/nginx",
            "a b",
            "ünïcødé ✓ 缓存",
            "back\\slash",
            "tab-less ~!@#$%^&*()",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(b) if b == s), "{s:?}");
        }
    }

    #[test]
    fn every_ascii_control_is_escaped() {
        for b in (0u8..0x20).chain([0x7f]) {
            let want = match b {
                b'\t' => "\\t".to_string(),
                b'\n' => "\\n".to_string(),
                b'\r' => "\\r".to_string(),
                _ => format!("\\x{b:02x}"),
            };
            assert_eq!(esc(&[b'a', b, b'z']), format!("a{want}z"), "byte {b:#x}");
        }
        for b in 0x20u8..0x7f {
            assert_eq!(esc(&[b]), (b as char).to_string(), "byte {b:#x}");
        }
    }

    #[test]
    fn the_hostile_process_name_of_the_issue() {
        let shown = esc(b"\x1b]0;OWNED\x07\x1b[2J");
        assert_eq!(shown, "\\x1b]0;OWNED\\x07\\x1b[2J");
        assert!(!shown.bytes().any(|b| b.is_ascii_control()));
    }

    #[test]
    fn unicode_controls_and_invisible_marks_are_escaped() {
        for c in ('\u{80}'..='\u{9f}').chain([
            '\u{061c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
            '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{2028}', '\u{2029}',
        ]) {
            assert_eq!(
                escape(&format!("x{c}y")),
                format!("x\\u{{{:x}}}y", c as u32),
                "{:#x}",
                c as u32
            );
        }
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m");
        // Neighbours of the escaped ranges stay: they are ordinary text.
        for c in [
            '\u{a0}', '\u{200d}', '\u{2010}', '\u{2027}', '\u{202f}', '\u{2065}', '\u{206a}', '\u{fffd}',
        ] {
            let s = format!("x{c}y");
            assert_eq!(escape(&s), s, "{:#x}", c as u32);
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_bytes() {
        assert_eq!(esc(b"caf\xe9"), "caf\\xe9");
        assert_eq!(esc(b"\xff\xfe"), "\\xff\\xfe");
        // A truncated sequence, then valid text and a control after it.
        assert_eq!(esc(b"\xe2\x82 ok\n"), "\\xe2\\x82 ok\\n");
        // An encoded surrogate and an overlong NUL are not UTF-8 either.
        assert_eq!(esc(b"\xed\xa0\x80"), "\\xed\\xa0\\x80");
        assert_eq!(esc(b"\xc0\x80"), "\\xc0\\x80");
        // Valid multi-byte text around them is kept.
        assert_eq!(esc("€\u{1b}".as_bytes()), "€\\x1b");
    }

    #[test]
    fn paths_names_and_strings_take_the_same_rule() {
        let p = Path::new("/var/cache/a\nb");
        assert_eq!(escape(p), "/var/cache/a\\nb");
        assert_eq!(escape(&p.to_path_buf()), "/var/cache/a\\nb");
        assert_eq!(escape(&String::from("x\ty")), "x\\ty");
        assert_eq!(escape(OsStr::new("\r")), "\\r");
    }

    #[test]
    fn json_of_host_paths_is_lossy_and_otherwise_serdes_own() {
        #[derive(serde::Serialize)]
        struct R {
            #[serde(serialize_with = "lossy::path")]
            p: PathBuf,
            #[serde(serialize_with = "lossy::opt_path")]
            o: Option<PathBuf>,
            #[serde(serialize_with = "lossy::opt_path")]
            none: Option<PathBuf>,
            #[serde(serialize_with = "lossy::named_paths")]
            v: Vec<(String, PathBuf)>,
        }
        let bad = PathBuf::from(OsStr::from_bytes(b"/a\xff\n\x1b"));
        let r = R {
            p: bad.clone(),
            o: Some(bad.clone()),
            none: None,
            v: vec![("n".into(), bad)],
        };
        let shown = "/a\u{fffd}\n\u{1b}";
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"p": shown, "o": shown, "none": null, "v": [["n", shown]]})
        );
        // UTF-8 paths: exactly what serde writes without the annotations.
        #[derive(serde::Serialize)]
        struct Plain {
            p: PathBuf,
            o: Option<PathBuf>,
            none: Option<PathBuf>,
            v: Vec<(String, PathBuf)>,
        }
        let (p, v) = (
            PathBuf::from("/x y/ü\\"),
            vec![("n".to_string(), PathBuf::from("/z"))],
        );
        let ours = R {
            p: p.clone(),
            o: Some(p.clone()),
            none: None,
            v: v.clone(),
        };
        let serdes = Plain {
            p: p.clone(),
            o: Some(p),
            none: None,
            v,
        };
        assert_eq!(
            serde_json::to_string(&ours).unwrap(),
            serde_json::to_string(&serdes).unwrap()
        );
    }

    #[test]
    fn output_is_one_printable_line_whatever_the_input() {
        let all: Vec<u8> = (0u8..=255).collect();
        let shown = esc(&all);
        assert!(!shown.contains(|c: char| c.is_control() || hidden(c)), "{shown}");
        assert!(!shown.contains('\n'));
        let many = "\u{1b}".repeat(10_000);
        assert_eq!(escape(&many).len(), 40_000);
    }
}
