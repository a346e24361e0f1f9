//! Human durations (`90s`, `10m`, `2h`, `1d`, a bare number of seconds), shared by the settings, the
//! policy file and the `/sandbox` command language. A leaf: it imports nothing of ours.
use std::time::Duration;

/// The longest duration any setting or command accepts (100 years). Anything longer is a typo,
/// and adding it to a date could leave the range of dates Steward can represent.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600); // 100 × 365.25 days

/// Longest refresh E2B accepts (one hour). The command language and the E2B client both check it.
pub const MAX_REFRESH_SECS: u64 = 3600;

/// A value that is not a duration Steward accepts, with the setting's name for the sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} is not valid: {reason}")]
pub struct InvalidDuration {
    pub name: String,
    pub reason: String,
}

/// Parses `90s`, `10m`, `2h`, `1d` or a bare number of seconds, up to [`MAX_DURATION`].
pub fn parse(name: &str, value: &str) -> Result<Duration, InvalidDuration> {
    let value = value.trim();
    let parsed = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(value).map_err(|e| InvalidDuration {
            name: name.to_owned(),
            reason: format!("{value:?} is not a duration like 90s, 10m or 2h ({e})"),
        })?,
    };
    if parsed > MAX_DURATION {
        return Err(InvalidDuration {
            name: name.to_owned(),
            reason: format!("{value:?} is longer than 100 years, the most Steward accepts"),
        });
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_human_units() {
        assert_eq!(parse("x", "90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("x", "10m").unwrap(), Duration::from_secs(600));
        assert!(parse("x", "soon").is_err());
        assert!(parse("x", "100y").is_ok());
        let err = parse("approvals.decide_within", "100000y").unwrap_err();
        assert!(err.to_string().contains("longer than 100 years"), "{err}");
        assert!(parse("x", &u64::MAX.to_string()).is_err());
    }
}
