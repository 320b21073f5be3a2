//! Counted nouns in messages: `1 mount`, `2 mounts`.

use std::fmt::Display;

/// `n` followed by `one` or `many`, whichever the number takes.
pub fn count<N: Copy + Display + PartialEq + From<u8>>(n: N, one: &str, many: &str) -> String {
    if n == N::from(1) {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// `one` when `n` is 1, else `many`: for the verb or pronoun that agrees
/// with a count (`1 file was kept`, `2 files were kept`).
pub fn agree<'a, N: PartialEq + From<u8>>(n: N, one: &'a str, many: &'a str) -> &'a str {
    if n == N::from(1) {
        one
    } else {
        many
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_everything_else_plural() {
        assert_eq!(count(1usize, "mount", "mounts"), "1 mount");
        assert_eq!(count(0u64, "mount", "mounts"), "0 mounts");
        assert_eq!(count(2u32, "entry", "entries"), "2 entries");
        assert_eq!(agree(1u64, "was", "were"), "was");
        assert_eq!(agree(3usize, "was", "were"), "were");
    }
}
