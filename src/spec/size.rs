//! Size and count literals of the spec: `512MiB`, `512M`, `1G`, `10%`, `200k`.
//!
//! Binary multiples throughout, as in tmpfs's own `size=` and `nr_inodes=`
//! options (the kernel's memparse), so an operator's `mount -o size=512m`
//! habit carries over unchanged.

/// What a size literal means before RAM is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeLit {
    Bytes(u64),
    /// Percentage of MemTotal, as in tmpfs `size=10%`.
    Percent(f64),
}

impl SizeLit {
    pub fn resolve(self, mem_total: u64) -> u64 {
        match self {
            SizeLit::Bytes(b) => b,
            SizeLit::Percent(p) => (mem_total as f64 * p / 100.0) as u64,
        }
    }
}

/// The largest size in bytes (1024TiB): far above any RAM, and small enough
/// that sums, page rounding and growth of sizes never overflow (the kernel's
/// own `size=` rounding wraps near 2^64 and would mean "unlimited").
const MAX_BYTES: u64 = 1 << 50;

/// The largest inode count (1024g): the kernel refuses `nr_inodes` above
/// ULONG_MAX/1024; a tmpfs this large would need terabytes for its inodes.
const MAX_COUNT: u64 = 1 << 40;

pub const SIZE_ACCEPTED: &str =
    "a whole number with an optional binary unit (B, k/K/KiB, M/MiB, G/GiB, T/TiB) up to 1024TiB, e.g. 512MiB, or a percentage of RAM such as 10%";

pub const COUNT_ACCEPTED: &str =
    "a whole number with an optional binary multiple k/m/g (as tmpfs nr_inodes) up to 1024g, e.g. 200k";

fn unit_multiplier(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "B" | "b" => 1,
        "k" | "K" | "KiB" | "kiB" => 1 << 10,
        "m" | "M" | "MiB" => 1 << 20,
        "g" | "G" | "GiB" => 1 << 30,
        "t" | "T" | "TiB" => 1 << 40,
        _ => return None,
    })
}

/// Parses a size. Errors carry a hint that names what went wrong.
pub fn parse_size(text: &str) -> Result<SizeLit, String> {
    let s = text.trim();
    if let Some(pct) = s.strip_suffix('%') {
        let p: f64 = pct
            .trim()
            .parse()
            .map_err(|_| format!("`{pct}` is not a number"))?;
        if !(p > 0.0 && p <= 100.0 && p.is_finite()) {
            return Err("a percentage must be above 0% and at most 100%".into());
        }
        return Ok(SizeLit::Percent(p));
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let unit = unit.trim_start();
    if digits.is_empty() {
        return Err("expected a number".into());
    }
    let mult = match unit_multiplier(unit) {
        Some(m) => m,
        None if matches!(unit, "kB" | "KB" | "MB" | "GB" | "TB") => {
            return Err(format!(
                "`{unit}` is ambiguous (decimal or binary?); write {}iB",
                &unit[..1].to_uppercase()
            ))
        }
        None => return Err(format!("unknown unit `{unit}`")),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|b| *b <= MAX_BYTES)
        .ok_or_else(|| "larger than 1024TiB".to_string())?;
    if bytes == 0 {
        return Err("size 0 would mean an unlimited tmpfs; give a limit".into());
    }
    Ok(SizeLit::Bytes(bytes))
}

/// Parses an inode count (`200k` = 204800, like the kernel's nr_inodes=200k).
pub fn parse_count(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err("expected a number".into());
    }
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        "g" | "G" => 1 << 30,
        _ => return Err(format!("unknown multiple `{unit}`")),
    };
    let count = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|c| *c <= MAX_COUNT)
        .ok_or_else(|| "larger than 1024g".to_string())?;
    if count == 0 {
        return Err("0 would mean unlimited inodes; give a limit or leave the field out".into());
    }
    Ok(count)
}

/// Human-readable binary size, exact where it can be (`512MiB`, `1.5GiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else if value.fract() == 0.0 {
        format!("{value:.0}{}", UNITS[unit])
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        let cases = [
            ("1", 1),
            ("4096", 4096),
            ("4096B", 4096),
            ("1k", 1024),
            ("1K", 1024),
            ("1KiB", 1024),
            ("512M", 512 << 20),
            ("512m", 512 << 20),
            ("512MiB", 512 << 20),
            ("512 MiB", 512 << 20),
            ("1G", 1 << 30),
            ("2GiB", 2 << 30),
            ("1T", 1 << 40),
            (" 3TiB ", 3 << 40),
            ("1024TiB", MAX_BYTES),
            ("1125899906842624", MAX_BYTES),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(SizeLit::Bytes(want)), "{text}");
        }
    }

    #[test]
    fn percent_sizes_resolve_against_ram() {
        assert_eq!(parse_size("10%"), Ok(SizeLit::Percent(10.0)));
        assert_eq!(parse_size("12.5%").unwrap().resolve(800), 100);
        assert_eq!(parse_size("100%").unwrap().resolve(1 << 30), 1 << 30);
    }

    #[test]
    fn bad_sizes_say_why() {
        let cases = [
            ("", "expected a number"),
            ("MiB", "expected a number"),
            ("0", "unlimited"),
            ("0G", "unlimited"),
            ("512MB", "ambiguous"),
            ("1GB", "ambiguous"),
            ("12 parsecs", "unknown unit `parsecs`"),
            ("1.5G", "unknown unit `.5G`"),
            ("-1G", "expected a number"),
            ("0%", "above 0%"),
            ("150%", "at most 100%"),
            ("x%", "not a number"),
            ("99999999999999999999", "larger than 1024TiB"),
            ("99999999999T", "larger than 1024TiB"),
            ("1025T", "larger than 1024TiB"),
            ("1125899906842625", "larger than 1024TiB"),
        ];
        for (text, want) in cases {
            let err = parse_size(text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err:?} lacks {want:?}");
        }
    }

    #[test]
    fn counts_use_binary_multiples_like_the_kernel() {
        assert_eq!(parse_count("200k"), Ok(204_800));
        assert_eq!(parse_count("1m"), Ok(1 << 20));
        assert_eq!(parse_count("1G"), Ok(1 << 30));
        assert_eq!(parse_count("5000"), Ok(5000));
        assert!(parse_count("0").unwrap_err().contains("unlimited"));
        assert!(parse_count("12x").unwrap_err().contains("`x`"));
        assert!(parse_count("k").unwrap_err().contains("expected a number"));
        assert_eq!(parse_count("1024g"), Ok(MAX_COUNT));
        assert!(parse_count("1025g").unwrap_err().contains("larger than 1024g"));
        assert!(parse_count("99999999999999999999")
            .unwrap_err()
            .contains("larger"));
    }

    #[test]
    fn formats_exact_and_fractional() {
        assert_eq!(format_bytes(0), "0B");
        assert_eq!(format_bytes(1023), "1023B");
        assert_eq!(format_bytes(512 << 20), "512MiB");
        assert_eq!(format_bytes(3 << 29), "1.5GiB");
        assert_eq!(format_bytes(1 << 40), "1TiB");
    }
}
