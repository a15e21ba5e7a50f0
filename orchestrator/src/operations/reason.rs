//! The reason an audited command carries.

use super::{OperationError, Result};

/// The longest reason kept in an audit event, in characters.
pub const MAX_REASON: usize = 1000;

/// Why an operator acts, as the audit keeps it: 1 to [`MAX_REASON`] characters, surrounding
/// white space dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason(String);

impl Reason {
    /// Checks a reason as typed.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.is_empty() {
            return Err(OperationError::BadRequest(
                "the reason must not be empty: say why, for the audit trail".to_owned(),
            ));
        }
        if text.chars().count() > MAX_REASON {
            return Err(OperationError::BadRequest(format!(
                "the reason must be 1 to {MAX_REASON} characters"
            )));
        }
        Ok(Self(text.to_owned()))
    }

    /// The reason's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_trimmed_and_bounded() {
        assert_eq!(
            Reason::parse(" done by hand ").ok().map(|r| r.to_string()),
            Some("done by hand".to_owned())
        );
        assert!(Reason::parse("  ").is_err());
        assert!(Reason::parse(&"x".repeat(MAX_REASON)).is_ok());
        assert!(Reason::parse(&"x".repeat(MAX_REASON + 1)).is_err());
    }
}
