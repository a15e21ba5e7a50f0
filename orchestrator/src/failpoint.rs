//! Crash points for recovery tests.
//!
//! Some crash windows cannot be hit from outside by timing alone: "the action returned, its
//! result is not yet in the log" lasts microseconds. Setting `SAGA_CRASH_AT` to a comma-separated
//! list of `POINT:STEP` (for example `after_action:charge_payment`) makes the process abort at
//! that point, exactly like a `kill -9` there. Points: `before_action`, `after_action`,
//! `before_compensation`, `after_compensation`, and for a child stage `before_child` (its
//! waiting record committed, the child not created) and `after_child` (the child created, the
//! parent not yet parked); for a fork, by the saga's name in place of a step, `after_fork`
//! (the fork committed, its new saga not yet handed to the engine nor answered); for the outbox, by event type in place of a step,
//! `after_webhook_send` (a webhook answered, its delivery not recorded), `after_broker_ack`
//! (the broker acknowledged a batch ending with that event, the relay's cursor not moved) and,
//! in a consumer, `after_consume_commit` (its work committed, the message not acked); for a NATS
//! trigger, by saga name, `after_trigger_start` (the message's saga committed, the message not
//! acknowledged). Unset
//! (the normal case), this costs one branch on an empty list.

use std::sync::OnceLock;

/// The environment variable that arms crash points.
pub const ENV: &str = "SAGA_CRASH_AT";

fn armed() -> &'static [(String, String)] {
    static ARMED: OnceLock<Vec<(String, String)>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var(ENV)
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| p.trim().split_once(':'))
            .map(|(point, step)| (point.to_owned(), step.to_owned()))
            .collect()
    })
}

/// Aborts the process if `point` is armed for `step`.
pub fn crash_if_armed(point: &str, step: &str) {
    if armed().iter().any(|(p, s)| p == point && s == step) {
        eprintln!("{ENV}: crashing at {point}:{step}");
        std::process::abort();
    }
}
