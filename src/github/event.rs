//! The parts of GitHub's `push` payload a push test uses. Unknown fields are ignored (GitHub
//! sends many); missing optional ones are `None`.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PushEvent {
    #[serde(rename = "ref")]
    pub git_ref: String,
    #[serde(default)]
    pub before: String,
    pub after: String,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub compare: Option<String>,
    pub repository: Repository,
    #[serde(default)]
    pub pusher: Option<Pusher>,
    #[serde(default)]
    pub sender: Option<Sender>,
    #[serde(default)]
    pub commits: Vec<Commit>,
    #[serde(default)]
    pub head_commit: Option<Commit>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Repository {
    /// `owner/name`.
    pub full_name: String,
    #[serde(default)]
    pub clone_url: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pusher {
    /// The pusher's login.
    pub name: String,
    #[serde(default)]
    pub email: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sender {
    pub login: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Commit {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    /// When the commit was made (ISO 8601 with an offset, as GitHub sends it).
    #[serde(default)]
    pub timestamp: Option<String>,
    #[serde(default)]
    pub author: Option<Person>,
    #[serde(default)]
    pub added: Vec<String>,
    #[serde(default)]
    pub modified: Vec<String>,
    #[serde(default)]
    pub removed: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Person {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
}

/// Reads a push payload; the error is a sentence naming what is wrong.
pub fn parse_push(body: &[u8]) -> Result<PushEvent, String> {
    serde_json::from_slice(body).map_err(|e| format!("The push payload could not be read: {e}."))
}

impl PushEvent {
    /// The branch pushed to, or `None` for tags and other refs.
    pub fn branch(&self) -> Option<&str> {
        self.git_ref.strip_prefix("refs/heads/")
    }

    /// When the head commit was made, if the payload says so in a form we can read.
    pub fn committed_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let text = self.head_commit.as_ref()?.timestamp.as_deref()?;
        chrono::DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc))
    }

    /// Every path the push's commits added, modified or removed.
    pub fn changed_paths(&self) -> impl Iterator<Item = &str> {
        self.commits.iter().flat_map(|c| {
            c.added
                .iter()
                .chain(&c.modified)
                .chain(&c.removed)
                .map(String::as_str)
        })
    }
}
