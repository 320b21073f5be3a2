//! Durations as a spec and the command line write them: `15m`, `1h30m`, `250ms`.

/// `90s`, `15m`, `2h`, `1d`, or combinations like `1h30m`.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let mut total: u64 = 0;
    let mut num = String::new();
    if text.is_empty() {
        return Err("missing duration".into());
    }
    for c in text.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let mult = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(format!("unknown duration unit `{c}`")),
        };
        let n: u64 = num
            .parse()
            .map_err(|_| format!("`{c}` needs a number before it"))?;
        total = n
            .checked_mul(mult)
            .and_then(|x| total.checked_add(x))
            .ok_or("duration too long")?;
        num.clear();
    }
    if !num.is_empty() {
        return Err(format!("`{num}` needs a unit (s, m, h or d)"));
    }
    Ok(total)
}

/// `90s`, `250ms`, `1m30s`: a duration in milliseconds (units ms, s, m, h, d).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("missing duration".into());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (num, after) = rest.split_at(digits);
        let unit_len = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let mult: u64 = match unit {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(format!("`{num}` needs a unit (ms, s, m, h or d)")),
            other => return Err(format!("unknown duration unit `{other}`")),
        };
        if num.is_empty() {
            return Err(format!("`{unit}` needs a number before it"));
        }
        let n: u64 = num.parse().map_err(|_| "duration too long".to_string())?;
        total = n
            .checked_mul(mult)
            .and_then(|x| total.checked_add(x))
            .ok_or("duration too long")?;
        rest = next;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("1d"), Ok(86400));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert!(parse_duration("15").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("m").unwrap_err().contains("needs a number"));
        assert!(parse_duration("5w").unwrap_err().contains("unit `w`"));
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn durations_in_milliseconds() {
        assert_eq!(parse_duration_ms("1s"), Ok(1000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1m30s"), Ok(90_000));
        assert_eq!(parse_duration_ms("1s500ms"), Ok(1500));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert!(parse_duration_ms("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration_ms("ms").unwrap_err().contains("needs a number"));
        assert!(parse_duration_ms("3w").unwrap_err().contains("unit `w`"));
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("99999999999999999999d").is_err());
    }
}
