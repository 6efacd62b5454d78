//! Size arguments in the field's convention: plain bytes or a k/m/g/t/p suffix (powers of
//! 1024), case-insensitive, as xfs_io and mkfs accept them.

/// Parses `s` into bytes.
///
/// # Errors
/// A sentence naming the bad input.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16)
            .map_err(|_| format!("bad size {s:?}: not a hexadecimal number"));
    }
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'b' if i > 0 && t[..i].ends_with(|d: char| d.is_ascii_alphabetic()) => {
                    return parse_size(&t[..i])
                }
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                'p' => 1 << 50,
                _ => {
                    return Err(format!(
                        "bad size {s:?}: unknown suffix '{c}' (use k, m, g, t or p)"
                    ))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = if let Some(hex) = num.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).map_err(|_| format!("bad size {s:?}"))?
    } else {
        num.parse().map_err(|_| {
            format!("bad size {s:?}: expected a number with an optional k/m/g/t/p suffix")
        })?
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// Formats bytes the way xfs_io does ("4 KiB", "1.500 MiB").
#[must_use]
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{} {}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.3} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1KB").unwrap(), 1024);
        assert_eq!(parse_size("0x10").unwrap(), 16);
        assert_eq!(
            parse_size("0x5a").unwrap(),
            0x5a,
            "hex digits are not suffixes"
        );
        assert!(parse_size("0xzz").is_err());
        assert!(parse_size("12q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999p").is_err());
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(1536 * 1024), "1.500 MiB");
    }
}
