//! Quoting for the places boot artifacts put paths: systemd unit names
//! (`systemd-escape --path`), unit-file values, and fstab fields.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The unit-name form of a path, exactly as `systemd-escape --path`:
/// slashes become `-`, bytes outside `[A-Za-z0-9:_.]` (and a leading `.`)
/// become `\xNN`, and `/` alone is `-`.
pub fn unit_name_of_path(path: &Path) -> String {
    let bytes = path.as_os_str().as_bytes();
    let trimmed: Vec<&[u8]> = bytes.split(|b| *b == b'/').filter(|c| !c.is_empty()).collect();
    if trimmed.is_empty() {
        return "-".into();
    }
    let joined = trimmed.join(&b'/');
    let mut out = String::with_capacity(joined.len());
    for (i, &b) in joined.iter().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b':' | b'_' | b'.' => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// `path` as a mount unit name, e.g. `var-cache-nginx.mount`.
pub fn mount_unit(path: &Path) -> String {
    format!("{}.mount", unit_name_of_path(path))
}

/// A path in a unit file (`RequiresMountsFor=`, an `Exec*=` executable).
/// systemd splits such a value at whitespace, unquotes each word (a
/// backslash takes the next character literally) and then expands `%`
/// specifiers: so `%` is doubled, and a value with whitespace, quotes or
/// backslashes is double-quoted with `"` and `\` escaped. Control characters
/// have no spelling here; validation refuses them in every path.
pub fn unit_value(s: &str) -> String {
    let s = s.replace('%', "%%");
    if s.is_empty() || s.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '\\') {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

/// An argument in an `Exec*=` line: like `unit_value`, and `$` doubled, as
/// systemd expands `$VAR` and `${VAR}` in arguments (never in the executable).
pub fn exec_arg(s: &str) -> String {
    unit_value(&s.replace('$', "$$"))
}

/// A field of /etc/fstab: space, tab, newline and backslash as octal escapes.
/// `#` stays: only a line that starts with it is a comment (no field of ours
/// starts with it), and systemd's fstab generator does not decode `\043`.
pub fn fstab_field(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            ' ' => out.push_str("\\040"),
            '\t' => out.push_str("\\011"),
            '\n' => out.push_str("\\012"),
            '\\' => out.push_str("\\134"),
            c => out.push(c),
        }
    }
    out
}

/// A string for a POSIX shell: single quotes, with `'` spelled `'\''`.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:@,=".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_like_systemd_escape() {
        let cases = [
            ("/", "-"),
            ("/var/cache/nginx", "var-cache-nginx"),
            ("/var/cache/my-app", "var-cache-my\\x2dapp"),
            ("/srv/my cache", "srv-my\\x20cache"),
            ("/srv/.hidden", "srv-.hidden"),
            ("/.dot", "\\x2edot"),
            ("/srv/café", "srv-caf\\xc3\\xa9"),
            ("//srv//x/", "srv-x"),
        ];
        for (path, want) in cases {
            assert_eq!(unit_name_of_path(Path::new(path)), want, "{path}");
        }
        assert_eq!(
            mount_unit(Path::new("/run/tmpfsctl/lower/a")),
            "run-tmpfsctl-lower-a.mount"
        );
    }

    #[test]
    fn unit_values_quote_and_double_specifiers() {
        assert_eq!(unit_value("/var/cache/nginx"), "/var/cache/nginx");
        assert_eq!(unit_value("/srv/my cache"), "\"/srv/my cache\"");
        assert_eq!(unit_value("/srv/100%"), "/srv/100%%");
        assert_eq!(unit_value("/a\"b"), "\"/a\\\"b\"");
        assert_eq!(exec_arg("/srv/$HOME x"), "\"/srv/$$HOME x\"");
    }

    #[test]
    fn fstab_fields_escape_whitespace() {
        assert_eq!(fstab_field("/srv/my cache"), "/srv/my\\040cache");
        assert_eq!(fstab_field("/a\tb\\c#d"), "/a\\011b\\134c#d");
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("/etc/tmpfsctl/cache.yaml"), "/etc/tmpfsctl/cache.yaml");
        assert_eq!(shell_word("/etc/my spec.yaml"), "'/etc/my spec.yaml'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
