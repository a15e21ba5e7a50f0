//! When a schedule's ticks fall: a cron expression read in an IANA time zone (`croner`, with
//! `chrono-tz`), or a fixed interval counted from the Unix epoch.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Year};
use croner::Cron;

use crate::model::Millis;

/// The shortest interval a schedule may have.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// When a schedule's ticks fall.
#[derive(Debug, Clone)]
pub enum Cadence {
    /// A cron expression in a time zone. A local time a daylight-saving change skips fires at
    /// the first instant after the gap; one it repeats fires once.
    Cron {
        /// The parsed expression.
        cron: Box<Cron>,
        /// Its time zone.
        zone: Tz,
    },
    /// Every so many milliseconds, at multiples of it since the Unix epoch.
    Every(i64),
}

impl Cadence {
    /// A cron expression (5 fields, or 6 with seconds first) read in `zone`.
    pub fn cron(expression: &str, zone: &str) -> Result<Self, String> {
        let zone = parse_zone(zone)?;
        // No year field: a schedule limited to some years would come to a last tick, after
        // which it has no next one to show or to wait for.
        let parser = CronParser::builder().year(Year::Disallowed).build();
        let cron = parser.parse(expression.trim()).map_err(|e| {
            format!(
                "{:?} is not a cron expression (5 fields: minute hour day-of-month month \
                 day-of-week, or 6 with seconds first): {e}",
                expression
            )
        })?;
        Ok(Self::Cron {
            cron: Box::new(cron),
            zone,
        })
    }

    /// Every `interval`, at least [`MIN_INTERVAL`].
    pub fn every(interval: Duration) -> Result<Self, String> {
        if interval < MIN_INTERVAL {
            return Err(format!(
                "every {} is too often: a schedule fires at most once a second",
                humantime::format_duration(interval)
            ));
        }
        Ok(Self::Every(
            i64::try_from(interval.as_millis()).unwrap_or(i64::MAX),
        ))
    }

    /// The first tick strictly after `at`, if any.
    pub fn next_after(&self, at: Millis) -> Option<Millis> {
        match self {
            Self::Every(every) => {
                let every = (*every).max(1);
                Some((at.div_euclid(every) + 1) * every)
            }
            Self::Cron { cron, zone } => {
                let from: DateTime<Tz> = Utc.timestamp_millis_opt(at).single()?.with_timezone(zone);
                let next = cron.find_next_occurrence(&from, false).ok()?;
                let next = next.timestamp_millis();
                // croner counts in whole seconds; a start inside the second of a tick would
                // find that tick again.
                if next > at {
                    Some(next)
                } else {
                    let from = zone
                        .timestamp_millis_opt(at - at.rem_euclid(1000) + 1000)
                        .single()?;
                    Some(
                        cron.find_next_occurrence(&from, true)
                            .ok()?
                            .timestamp_millis(),
                    )
                }
            }
        }
    }

    /// The next `n` ticks after `at`.
    pub fn upcoming(&self, at: Millis, n: usize) -> Vec<Millis> {
        let mut out = Vec::with_capacity(n);
        let mut t = at;
        while out.len() < n {
            match self.next_after(t) {
                Some(next) => {
                    out.push(next);
                    t = next;
                }
                None => break,
            }
        }
        out
    }
}

/// An IANA time zone name (`Europe/Paris`, `UTC`).
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| {
        format!("{name:?} is not an IANA time zone name such as \"UTC\" or \"Europe/Paris\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Millis {
        DateTime::parse_from_rfc3339(text)
            .expect("time")
            .timestamp_millis()
    }

    fn text(ms: Millis) -> String {
        crate::model::rfc3339(ms)
    }

    #[test]
    fn an_interval_ticks_at_its_multiples_since_the_epoch() {
        let c = Cadence::every(Duration::from_secs(900)).expect("interval");
        assert_eq!(
            text(c.next_after(at("2026-03-01T10:07:12Z")).expect("next")),
            "2026-03-01T10:15:00.000Z"
        );
        assert_eq!(
            text(c.next_after(at("2026-03-01T10:15:00Z")).expect("next")),
            "2026-03-01T10:30:00.000Z"
        );
        assert!(Cadence::every(Duration::from_millis(999)).is_err());
    }

    #[test]
    fn a_paris_cron_keeps_local_time_across_both_daylight_saving_changes() {
        // 09:00 in Paris: 08:00 UTC in winter, 07:00 UTC in summer. Spring forward is
        // 2026-03-29 (02:00 → 03:00), fall back 2026-10-25 (03:00 → 02:00).
        let c = Cadence::cron("0 9 * * *", "Europe/Paris").expect("cron");
        let days = c.upcoming(at("2026-03-27T12:00:00Z"), 4);
        let days: Vec<String> = days.into_iter().map(text).collect();
        assert_eq!(
            days,
            [
                "2026-03-28T08:00:00.000Z",
                "2026-03-29T07:00:00.000Z",
                "2026-03-30T07:00:00.000Z",
                "2026-03-31T07:00:00.000Z",
            ]
        );
        let days: Vec<String> = c
            .upcoming(at("2026-10-24T12:00:00Z"), 2)
            .into_iter()
            .map(text)
            .collect();
        assert_eq!(
            days,
            ["2026-10-25T08:00:00.000Z", "2026-10-26T08:00:00.000Z"]
        );
    }

    #[test]
    fn a_tick_in_the_spring_forward_gap_fires_once_right_after_it() {
        // 02:30 does not exist in Paris on 2026-03-29: the clocks go from 02:00 to 03:00
        // (01:00 UTC). The tick fires at the first instant after the gap, once that day.
        let c = Cadence::cron("30 2 * * *", "Europe/Paris").expect("cron");
        let ticks: Vec<String> = c
            .upcoming(at("2026-03-28T12:00:00Z"), 2)
            .into_iter()
            .map(text)
            .collect();
        assert_eq!(
            ticks,
            ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"]
        );
    }

    #[test]
    fn a_tick_in_the_repeated_hour_fires_once() {
        // 02:30 happens twice in Paris on 2026-10-25 (at 00:30 and 01:30 UTC).
        let c = Cadence::cron("30 2 * * *", "Europe/Paris").expect("cron");
        let ticks: Vec<String> = c
            .upcoming(at("2026-10-24T12:00:00Z"), 2)
            .into_iter()
            .map(text)
            .collect();
        assert_eq!(
            ticks,
            ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_with_what_was_expected() {
        let e = Cadence::cron("61 * * * *", "UTC").expect_err("minute 61");
        assert!(e.contains("not a cron expression"), "{e}");
        let e = Cadence::cron("0 * * * *", "Mars/Olympus").expect_err("zone");
        assert!(e.contains("IANA"), "{e}");
        assert!(Cadence::cron("*/5 * * * * *", "UTC").is_ok(), "six fields");
        let e = Cadence::cron("0 0 9 * * * 2026", "UTC").expect_err("a year field");
        assert!(e.contains("not a cron expression"), "{e}");
    }
}
