//! `EnvdVersion`: the version of envd a sandbox runs, as E2B announces it (`envdVersion` in the
//! create and connect answers), and what it decides about how to speak to that envd.
//!
//! The SDKs compare it with `packaging.version.Version` against fixed thresholds
//! (`e2b/envd/versions.py`); this type does the same for the one Steward needs: uploads go as
//! `application/octet-stream` from [`OCTET_STREAM_UPLOAD`] on, as `multipart/form-data` before.
//! Pure: no I/O, no knowledge of HTTP.
use std::fmt;

/// The first envd that reads an upload sent as `application/octet-stream` (the SDKs'
/// `ENVD_OCTET_STREAM_UPLOAD`); older ones read only `multipart/form-data`.
pub const OCTET_STREAM_UPLOAD: EnvdVersion = EnvdVersion::new(0, 5, 7);

/// An envd version: `major.minor.patch`, and whether it is a pre-release of that (which comes
/// before it, as `0.5.7rc1 < 0.5.7` for the SDKs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EnvdVersion {
    major: u64,
    minor: u64,
    patch: u64,
    /// `false` for a pre-release, so it orders before the release of the same numbers.
    release: bool,
}

impl EnvdVersion {
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self {
            major,
            minor,
            patch,
            release: true,
        }
    }

    /// Reads a version such as `0.4.1`, `v0.5.7`, `0.2` or `0.6.0-beta.1`; an error says why
    /// the text is not one.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let body = trimmed
            .strip_prefix('v')
            .or_else(|| trimmed.strip_prefix('V'))
            .unwrap_or(trimmed);
        let numeric_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (numbers, suffix) = body.split_at(numeric_end);
        let numbers = numbers.trim_end_matches('.');
        let parts: Vec<&str> = numbers.split('.').collect();
        if numbers.is_empty() || parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
            return Err(format!("{text:?} is not an envd version such as 0.5.7"));
        }
        let number = |i: usize| -> Result<u64, String> {
            parts.get(i).map_or(Ok(0), |p| {
                p.parse()
                    .map_err(|_| format!("{text:?} is not an envd version such as 0.5.7"))
            })
        };
        // A local or post-release label (`+build`, `.post1`) is the release; anything else after
        // the numbers (`-beta`, `rc1`, `.dev0`) is a pre-release of it.
        let suffix = suffix.to_ascii_lowercase();
        let release = suffix.is_empty() || suffix.starts_with('+') || suffix.starts_with("post");
        Ok(Self {
            major: number(0)?,
            minor: number(1)?,
            patch: number(2)?,
            release,
        })
    }

    /// The version E2B announced for a sandbox. One that cannot be read counts as the oldest
    /// envd, so Steward speaks what every envd understands rather than guessing it is new.
    pub fn announced(text: &str) -> Self {
        Self::parse(text).unwrap_or(Self::new(0, 0, 0))
    }

    /// Whether this envd reads uploads sent as `application/octet-stream`.
    pub fn takes_octet_stream(self) -> bool {
        self >= OCTET_STREAM_UPLOAD
    }
}

impl fmt::Display for EnvdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.release {
            f.write_str(" (pre-release)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_the_sdks_read_them() {
        assert_eq!(EnvdVersion::parse("0.4.1"), Ok(EnvdVersion::new(0, 4, 1)));
        assert_eq!(EnvdVersion::parse("v0.5.7"), Ok(EnvdVersion::new(0, 5, 7)));
        assert_eq!(EnvdVersion::parse(" 0.2 "), Ok(EnvdVersion::new(0, 2, 0)));
        assert_eq!(
            EnvdVersion::parse("0.5.7+build.3"),
            Ok(EnvdVersion::new(0, 5, 7))
        );
        assert!(EnvdVersion::parse("0.5.7-rc1").unwrap() < EnvdVersion::new(0, 5, 7));
        assert!(EnvdVersion::parse("0.5.7rc1").unwrap() > EnvdVersion::new(0, 5, 6));
        assert!(EnvdVersion::parse("").is_err());
        assert!(EnvdVersion::parse("latest").is_err());
        assert!(EnvdVersion::parse("1.2.3.4").is_err());
        assert!(EnvdVersion::parse("1..2").is_err());
    }

    #[test]
    fn octet_stream_uploads_start_at_0_5_7_as_in_the_sdks() {
        assert!(!EnvdVersion::announced("0.4.1").takes_octet_stream());
        assert!(!EnvdVersion::announced("0.5.6").takes_octet_stream());
        assert!(!EnvdVersion::announced("0.5.7-beta").takes_octet_stream());
        assert!(EnvdVersion::announced("0.5.7").takes_octet_stream());
        assert!(EnvdVersion::announced("0.10.0").takes_octet_stream());
        assert!(EnvdVersion::announced("1.0.0").takes_octet_stream());
        // Unreadable: the encoding every envd reads.
        assert!(!EnvdVersion::announced("garbage").takes_octet_stream());
    }
}
