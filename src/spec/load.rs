//! Reading a spec file: who may change it, its text, and the parse and
//! validation that make it a [`Spec`].

use std::path::{Path, PathBuf};

use super::{raw, size, validate, yaml, Paths, Spec};
use crate::error::{Diagnostic, SpecError};

/// Reads, parses and validates a spec file. Reads the host (MemTotal, users,
/// the managed paths) but never changes it.
pub fn load(file: &Path, mem_total: u64) -> Result<Spec, SpecLoadError> {
    load_with(file, mem_total, Paths::Check)
}

/// [`load`], with managed paths checked only as far as `paths` says.
pub fn load_with(file: &Path, mem_total: u64, paths: Paths) -> Result<Spec, SpecLoadError> {
    only_root_can_change(file)?;
    let text = read_text(file)?;
    parse_with(file, &text, mem_total, paths).map_err(SpecLoadError::Invalid)
}

/// Larger than any spec a person writes; a bound so that `validate /dev/zero`
/// ends.
pub(super) const MAX_SPEC_BYTES: u64 = 1 << 20;

/// Opens `file` for reading without waiting for a writer, and only if it is a
/// regular file: a spec replaced by a FIFO hung the agent's reload in `open` (no
/// writer) or in `read` (a writer that writes nothing) for good, and with it
/// every eviction and its answer to SIGTERM (hunting and review helpers' probes).
fn open_without_waiting(file: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (a FIFO or device could keep the reader waiting)",
        ));
    }
    nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()))?;
    Ok(f)
}

/// The text of a spec file: at most [`MAX_SPEC_BYTES`], UTF-8 (else an
/// error located at the first bad byte).
pub fn read_text(file: &Path) -> Result<String, SpecLoadError> {
    use std::io::Read;
    let read_err = |e| SpecLoadError::Read {
        file: file.to_path_buf(),
        source: e,
    };
    let mut bytes = Vec::new();
    open_without_waiting(file)
        .and_then(|f| f.take(MAX_SPEC_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_SPEC_BYTES {
        return Err(read_err(std::io::Error::other(format!(
            "larger than {}; a spec is a short YAML file",
            size::format_bytes(MAX_SPEC_BYTES)
        ))));
    }
    String::from_utf8(bytes).map_err(|e| {
        let bad = e.utf8_error().valid_up_to();
        let lossy = String::from_utf8_lossy(e.as_bytes()).into_owned();
        let before = &e.as_bytes()[..bad];
        let line = before.iter().filter(|b| **b == b'\n').count() as u64 + 1;
        let line_start = before.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..]).chars().count() as u64 + 1;
        SpecLoadError::Invalid(SpecError::single(
            file,
            &lossy,
            Diagnostic {
                line,
                column,
                width: 1,
                field: "(document)".into(),
                message: format!("the spec is not UTF-8 text: byte 0x{:02x}", e.as_bytes()[bad]),
                accepted: Some("a YAML file in UTF-8".into()),
            },
        ))
    })
}

/// Parses and validates spec text; `file` is only used in messages.
pub fn parse(file: &Path, text: &str, mem_total: u64) -> Result<Spec, SpecError> {
    parse_with(file, text, mem_total, Paths::Check)
}

fn parse_with(file: &Path, text: &str, mem_total: u64, paths: Paths) -> Result<Spec, SpecError> {
    let root = yaml::node_from_yaml(text).map_err(|d| SpecError::single(file, text, d))?;
    let mut diags = Vec::new();
    let raw = raw::read(text, &root, &mut diags);
    validate::validate(file, text, raw, diags, mem_total, paths)
}

/// Run as root, a spec is refused when anybody else could change it (or the
/// directories it is in): whoever can edit it makes root mount, copy and delete where
/// it says. The check follows sshd's `StrictModes` (see [`crate::host::trust`]).
pub fn only_root_can_change(file: &Path) -> Result<(), SpecLoadError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    match std::fs::symlink_metadata(file) {
        // Missing or unreadable: reading it says so.
        Err(_) => Ok(()),
        Ok(_) => crate::host::trust::only_root_can_change(file).map_err(|e| SpecLoadError::Untrusted {
            file: file.to_path_buf(),
            source: e,
        }),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecLoadError {
    #[error("cannot read spec {}: {source}", file.display())]
    Read { file: PathBuf, source: std::io::Error },
    #[error("refusing spec {}: {source}, so a user other than root could change what root runs; make it root's and not writable by group or others (chown root: FILE; chmod go-w FILE), in directories only root can change", file.display())]
    Untrusted {
        file: PathBuf,
        source: crate::host::trust::Untrusted,
    },
    #[error("{0}")]
    Invalid(SpecError),
}
