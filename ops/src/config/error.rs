//! Why a configuration cannot be used, said with its key, value and what is wrong.

use std::path::Path;

pub(crate) fn bad(key: &str, value: impl std::fmt::Display, problem: &str) -> ConfigError {
    ConfigError::Value { key: key.to_string(), value: value.to_string(), problem: problem.to_string() }
}

/// Why a configuration cannot be used: the file, the key or the section, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A key's value: the key's place in the file (`attach[0].server`), the value as given,
    /// what is wrong with it.
    #[error("{key} = {value}: {problem}")]
    Value {
        /// The key.
        key: String,
        /// Its value, as the file gives it.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A section or key missing, or two given that exclude each other.
    #[error("{at}: {problem}")]
    Section {
        /// Where (`pool`, `attach[1]`).
        at: String,
        /// What is wrong.
        problem: String,
    },
    /// `[pool]` as the pool itself checks it (its key and what is wrong).
    #[error("pool.{0}")]
    Pool(String),
    /// The file itself: it cannot be read, is too long, is not UTF-8, is not this TOML.
    #[error("{path}: {problem}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

impl ConfigError {
    pub(crate) fn section(at: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Section { at: at.into(), problem: problem.into() }
    }
    pub(crate) fn file(path: &Path, problem: impl std::fmt::Display) -> ConfigError {
        ConfigError::File { path: path.display().to_string(), problem: problem.to_string() }
    }
}

/// For the run times' errors, which are text.
impl From<ConfigError> for String {
    fn from(e: ConfigError) -> String {
        e.to_string()
    }
}
