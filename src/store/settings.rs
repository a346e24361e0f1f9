//! Redis settings, plain data: `config` reads them from the environment.
use secrecy::SecretString;

/// Settings for Redis.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// The URL may carry a password, so it is a secret.
    pub url: SecretString,
    /// Every key starts with this prefix.
    pub key_prefix: String,
}
