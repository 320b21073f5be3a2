//! Under `CI` a test may neither pass by skipping nor rewrite what it checks
//! against: a green run there has to mean that everything was checked.

/// Whether the `CI` environment variable is set (`.ci/run` sets it).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// A part of a test that cannot run for want of `what`: fails under CI,
/// otherwise says what was left out. `install` tells how to get it.
pub fn missing(what: &str, install: &str) {
    assert!(!in_ci(), "{what} is required when CI is set ({install})");
    eprintln!("{what} is missing ({install}): that part of the test is skipped");
}

/// Whether `TMPFSCTL_BLESS` asks to rewrite the golden files. Refused under
/// CI, where blessing would make any output pass.
pub fn blessing() -> bool {
    let bless = std::env::var_os("TMPFSCTL_BLESS").is_some();
    assert!(
        !(bless && in_ci()),
        "TMPFSCTL_BLESS is refused when CI is set: bless locally and commit the golden files"
    );
    bless
}
