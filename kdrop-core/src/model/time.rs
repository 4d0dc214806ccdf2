//! Timestamps as records carry them.

/// RFC 3339 UTC with microseconds, from nanoseconds since the epoch.
pub fn rfc3339(epoch_ns: u64) -> String {
    let secs = epoch_ns / 1_000_000_000;
    let micros = (epoch_ns % 1_000_000_000) / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    // By hand, not format!: a flood writes one per record (#29). u64
    // nanoseconds end in 2554: four digits of year always do.
    let mut b = *b"0000-00-00T00:00:00.000000Z";
    digits(&mut b[0..4], y as u64);
    digits(&mut b[5..7], u64::from(m));
    digits(&mut b[8..10], u64::from(d));
    digits(&mut b[11..13], rem / 3600);
    digits(&mut b[14..16], rem % 3600 / 60);
    digits(&mut b[17..19], rem % 60);
    digits(&mut b[20..26], micros);
    b.iter().map(|&c| char::from(c)).collect()
}

/// `v`'s last `out.len()` decimal digits, zero-padded.
fn digits(out: &mut [u8], mut v: u64) {
    for c in out.iter_mut().rev() {
        *c = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Microseconds since the epoch of a timestamp `rfc3339` wrote; `None` for
/// any other text. The text output's repeat window runs on it: the time a
/// record says, not when it was printed, so a replay folds the same lines.
pub fn epoch_micros(ts: &str) -> Option<u64> {
    let b = ts.as_bytes();
    let shape = b.len() == 27
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            26 => *c == b'Z',
            _ => c.is_ascii_digit(),
        });
    if !shape {
        return None;
    }
    let num = |from: usize, to: usize| ts[from..to].parse::<u64>().ok();
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, min, s, micros) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 26)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 || min > 59 || s > 59 {
        return None;
    }
    let days = u64::try_from(days_from_civil(y as i64, m as u32, d as u32)).ok()?;
    Some(((days * 86_400 + h * 3600 + min * 60 + s) * 1_000_000) + micros)
}

/// Howard Hinnant's civil-to-days algorithm, `civil_from_days`' inverse.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(951_782_400_000_001_000),
            "2000-02-29T00:00:00.000001Z"
        );
        assert_eq!(
            rfc3339(1_795_240_987_123_456_789),
            "2026-11-21T06:03:07.123456Z"
        );
    }

    /// The digits by hand are what `format!` wrote before them, over
    /// 1970 to 2554 in uneven steps.
    #[test]
    fn timestamps_as_format_wrote_them() {
        let reference = |ns: u64| {
            let (secs, micros) = (ns / 1_000_000_000, ns % 1_000_000_000 / 1000);
            let (days, rem) = (secs / 86_400, secs % 86_400);
            let (y, m, d) = civil_from_days(days as i64);
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
                rem / 3600,
                rem % 3600 / 60,
                rem % 60
            )
        };
        let mut ns = 0u64;
        while let Some(next) = ns.checked_add(987_654_321_987_654_321 / 3_001) {
            assert_eq!(rfc3339(ns), reference(ns), "{ns}");
            ns = next;
        }
        assert_eq!(rfc3339(u64::MAX), reference(u64::MAX));
    }

    #[test]
    fn timestamps_read_back() {
        for ns in [
            0,
            951_782_400_000_001_000,
            951_868_799_999_999_000,
            1_795_240_987_123_456_000,
            4_102_444_800_000_000_000,
        ] {
            assert_eq!(epoch_micros(&rfc3339(ns)), Some(ns / 1000), "{ns}");
        }
        for bad in [
            "",
            "2026-11-21 06:03:07.123456Z",
            "2026-13-21T06:03:07.123456Z",
            "2026-11-21T24:03:07.123456Z",
            "2026-11-21T06:03:07.12345+Z",
            "1969-12-31T23:59:59.999999Z",
            "2026-11-21T06:03:07.123456",
        ] {
            assert_eq!(epoch_micros(bad), None, "{bad}");
        }
    }
}
