//! The virtual clock: tokio's paused time, which jumps to the next timer whenever every task
//! waits, read as wall-clock milliseconds by the engine and the store. It carries on across
//! the kit's process lifetimes (each a runtime of its own), so time never runs backwards
//! over a crash.

use std::sync::Mutex;

use orchestrator::clock::Clock;
use tokio::runtime::Handle;
use tokio::time::Instant;

/// 2026-01-01T00:00:00Z: where a kit's clock starts unless told otherwise, so that runs are
/// the same from one day to the next.
pub const DEFAULT_START_MS: i64 = 1_767_225_600_000;

/// Wall-clock time on the kit's virtual time.
#[derive(Debug)]
pub struct VirtualClock {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The time when the current runtime attached (or when the last one detached).
    base_ms: i64,
    /// The current runtime's instant at `base_ms`, and the runtime, to read its time from
    /// any thread.
    origin: Option<(Instant, Handle)>,
}

impl VirtualClock {
    /// A clock that reads `start_ms` (milliseconds since the Unix epoch) until a runtime
    /// attaches.
    pub fn starting_at(start_ms: i64) -> Self {
        Self {
            state: Mutex::new(State {
                base_ms: start_ms,
                origin: None,
            }),
        }
    }

    /// Follows the time of the runtime this is called in (a new process lifetime), from the
    /// instant the previous one stopped at.
    pub(crate) fn attach(&self) {
        let mut state = self.lock();
        state.origin = Some((Instant::now(), Handle::current()));
    }

    /// Stops following the current runtime (it is about to be dropped, as by a crash).
    pub(crate) fn detach(&self) {
        let now = self.now_ms();
        let mut state = self.lock();
        state.base_ms = now;
        state.origin = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> i64 {
        let state = self.lock();
        match &state.origin {
            Some((origin, handle)) => {
                let _runtime = handle.enter();
                let elapsed = Instant::now().saturating_duration_since(*origin);
                state.base_ms + i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX / 4)
            }
            None => state.base_ms,
        }
    }
}

/// Runs `io` without letting virtual time jump while it waits: for a participant that really
/// waits on something outside the runtime (a thread, a socket), during which the engine's
/// timers must not fire as though the wait were long.
pub async fn real_io<F: std::future::Future>(io: F) -> F::Output {
    // A blocking task that lives as long as the wait holds tokio's auto-advance back.
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let _holder = tokio::task::spawn_blocking(move || {
        let _ = wait.recv();
    });
    let out = io.await;
    drop(done);
    out
}
