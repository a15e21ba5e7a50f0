//! Named API tokens and their scopes (SPEC §8), and the tokens file they are read from.
//!
//! A tokens file (`--api-tokens-file`) has one token per line: `name scope[,scope] token`, with
//! blank lines and `#` comments allowed. The name is who the audit events say acted, and the
//! scope of the client's idempotency keys; the scopes say what it may do:
//!
//! | scope | routes |
//! |---|---|
//! | `read` | every `GET` under `/v1`, and `/metrics` |
//! | `start` | start a saga, send it a signal, cancel it |
//! | `operate` | abort, retry, mark a step compensated |
//! | `admin` | everything |
//!
//! A bad line stops the server before it listens, with an error naming the line.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Read sagas, events, deliveries, definitions and metrics.
    Read,
    /// Start sagas, send them signals, cancel them.
    Start,
    /// Abort, retry, mark compensated: the operator commands.
    Operate,
    /// Everything.
    Admin,
}

impl Scope {
    /// Every scope, in the order the tokens file documents them.
    pub const ALL: [Self; 4] = [Self::Read, Self::Start, Self::Operate, Self::Admin];

    /// As written in the tokens file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Start => "start",
            Self::Operate => "operate",
            Self::Admin => "admin",
        }
    }

    /// The scope named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named token with its scopes. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Who presents it: the actor of audit events and the scope of idempotency keys.
    pub name: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// The bearer token itself.
    pub secret: String,
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiToken")
            .field("name", &self.name)
            .field("scopes", &self.scopes)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl ApiToken {
    /// A token named `name` with `scopes`.
    pub fn new(name: impl Into<String>, scopes: &[Scope], secret: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            scopes: scopes.to_vec(),
            secret: secret.into(),
        }
    }

    /// Whether it may do what `scope` covers.
    pub fn allows(&self, scope: Scope) -> bool {
        grants(&self.scopes, scope)
    }
}

/// Whether `scopes` include `needed`, or `admin`, which includes every scope.
pub(crate) fn grants(scopes: &[Scope], needed: Scope) -> bool {
    scopes.iter().any(|&s| s == needed || s == Scope::Admin)
}

/// Why a tokens file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensFileError {
    /// The file cannot be read.
    #[error("tokens file {path}: {cause}")]
    Read {
        /// The file.
        path: String,
        /// Why (said in the message, so not also a `source()`).
        cause: std::io::Error,
    },
    /// A line is wrong.
    #[error("tokens file {path}, line {line}: {reason}")]
    Line {
        /// The file.
        path: String,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it (never the secret).
        reason: String,
    },
}

/// Reads the tokens of the file at `path`.
pub fn read_tokens_file(path: &Path) -> Result<Vec<ApiToken>, TokensFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|cause| TokensFileError::Read {
        path: shown.clone(),
        cause,
    })?;
    parse_tokens(&text).map_err(|(line, reason)| TokensFileError::Line {
        path: shown,
        line,
        reason,
    })
}

/// Parses the text of a tokens file; an error is the line's number and what is wrong with it.
pub fn parse_tokens(text: &str) -> Result<Vec<ApiToken>, (usize, String)> {
    let mut tokens = Vec::new();
    let mut names = HashSet::new();
    let mut secrets = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = content.split_whitespace().collect();
        let [name, scopes, secret] = fields[..] else {
            return Err((
                line,
                format!(
                    "expected `name scope[,scope] token`, found {} field{}",
                    fields.len(),
                    if fields.len() == 1 { "" } else { "s" }
                ),
            ));
        };
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
        {
            return Err((
                line,
                format!("the name {name:?} may hold only letters, digits and - _ . @"),
            ));
        }
        let mut parsed = Vec::new();
        for scope in scopes.split(',') {
            let known = Scope::parse(scope).ok_or_else(|| {
                (
                    line,
                    format!("unknown scope {scope:?} (the scopes are read, start, operate, admin)"),
                )
            })?;
            if !parsed.contains(&known) {
                parsed.push(known);
            }
        }
        if !names.insert(name) {
            return Err((line, format!("the name {name:?} is given twice")));
        }
        if !secrets.insert(secret) {
            return Err((
                line,
                format!("the token of {name:?} is also another name's token"),
            ));
        }
        tokens.push(ApiToken::new(name, &parsed, secret));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_scopes_and_secrets() {
        let text = "# who may do what\n\nci start,read s3cret-ci\n  ops  operate,read,read  s3cret-ops \nroot admin s3cret-root\n";
        let tokens = parse_tokens(text).unwrap();
        assert_eq!(
            tokens,
            vec![
                ApiToken::new("ci", &[Scope::Start, Scope::Read], "s3cret-ci"),
                ApiToken::new("ops", &[Scope::Operate, Scope::Read], "s3cret-ops"),
                ApiToken::new("root", &[Scope::Admin], "s3cret-root"),
            ]
        );
        assert!(tokens[2].allows(Scope::Operate));
        assert!(!tokens[0].allows(Scope::Operate));
        assert!(!format!("{tokens:?}").contains("s3cret"));
    }

    #[test]
    fn a_bad_line_is_named_and_its_secret_never_shown() {
        for (text, line, says) in [
            ("ci read\n", 1, "found 2 fields"),
            (
                "ok read a\nci read,wirte s3cret\n",
                2,
                "unknown scope \"wirte\"",
            ),
            ("ci read a\nci start b\n", 2, "given twice"),
            ("ci read same\nops read same\n", 2, "another name's token"),
            ("c/i read s3cret\n", 1, "may hold only"),
            ("ci read, s3cret\n", 1, "unknown scope \"\""),
        ] {
            let (at, reason) = parse_tokens(text).unwrap_err();
            assert_eq!(at, line, "{text:?}");
            assert!(reason.contains(says), "{text:?}: {reason}");
            assert!(
                !reason.contains("s3cret") && !reason.contains("same"),
                "{reason}"
            );
        }
    }
}
