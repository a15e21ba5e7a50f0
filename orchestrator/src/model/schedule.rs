//! Schedules (SPEC §17): a saga started again and again, on a cron expression in a time zone or
//! at a fixed interval, and what happened to each of its ticks.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use uuid::Uuid;

use super::{de_opt_time, de_time, ser_opt_time, ser_time, Millis};

/// What a tick does while the schedule's previous run has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// The tick is recorded as skipped; nothing starts.
    #[default]
    Skip,
    /// The tick waits until the running one ends, then starts; at most one waits (a later
    /// tick meanwhile is skipped).
    BufferOne,
    /// The tick starts regardless.
    AllowAll,
    /// The running saga is cancelled (audited, naming the schedule), and the tick starts.
    CancelOther,
}

impl Overlap {
    /// Its name on the wire and in the log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer_one",
            Self::AllowAll => "allow_all",
            Self::CancelOther => "cancel_other",
        }
    }

    /// The policy named `text`, if any.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::Skip,
            Self::BufferOne,
            Self::AllowAll,
            Self::CancelOther,
        ]
        .into_iter()
        .find(|o| o.as_str() == text)
    }
}

/// What happened to one tick of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// Its saga was started (`saga_id`).
    Started,
    /// Not run: the previous run had not ended (`overlap: skip`, or a tick already buffered).
    Skipped,
    /// Waiting for the previous run to end (`overlap: buffer_one`); becomes `started`.
    Buffered,
    /// The previous run was cancelled and this tick's saga started (`overlap: cancel_other`).
    CancelledOther,
    /// Not run: every process was down at its time and it is older than the catch-up window.
    Missed,
    /// Its saga could not be started (the definition is gone, or the input no longer fits it).
    Failed,
}

impl RunOutcome {
    /// Its name on the wire and in the log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Skipped => "skipped",
            Self::Buffered => "buffered",
            Self::CancelledOther => "cancelled_other",
            Self::Missed => "missed",
            Self::Failed => "failed",
        }
    }

    /// The outcome named `text`, if any.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::Started,
            Self::Skipped,
            Self::Buffered,
            Self::CancelledOther,
            Self::Missed,
            Self::Failed,
        ]
        .into_iter()
        .find(|o| o.as_str() == text)
    }
}

/// A duration as people write it (`15m`, `1h 30m`), both ways.
pub(crate) mod human_duration {
    use super::*;

    /// Writes `d` as `humantime` does (`15m`).
    pub(crate) fn text(d: Duration) -> String {
        humantime::format_duration(d).to_string()
    }

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(*d))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

mod opt_human_duration {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&human_duration::text(*d)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// A schedule as stored and shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Schedule {
    /// Its id, chosen by whoever made it.
    pub id: String,
    /// The definition each tick starts (its latest version at the time).
    pub saga: String,
    /// Its cron expression (5 fields, or 6 with seconds first), in `timezone`; `null` for a
    /// fixed interval.
    pub cron: Option<String>,
    /// Its fixed interval (`15m`), counted from the Unix epoch; `null` for a cron schedule.
    #[serde(with = "opt_human_duration", default)]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, example = "15m"))]
    pub every: Option<Duration>,
    /// The IANA time zone the cron expression is read in (`UTC` unless given).
    pub timezone: String,
    /// The input of every saga it starts.
    pub input: Value,
    /// What a tick does while the previous run has not ended.
    pub overlap: Overlap,
    /// How late a tick may still start after every process was down at its time.
    #[serde(with = "human_duration")]
    #[cfg_attr(feature = "server", schema(value_type = String, example = "1m"))]
    pub catchup_window: Duration,
    /// Whether it is paused: no tick fires until it is resumed.
    pub paused: bool,
    /// The next tick still to fire.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub next_fire_at: Millis,
    /// A tick waiting for the previous run to end (`buffer_one`).
    #[serde(
        serialize_with = "ser_opt_time",
        deserialize_with = "de_opt_time",
        default
    )]
    #[cfg_attr(feature = "server", schema(value_type = Option<String>, format = DateTime))]
    pub buffered_at: Option<Millis>,
    /// The saga of its latest run.
    pub last_saga_id: Option<Uuid>,
    /// When it was made.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub created_at: Millis,
    /// When it was last changed (made, paused, resumed, fired).
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub updated_at: Millis,
}

/// What happened to one tick of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ScheduleRun {
    /// The tick's instant (for a trigger, when it was asked for).
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub scheduled_at: Millis,
    /// What happened to it.
    pub outcome: RunOutcome,
    /// The saga it started (`started`, `cancelled_other`).
    pub saga_id: Option<Uuid>,
    /// Whether an operator asked for it (`trigger`) rather than the clock.
    pub triggered: bool,
    /// More about it: the saga cancelled, why it failed, how many ticks were missed.
    pub detail: Option<String>,
    /// When it was recorded.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    #[cfg_attr(feature = "server", schema(value_type = String, format = DateTime))]
    pub recorded_at: Millis,
}

/// A tick's record to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewScheduleRun {
    /// The tick's instant.
    pub scheduled_at: Millis,
    /// What happened to it.
    pub outcome: RunOutcome,
    /// The saga it started.
    pub saga_id: Option<Uuid>,
    /// Whether an operator asked for it.
    pub triggered: bool,
    /// More about it.
    pub detail: Option<String>,
}

/// How many runs of a schedule its history keeps.
pub const RUNS_KEPT: usize = 100;

/// A schedule as the API shows it: the schedule, its next ticks and its latest runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ScheduleDetail {
    /// The schedule.
    #[serde(flatten)]
    pub schedule: Schedule,
    /// Its next ticks (up to 5), RFC 3339; empty while it is paused.
    pub next_runs: Vec<String>,
    /// Its latest runs, latest first: one in a list, up to 100 for one schedule.
    pub runs: Vec<ScheduleRun>,
}
