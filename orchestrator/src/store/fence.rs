//! The lease fence: the condition every write of a saga's log checks, written once. A write
//! applies only while the saga's row still holds the writer's lease — its owner and its epoch,
//! which every claim and every operator take-over bumps — so a worker that lost its lease
//! writes nothing more. A write that starts an action also carries the guard: it is refused
//! once a cancel is recorded, so the action does not start.
//!
//! `lease_fence!(OWNER, EPOCH)` expands to the condition as a string literal, with the
//! statement's own parameters or columns for the owner and the epoch;
//! `lease_fence!(OWNER, EPOCH, guard GUARD)` adds the cancel guard, and `hold HOLD` after it
//! the pause guard (refused once a pause is requested: the writes that start a call or give
//! a running saga back carry it, so its driver gives it back `PAUSED` instead); `table T` before them
//! qualifies the saga row's columns where a statement joins other rows. Being a literal, it
//! goes into `concat!` for the statements kept as constants, and into `format!` for the
//! others.

/// The lease fence as a string literal (see the module's documentation).
macro_rules! lease_fence {
    ($owner:literal, $epoch:literal) => {
        concat!("lease_owner = ", $owner, " AND lease_epoch = ", $epoch)
    };
    ($owner:literal, $epoch:literal, guard $guard:literal) => {
        concat!(
            "lease_owner = ",
            $owner,
            " AND lease_epoch = ",
            $epoch,
            " AND NOT (",
            $guard,
            " AND cancel_requested)"
        )
    };
    ($owner:literal, $epoch:literal, guard $guard:literal, hold $hold:literal) => {
        concat!(
            "lease_owner = ",
            $owner,
            " AND lease_epoch = ",
            $epoch,
            " AND NOT (",
            $guard,
            " AND cancel_requested) AND NOT (",
            $hold,
            " AND pause_requested IS NOT NULL)"
        )
    };
    (table $t:literal, $owner:literal, $epoch:literal, guard $guard:literal, hold $hold:literal) => {
        concat!(
            $t,
            ".lease_owner = ",
            $owner,
            " AND ",
            $t,
            ".lease_epoch = ",
            $epoch,
            " AND NOT (",
            $guard,
            " AND ",
            $t,
            ".cancel_requested) AND NOT (",
            $hold,
            " AND ",
            $t,
            ".pause_requested IS NOT NULL)"
        )
    };
    (table $t:literal, $owner:literal, $epoch:literal, guard $guard:literal) => {
        concat!(
            $t,
            ".lease_owner = ",
            $owner,
            " AND ",
            $t,
            ".lease_epoch = ",
            $epoch,
            " AND NOT (",
            $guard,
            " AND ",
            $t,
            ".cancel_requested)"
        )
    };
}

pub(crate) use lease_fence;

#[cfg(test)]
mod tests {
    #[test]
    fn the_fence_reads_as_the_architecture_states_it() {
        assert_eq!(
            lease_fence!("?10", "?11", guard "?12"),
            "lease_owner = ?10 AND lease_epoch = ?11 AND NOT (?12 AND cancel_requested)"
        );
        assert_eq!(
            lease_fence!(table "sagas", "x.owner", "x.epoch", guard "x.guard"),
            "sagas.lease_owner = x.owner AND sagas.lease_epoch = x.epoch \
             AND NOT (x.guard AND sagas.cancel_requested)"
        );
        assert_eq!(
            lease_fence!("?1", "?2", guard "?3", hold "?4"),
            "lease_owner = ?1 AND lease_epoch = ?2 AND NOT (?3 AND cancel_requested) \
             AND NOT (?4 AND pause_requested IS NOT NULL)"
        );
        assert_eq!(
            lease_fence!("$2", "$3"),
            "lease_owner = $2 AND lease_epoch = $3"
        );
    }
}
