//! The write-back's temporaries: the names reserved for them, and entries made under
//! such a name in their final directory, to be put in place when complete.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::os::fd::BorrowedFd;

use nix::fcntl::{self, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{self, UnlinkatFlags};

use super::error::{dst_err, Failed};

/// The write-back's temporaries are named this and 16 lowercase hex digits, the
/// change tracker's barriers this and `barrier.NONCE.SECS.NANOS` in decimal
/// (`barrier.PID` before): skipped in the source, removed from the destination.
pub const TEMP_PREFIX: &str = ".tmpfsctl-wb.";

/// Whether `name` is of the exact form of a temporary or a barrier. Any other name,
/// one that merely starts with [`TEMP_PREFIX`] among them, is the application's
/// (a review helper's probe: `.tmpfsctl-wb.appdir/` and what it held were never
/// seeded, and deleted on disk by the first write-back).
pub(super) fn is_temp(name: &CStr) -> bool {
    let Some(rest) = name.to_bytes().strip_prefix(TEMP_PREFIX.as_bytes()) else {
        return false;
    };
    let decimals = |b: &[u8]| {
        let mut parts = 0;
        b.split(|c| *c == b'.').all(|p| {
            parts += 1;
            !p.is_empty() && p.iter().all(u8::is_ascii_digit)
        }) && (parts == 3 || parts == 1)
    };
    is_hex16(rest) || rest.strip_prefix(b"barrier.").is_some_and(decimals)
}

/// 16 lowercase hex digits: the random part of a name of tmpfsctl's own.
pub fn is_hex16(b: &[u8]) -> bool {
    b.len() == 16 && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// Creates an entry under a fresh temporary name, trying another name if one is taken
/// (by a planted entry, say).
pub(super) fn create_temp<'d, T>(
    temps: &mut TempNames,
    dir: BorrowedFd<'d>,
    mut create: impl FnMut(BorrowedFd<'d>, &CStr) -> Result<T, Failed>,
) -> Result<(Temp<'d>, T), Failed> {
    let mut attempts = 0;
    loop {
        let name = temps.next();
        match create(dir, &name) {
            Ok(made) => {
                return Ok((
                    Temp {
                        dir,
                        name,
                        live: true,
                    },
                    made,
                ))
            }
            Err(f) if f.errno() == Some(libc::EEXIST) && attempts < 8 => attempts += 1,
            Err(f) => return Err(f),
        }
    }
}

/// A new empty regular file under a fresh temporary name in `dir`, open for writing;
/// only its owner may open it until its metadata is set.
pub(super) fn create_temp_file<'d>(
    temps: &mut TempNames,
    dir: BorrowedFd<'d>,
) -> Result<(Temp<'d>, File), Failed> {
    let (temp, fd) = create_temp(temps, dir, |dir, temp| {
        fcntl::openat(
            dir,
            temp,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )
        .map_err(dst_err("create file"))
    })?;
    Ok((temp, File::from(fd)))
}

/// A temporary entry in a destination directory, unlinked on drop unless it was put
/// in place.
pub(super) struct Temp<'d> {
    pub(super) dir: BorrowedFd<'d>,
    pub(super) name: CString,
    pub(super) live: bool,
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if self.live {
            // Best effort: the next sync removes what is left.
            let _ = unistd::unlinkat(self.dir, self.name.as_c_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// `TEMP_PREFIX` + 16 hex digits, from a random seed and a counter through a bijective
/// mixer, so names neither repeat within a run nor are predictable across runs.
pub(super) struct TempNames {
    seed: u64,
    counter: u64,
}

impl TempNames {
    pub(super) fn new() -> Self {
        // std seeds every `RandomState` from the kernel's random source once per
        // thread and makes each one differ after that: what the seed needs.
        let seed = RandomState::new().build_hasher().finish();
        TempNames { seed, counter: 0 }
    }

    pub(super) fn next(&mut self) -> CString {
        self.counter += 1;
        let mut z = self
            .seed
            .wrapping_add(self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        CString::new(format!("{TEMP_PREFIX}{z:016x}")).expect("no NUL in a hex name")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn reserved_names_are_recognised_by_their_exact_form_only() {
        assert!(is_temp(c".tmpfsctl-wb.0123456789abcdef"));
        assert!(is_temp(c".tmpfsctl-wb.barrier.42.1700000000.5"));
        assert!(
            is_temp(c".tmpfsctl-wb.barrier.4242"),
            "an older tmpfsctl's barrier"
        );
        for theirs in [
            c".tmpfsctl-wb.x",
            c".tmpfsctl-wb.",
            c".tmpfsctl-wb",
            c"x.tmpfsctl-wb.y",
            c".tmpfsctl-wb.appdir",
            c".tmpfsctl-wb.0123456789abcde",
            c".tmpfsctl-wb.0123456789abcdef0",
            c".tmpfsctl-wb.0123456789ABCDEF",
            c".tmpfsctl-wb.barrier.",
            c".tmpfsctl-wb.barrier.42.1700000000",
            c".tmpfsctl-wb.barrier.42.1.2.3",
            c".tmpfsctl-wb.barrier.x.1.2",
            c".tmpfsctl-wb.barrier.42..5",
        ] {
            assert!(!is_temp(theirs), "{theirs:?} is the application's");
        }
    }

    #[test]
    fn temporary_names_are_reserved_unique_and_unpredictable() {
        let mut names = TempNames::new();
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let n = names.next();
            let bytes = n.to_bytes();
            assert!(is_temp(&n));
            let hex = &bytes[TEMP_PREFIX.len()..];
            assert_eq!(hex.len(), 16);
            assert!(hex.iter().all(u8::is_ascii_hexdigit));
            assert!(seen.insert(n));
        }
        assert_ne!(TempNames::new().next(), TempNames::new().next());
    }
}
