//! Typed identifiers. Each wraps a string with a private field and can only be built through
//! `parse` (or `FromStr`), so a value of these types has already been checked at the edge.
//!
//! This module must not know about HTTP, Redis or Slack payload shapes.
use std::fmt;
use std::str::FromStr;

/// Why a string was refused as an identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {value:?} is not valid: {reason}.")]
pub struct IdError {
    pub kind: &'static str,
    pub value: String,
    pub reason: &'static str,
}

/// Longest id we accept. E2B ids are ~20 characters; snapshot ids (`team/name:tag`) are longer.
const MAX_ID_LEN: usize = 200;

fn check(kind: &'static str, value: &str, extra_ok: &[char]) -> Result<(), IdError> {
    let fail = |reason| {
        Err(IdError {
            kind,
            value: value.chars().take(MAX_ID_LEN).collect(),
            reason,
        })
    };
    if value.is_empty() {
        return fail("it is empty");
    }
    if value.len() > MAX_ID_LEN {
        return fail("it is too long");
    }
    let ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || extra_ok.contains(&c));
    if !ok {
        return fail("it has characters other than letters, digits, '-' and '_'");
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal, $extra:expr) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Checks `value` and wraps it.
            pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                let trimmed = value.trim();
                check($kind, trimmed, $extra)?;
                Ok(Self(trimmed.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// An E2B sandbox id, e.g. `i1a2b3c4d5e6f7g8h9`. The legacy `<id>-<clientID>` form is accepted.
    SandboxId,
    "sandbox id",
    &[]
);
string_id!(
    /// An E2B template id or snapshot id (`team-slug/name:tag` for snapshots).
    TemplateId,
    "template id",
    &['/', ':', '.']
);
string_id!(
    /// A build of a template.
    BuildId,
    "build id",
    &[]
);
string_id!(
    /// A Slack user id such as `U2147483697`.
    SlackUserId,
    "Slack user id",
    &[]
);
string_id!(
    /// A Slack user group id such as `S0614TZR7` (approver groups in `steward.toml`).
    SlackUserGroupId,
    "Slack user group id",
    &[]
);
string_id!(
    /// A Slack channel id such as `C2147483705`.
    SlackChannelId,
    "Slack channel id",
    &[]
);
string_id!(
    /// An approval case, e.g. `case_01J...`.
    CaseId,
    "case id",
    &[]
);

impl CaseId {
    /// A fresh, unique case id.
    pub fn generate() -> Self {
        Self(format!("case_{}", uuid::Uuid::new_v4().simple()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_accept_e2b_shapes_and_refuse_junk() {
        assert!(SandboxId::parse("i1a2b3c4d5e6f7g8h9").is_ok());
        assert!(SandboxId::parse("sbx-1-client").is_ok());
        assert_eq!(SandboxId::parse("  abc  ").unwrap().as_str(), "abc");
        assert!(SandboxId::parse("").is_err());
        assert!(SandboxId::parse("a/b").is_err());
        assert!(SandboxId::parse("a b").is_err());
        assert!(SandboxId::parse("x".repeat(201)).is_err());
    }

    #[test]
    fn template_ids_accept_snapshot_names() {
        assert!(TemplateId::parse("team-slug/my-snap:default").is_ok());
        assert!(TemplateId::parse("base").is_ok());
        assert!(TemplateId::parse("base?x").is_err());
    }

    #[test]
    fn generated_case_ids_parse_back() {
        let id = CaseId::generate();
        assert_eq!(CaseId::parse(id.as_str()).unwrap(), id);
    }
}
string_id!(
    /// A sweep's list decision, e.g. `list_3f2a...` (see `cases::list`).
    ListId,
    "list id",
    &[]
);

impl ListId {
    /// A fresh, unique list id.
    pub fn generate() -> Self {
        Self(format!("list_{}", uuid::Uuid::new_v4().simple()))
    }
}

string_id!(
    /// A governed run, e.g. `run_3f2a...` (see `runs`).
    RunId,
    "run id",
    &[]
);
