//! Flow control a definition declares (SPEC §14): how many of its sagas may run at once, in
//! all and per key of their input, and the rate limiters its steps take a token from before
//! each attempt. The values declared here are defaults: the orchestrator keeps each limit in
//! its database, where an operator may change it while sagas run.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;

/// How fast a rate limiter lets calls through: `count` per `per` (written `20/s`, `100/m`,
/// `3600/h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    count: u32,
    per: Duration,
}

/// A rate that is not `N/s`, `N/m` or `N/h` with `N` at least 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rate {0:?}: write it as N/s, N/m or N/h with N at least 1, e.g. \"20/s\"")]
pub struct BadRate(pub String);

impl Rate {
    /// `count` calls per second.
    pub const fn per_second(count: u32) -> Self {
        Self {
            count,
            per: Duration::from_secs(1),
        }
    }

    /// `count` calls per minute.
    pub const fn per_minute(count: u32) -> Self {
        Self {
            count,
            per: Duration::from_secs(60),
        }
    }

    /// `count` calls per hour.
    pub const fn per_hour(count: u32) -> Self {
        Self {
            count,
            per: Duration::from_secs(3600),
        }
    }

    /// How many calls per period.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The period.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// The steady spacing between two calls, in milliseconds.
    pub fn interval_ms(&self) -> f64 {
        self.per.as_secs_f64() * 1000.0 / f64::from(self.count.max(1))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            60 => "m",
            3600 => "h",
            _ => "s",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

impl FromStr for Rate {
    type Err = BadRate;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadRate(s.to_owned());
        let (count, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 {
            return Err(bad());
        }
        match unit.trim() {
            "s" => Ok(Self::per_second(count)),
            "m" => Ok(Self::per_minute(count)),
            "h" => Ok(Self::per_hour(count)),
            _ => Err(bad()),
        }
    }
}

/// A named token bucket: `rate` tokens a period, at most `burst` at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimiter {
    /// Its name, shared by every step (of any definition) that takes from it.
    pub name: String,
    /// The refill rate.
    pub rate: Rate,
    /// How many tokens the bucket holds when full: the calls allowed at once after a pause.
    pub burst: u32,
}

/// At most `limit` sagas running per value of `key` in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerKey {
    /// The limit's name.
    pub name: String,
    /// The field of the input whose value is the key: a name (`merchant`) or a dotted path
    /// (`customer.id`).
    pub key: String,
    /// How many may run at once per key.
    pub limit: u32,
}

impl PerKey {
    /// The key of a saga with `input`: the field's value, a string as it is and any other
    /// scalar in its JSON form; `None` if the input lacks the field or it is an object or a
    /// list.
    pub fn key_of(&self, input: &Value) -> Option<String> {
        let value = self.key.split('.').try_fold(input, |v, part| v.get(part))?;
        match value {
            Value::String(s) => Some(s.clone()),
            Value::Number(_) | Value::Bool(_) => Some(value.to_string()),
            _ => None,
        }
    }
}

/// A concurrency limit on the whole definition: at most `limit` of its sagas running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxRunning {
    /// The limit's name.
    pub name: String,
    /// How many may run at once.
    pub limit: u32,
}

/// The flow control of one definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowLimits {
    /// At most this many of the definition's sagas running at once.
    pub max_running: Option<MaxRunning>,
    /// At most this many running per key of the input.
    pub per_key: Option<PerKey>,
    /// The rate limiters its steps take from.
    pub rate_limiters: Vec<RateLimiter>,
}

impl FlowLimits {
    /// Whether a saga of the definition waits for a slot before it starts.
    pub fn limits_running(&self) -> bool {
        self.max_running.is_some() || self.per_key.is_some()
    }

    /// The names of the concurrency limits (`max_running` then `per_key`).
    pub fn concurrency_names(&self) -> impl Iterator<Item = &str> {
        self.max_running
            .iter()
            .map(|m| m.name.as_str())
            .chain(self.per_key.iter().map(|p| p.name.as_str()))
    }
}

/// A limit of any kind, as declared: what the orchestrator writes to its database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeclaredLimit {
    /// [`MaxRunning`] of the definition named.
    MaxRunning {
        /// The definition.
        saga: String,
        /// The limit.
        limit: MaxRunning,
    },
    /// [`PerKey`] of the definition named.
    PerKey {
        /// The definition.
        saga: String,
        /// The limit.
        limit: PerKey,
    },
    /// A [`RateLimiter`].
    Rate(RateLimiter),
}

impl DeclaredLimit {
    /// The limit's name.
    pub fn name(&self) -> &str {
        match self {
            Self::MaxRunning { limit, .. } => &limit.name,
            Self::PerKey { limit, .. } => &limit.name,
            Self::Rate(r) => &r.name,
        }
    }
}
