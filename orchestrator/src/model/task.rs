//! Task tokens (SPEC §16): what a call completed by callback hands its participant. A token
//! names one attempt of one step — saga, row, phase, attempt — and how long a heartbeat
//! extends its wait, signed with the log's task key (HMAC-SHA256), so that any process of the
//! log checks it without storing it: nothing holds a token but its participant, and a token
//! cannot be guessed or altered without the key.

use hmac::{Hmac, Mac};
use saga_dsl::Phase;
use sha2::Sha256;
use uuid::Uuid;

/// What the routes under `/v1/tasks/{token}` call the wait of a step for its callback, in
/// its row's `waiting_for` and in the saga's.
pub const TASK_WAIT: &str = "task";

/// The format's version, the token's first byte.
const VERSION: u8 = 1;
/// Bytes of the signature kept in the token: 160 bits.
const MAC_LEN: usize = 20;
/// version, saga, row, phase, attempt, heartbeat extension.
const BODY_LEN: usize = 1 + 16 + 4 + 1 + 4 + 8;

/// The attempt a token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRef {
    /// The saga.
    pub saga: Uuid,
    /// The step's row.
    pub step_index: u32,
    /// Action or compensation.
    pub phase: Phase,
    /// The attempt, counted from 1 across crashes.
    pub attempt: u32,
}

/// A token's contents: its attempt, and how far each heartbeat pushes the wait's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskToken {
    /// The attempt.
    pub task: TaskRef,
    /// Milliseconds from a heartbeat to the wait's new deadline: the step's timeout.
    pub extend_ms: u64,
}

/// A token that names nothing: malformed, of another log, or altered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no task has this token")]
pub struct UnknownToken;

impl TaskToken {
    /// The token's text, signed with `key`: lowercase hex.
    pub fn encode(&self, key: &[u8]) -> String {
        let body = self.body();
        let mut bytes = body.to_vec();
        bytes.extend_from_slice(&mac(key, &body)[..MAC_LEN]);
        hex::encode(bytes)
    }

    /// The token `text`, if `key` signed it.
    pub fn decode(key: &[u8], text: &str) -> Result<Self, UnknownToken> {
        let bytes = hex::decode(text).map_err(|_| UnknownToken)?;
        if bytes.len() != BODY_LEN + MAC_LEN || bytes[0] != VERSION {
            return Err(UnknownToken);
        }
        let (body, signature) = bytes.split_at(BODY_LEN);
        let mut check = keyed(key);
        check.update(body);
        // Constant time: a forger learns nothing from how long the refusal took.
        check
            .verify_truncated_left(signature)
            .map_err(|_| UnknownToken)?;
        let u32_at =
            |at: usize| u32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        let mut extend = [0u8; 8];
        extend.copy_from_slice(&body[26..34]);
        let phase = match body[21] {
            0 => Phase::Action,
            1 => Phase::Compensation,
            _ => return Err(UnknownToken),
        };
        let saga = Uuid::from_slice(&body[1..17]).map_err(|_| UnknownToken)?;
        Ok(Self {
            task: TaskRef {
                saga,
                step_index: u32_at(17),
                phase,
                attempt: u32_at(22),
            },
            extend_ms: u64::from_be_bytes(extend),
        })
    }

    fn body(&self) -> [u8; BODY_LEN] {
        let mut body = [0u8; BODY_LEN];
        body[0] = VERSION;
        body[1..17].copy_from_slice(self.task.saga.as_bytes());
        body[17..21].copy_from_slice(&self.task.step_index.to_be_bytes());
        body[21] = match self.task.phase {
            Phase::Action => 0,
            Phase::Compensation => 1,
        };
        body[22..26].copy_from_slice(&self.task.attempt.to_be_bytes());
        body[26..34].copy_from_slice(&self.extend_ms.to_be_bytes());
        body
    }
}

fn keyed(key: &[u8]) -> Hmac<Sha256> {
    // `new_from_slice` fails only for MACs of a fixed key size, which HMAC is not.
    Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key"))
}

fn mac(key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut mac = keyed(key);
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> TaskToken {
        TaskToken {
            task: TaskRef {
                saga: Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
                step_index: 2,
                phase: Phase::Compensation,
                attempt: 7,
            },
            extend_ms: 30_000,
        }
    }

    #[test]
    fn a_token_decodes_to_what_was_encoded_with_the_same_key() {
        let text = token().encode(b"key");
        assert_eq!(TaskToken::decode(b"key", &text), Ok(token()));
    }

    #[test]
    fn a_token_of_another_key_an_altered_one_or_garbage_names_nothing() {
        let text = token().encode(b"key");
        assert_eq!(TaskToken::decode(b"other", &text), Err(UnknownToken));
        // Another attempt with the first one's signature.
        let mut forged = token();
        forged.task.attempt = 8;
        let forged = format!(
            "{}{}",
            &forged.encode(b"x")[..2 * BODY_LEN],
            &text[2 * BODY_LEN..]
        );
        assert_eq!(TaskToken::decode(b"key", &forged), Err(UnknownToken));
        for junk in ["", "zz", &text[..text.len() - 2], &format!("{text}00")] {
            assert_eq!(TaskToken::decode(b"key", junk), Err(UnknownToken), "{junk}");
        }
    }

    #[test]
    fn each_attempt_has_its_own_token() {
        let mut next = token();
        next.task.attempt += 1;
        assert_ne!(token().encode(b"key"), next.encode(b"key"));
    }
}
