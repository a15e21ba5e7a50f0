//! The names of what a stage is, shared by the definition, the log, the JSON and the console:
//! [`StepKind`], the name every row of the log carries, and [`StageKind`], the coarser name a
//! stage shows as.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What one stage (or one branch of a group) is, as stored in the log and shown in a saga's
/// `steps`: a call's role in Garcia-Molina and Salem's order (compensatable, pivot,
/// retriable), or one of the stages that call nothing themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// Has an action and a compensation.
    Compensatable,
    /// Has no compensation; once it succeeds the saga can no longer go back.
    Pivot,
    /// Comes after the pivot; retried forward until it succeeds, never compensated.
    Retriable,
    /// A durable sleep ([`Step::sleep`](crate::Step::sleep)): calls nothing, so it has nothing
    /// to compensate, and may stand anywhere in the list.
    Sleep,
    /// A wait for a signal from outside ([`Step::signal`](crate::Step::signal)): calls nothing,
    /// compensates nothing, may stand anywhere in the list.
    Signal,
    /// A parallel group ([`Step::parallel`](crate::Step::parallel),
    /// [`Step::map`](crate::Step::map)): its branches call, each with its own compensation; the
    /// group itself calls nothing. It stands where its branches' kind (compensatable or
    /// retriable) may.
    Parallel,
    /// A child saga ([`Step::child`](crate::Step::child)): starts another registered saga and
    /// waits for its end. Compensated by cancelling the child, or by running a completed
    /// child's compensations.
    Child,
}

impl StepKind {
    /// Every kind, in declaration order.
    pub const ALL: &'static [Self] = &[
        Self::Compensatable,
        Self::Pivot,
        Self::Retriable,
        Self::Sleep,
        Self::Signal,
        Self::Parallel,
        Self::Child,
    ];

    /// `compensatable`, `pivot`, `retriable`, `sleep`, `signal`, `parallel` or `child`, as
    /// stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Compensatable => "compensatable",
            Self::Pivot => "pivot",
            Self::Retriable => "retriable",
            Self::Sleep => "sleep",
            Self::Signal => "signal",
            Self::Parallel => "parallel",
            Self::Child => "child",
        }
    }

    /// Whether a stage of this kind calls an action itself (not a wait, not a group).
    pub const fn calls(self) -> bool {
        matches!(self, Self::Compensatable | Self::Pivot | Self::Retriable)
    }

    /// The stage kind a stage of this kind shows as.
    pub const fn stage(self) -> StageKind {
        match self {
            Self::Compensatable | Self::Pivot | Self::Retriable => StageKind::Step,
            Self::Sleep => StageKind::Sleep,
            Self::Signal => StageKind::Signal,
            Self::Parallel => StageKind::Parallel,
            Self::Child => StageKind::Child,
        }
    }
}

/// What a stage is, as a saga's `stages` show it: a step that calls (its role is its
/// `step_kind`), a parallel group, a sleep, a signal wait or a child saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum StageKind {
    /// An action and, usually, its compensation (compensatable, pivot or retriable).
    Step,
    /// A parallel group: its branches run at once.
    Parallel,
    /// A durable sleep.
    Sleep,
    /// A wait for a signal.
    Signal,
    /// A child saga.
    Child,
}

impl StageKind {
    /// Every kind, in declaration order.
    pub const ALL: &'static [Self] = &[
        Self::Step,
        Self::Parallel,
        Self::Sleep,
        Self::Signal,
        Self::Child,
    ];

    /// `step`, `parallel`, `sleep`, `signal` or `child`, as shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Step => "step",
            Self::Parallel => "parallel",
            Self::Sleep => "sleep",
            Self::Signal => "signal",
            Self::Child => "child",
        }
    }
}

/// Text that names no kind (a corrupt row, a typo).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {text:?}")]
pub struct UnknownKind {
    what: &'static str,
    text: String,
}

macro_rules! kind_text {
    ($kind:ident) => {
        impl fmt::Display for $kind {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $kind {
            type Err = UnknownKind;
            fn from_str(text: &str) -> Result<Self, UnknownKind> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|k| k.as_str() == text)
                    .ok_or_else(|| UnknownKind {
                        what: stringify!($kind),
                        text: text.to_owned(),
                    })
            }
        }
    };
}

kind_text!(StepKind);
kind_text!(StageKind);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_back_what_they_write() {
        for kind in StepKind::ALL {
            assert_eq!(kind.as_str().parse::<StepKind>(), Ok(*kind));
            let json = serde_json::to_value(kind).unwrap_or_default();
            assert_eq!(json, kind.as_str());
        }
        for kind in StageKind::ALL {
            assert_eq!(kind.as_str().parse::<StageKind>(), Ok(*kind));
        }
        assert!("step".parse::<StepKind>().is_err());
        assert_eq!(StepKind::Pivot.stage(), StageKind::Step);
    }
}
