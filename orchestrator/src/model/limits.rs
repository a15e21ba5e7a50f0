//! Flow control as operators see it (SPEC §14): each limit with its current value, how many
//! sagas (or calls) hold it and how many wait for it.

use serde::{Deserialize, Serialize};

use super::{de_opt_time, ser_opt_time, Millis, UnknownValue};
use std::fmt;
use std::str::FromStr;

wire_enum!(
    /// What a limit bounds.
    LimitKind {
        /// Sagas of one definition running at once.
        MaxRunning = "max_running",
        /// Sagas of one definition running at once per key of their input.
        PerKey = "per_key",
        /// Calls a second (a token bucket steps take from before each attempt).
        Rate = "rate",
    }
);

/// One limit as it stands: its value (an operator's, or the one its definition declares),
/// what holds it and what waits for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct LimitInfo {
    /// Its name.
    pub name: String,
    /// What it bounds.
    pub kind: LimitKind,
    /// The definition it bounds (`max_running`, `per_key`); `null` for a rate limiter.
    pub saga: Option<String>,
    /// The input field whose value is the key (`per_key`).
    pub key: Option<String>,
    /// How many may run at once (`max_running`, `per_key`: per key).
    pub limit: Option<u32>,
    /// The refill rate (`rate`), as `N/s`, `N/m` or `N/h`.
    pub rate: Option<String>,
    /// The tokens the bucket holds when full (`rate`).
    pub burst: Option<u32>,
    /// Sagas holding a slot (`max_running`; `per_key`: in all keys), or for `rate` the tokens
    /// taken and not yet refilled (at most the burst).
    pub in_use: u64,
    /// Sagas waiting for it: to start (`max_running`, `per_key`) or with a step waiting for
    /// a token (`rate`).
    pub waiting: u64,
    /// The value its definition declares, shown beside an operator's change.
    pub declared: DeclaredValue,
    /// When an operator last changed it; `null` while it holds the declared value.
    #[serde(
        serialize_with = "ser_opt_time",
        deserialize_with = "de_opt_time",
        default
    )]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub updated_at: Option<Millis>,
    /// Who changed it last (a token's name).
    pub updated_by: Option<String>,
}

/// A limit's value as declared in code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct DeclaredValue {
    /// The declared limit (`max_running`, `per_key`).
    pub limit: Option<u32>,
    /// The declared rate (`rate`).
    pub rate: Option<String>,
    /// The declared burst (`rate`).
    pub burst: Option<u32>,
}

/// A change an operator makes to a limit (`PUT /v1/limits/{name}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitChange {
    /// A new concurrency limit (0 holds every saga still to start).
    Limit(u32),
    /// A new rate and burst.
    Rate {
        /// The rate.
        rate: saga_dsl::Rate,
        /// The burst (at least 1).
        burst: u32,
    },
}
