//! The `payout` saga (SPEC §14): debit a merchant's balance, send the money through the bank
//! (the point of no return), then tell the merchant.
//!
//! It is the example of flow control. One merchant's payouts run one at a time (the limit
//! `payout_per_merchant`), at most 50 payouts run at once in all (`payout_running`), and every
//! attempt of `send_transfer` first takes a token from the rate limiter `bank` (20 a second,
//! bursts of 5), however many processes share the database. The values declared here are
//! defaults: operators change them at run time (`saga limits set bank --rate 40/s`).
//!
//! The bank notes the time of every call it receives and the participants note when each
//! payout began and ended, on their own clock ([`crate::shop::PayoutTimings`]), so that the
//! limits can be checked from outside the orchestrator.

use std::sync::Arc;

use orchestrator::participants::{HttpCall, HttpParticipant, ParticipantError};
use saga_dsl::flow::Rate;
use saga_dsl::{
    Action, Compensation, DefinitionError, JsonSchema, SagaDefinition, Stage, Step, StepContext,
    StepError, Value,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::place_order::{action_policy, compensatable, short_id, ATTEMPT_TIMEOUT};
use crate::shop::{Effect, PayoutMark, Shop};
pub use crate::simulate::Simulate;
use crate::simulate::{act, before_remote_call, compensate, Call};

/// The saga's name.
pub const NAME: &str = "payout";
/// The definition's version.
pub const VERSION: u32 = 1;
/// The limit of payouts running at once per merchant.
pub const PER_MERCHANT: &str = "payout_per_merchant";
/// The limit of payouts running at once in all.
pub const RUNNING: &str = "payout_running";
/// The rate limiter `send_transfer` takes a token from before each attempt.
pub const BANK: &str = "bank";
/// The bank's declared rate.
pub const BANK_RATE: Rate = Rate::per_second(20);
/// The bank's declared burst: the calls let through at once after a quiet spell.
pub const BANK_BURST: u32 = 5;
/// How many payouts of one merchant may run at once, as declared.
pub const PER_MERCHANT_LIMIT: u32 = 1;
/// How many payouts may run at once in all, as declared.
pub const RUNNING_LIMIT: u32 = 50;

/// The input of `payout`: `{"payout_id": str, "merchant": str, "amount": int, "simulate": {…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct PayoutInput {
    /// The payout; the ledger groups effects by it.
    pub payout_id: String,
    /// Who is paid; at most one payout per merchant runs at once.
    pub merchant: String,
    /// The amount to pay out, in the smallest currency unit.
    pub amount: i64,
    /// Injected trouble, as for `place_order`; step names are this saga's.
    #[serde(default)]
    pub simulate: Simulate,
}

/// The output of `debit_balance`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debit {
    /// The balance ledger's entry id.
    pub debit_id: String,
    /// The amount taken from the merchant's balance.
    pub amount: i64,
}

/// The output of `send_transfer`, which `notify_merchant` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// The bank's transfer reference.
    pub transfer_id: String,
    /// The amount sent.
    pub amount: i64,
}

/// The output of `notify_merchant`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// The merchant told.
    pub to: String,
    /// The transfer they were told of.
    pub transfer_id: String,
}

/// `send_transfer`, whose output [`Transfer`] `notify_merchant` reads.
pub const TRANSFER: Stage<Transfer> = Stage::named("send_transfer");

/// The `payout` definition, its participants working against `shop`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}", dir.path().join("shop.db").display());
/// use std::sync::Arc;
/// use example_sagas::{payout::payout, shop::Shop};
/// let def = payout(Arc::new(Shop::open(&url).await?))?;
/// let stages: Vec<&str> = def.steps().iter().map(|s| s.name()).collect();
/// assert_eq!(stages, ["debit_balance", "send_transfer", "notify_merchant"]);
/// assert!(def.flow().limits_running());
/// # Ok(()) }
/// ```
pub fn payout(shop: Arc<Shop>) -> Result<SagaDefinition, DefinitionError> {
    payout_via(shop, BankLink::InShop)
}

/// How `send_transfer` reaches the bank.
#[derive(Clone)]
pub enum BankLink {
    /// The bank as a function of the shop, in the participants' database: for the test kit's
    /// explorations and the benchmarks, which run without an HTTP API to call back.
    InShop,
    /// The bank over HTTP (the fake bank of [`crate::bank`], or another at its URL): the call
    /// is completed by the bank's callback (SPEC §16).
    Http(Box<HttpCall>),
}

impl BankLink {
    /// The bank at `url` (`http://HOST:PORT`), reached through `participant`: `POST
    /// {url}/transfers` with the payout, completed by the bank's callback.
    pub fn http(participant: &HttpParticipant, url: &str) -> Result<Self, ParticipantError> {
        let call = participant
            .post(&format!("{}/transfers", url.trim_end_matches('/')))?
            .body(|ctx| {
                let input = ctx.input::<PayoutInput>()?;
                Ok(json!({
                    "payout_id": input.payout_id,
                    "merchant": input.merchant,
                    "amount": input.amount,
                    // The simulated refusal is the bank's own answer.
                    "refuse": input.simulate.fail_step.as_deref() == Some(TRANSFER.name()),
                }))
            });
        Ok(Self::Http(Box::new(call)))
    }
}

/// The `payout` definition with `send_transfer` reaching the bank through `bank`: over HTTP,
/// the step is completed by the bank's callback, and its timeout bounds the wait for it.
pub fn payout_via(shop: Arc<Shop>, bank: BankLink) -> Result<SagaDefinition, DefinitionError> {
    let send = Step::pivot(TRANSFER, SendTransfer { bank: bank.clone() })
        .retry(action_policy())
        .timeout(ATTEMPT_TIMEOUT)
        .rate_limited(BANK);
    let send = match bank {
        BankLink::InShop => send,
        BankLink::Http(_) => send.completed_by_callback(),
    };
    SagaDefinition::builder(NAME, VERSION)
        .input::<PayoutInput>()
        .attr("merchant", |i: &PayoutInput| i.merchant.clone())
        .state(shop)
        .per_key(PER_MERCHANT, "merchant", PER_MERCHANT_LIMIT)
        .max_running(RUNNING, RUNNING_LIMIT)
        .rate_limiter(BANK, BANK_RATE, BANK_BURST)
        .step(compensatable(
            "debit_balance",
            debit_balance,
            credit_balance(),
        ))
        .step(send)
        .step(
            Step::retriable("notify_merchant", notify_merchant)
                .retry(action_policy().with_unlimited_attempts())
                .timeout(ATTEMPT_TIMEOUT),
        )
        .build()
}

async fn debit_balance(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<PayoutInput>()?);
    // Every attempt, before anything can fail: the payout's window opens at its first.
    shop.record_payout_mark(&input.payout_id, &input.merchant, PayoutMark::DebitStarted)
        .await?;
    let output = Debit {
        debit_id: short_id("deb", &ctx),
        amount: input.amount,
    };
    let call = Call {
        owner: &input.payout_id,
        effect: Effect::Debited.into(),
        amount: input.amount,
        refusal: "insufficient balance",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

/// `send_transfer`: through the bank link, after noting the call on the participants' clock.
struct SendTransfer {
    bank: BankLink,
}

#[async_trait::async_trait]
impl Action for SendTransfer {
    async fn run(&self, ctx: StepContext) -> Result<Value, StepError> {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<PayoutInput>()?);
        // Every call to the bank is noted, refused, failed or repeated alike: each one took a
        // token from the rate limiter.
        shop.record_bank_call(&input.payout_id, &input.merchant, ctx.attempt())
            .await?;
        match &self.bank {
            BankLink::InShop => transfer_in_shop(shop, &ctx, &input).await,
            BankLink::Http(call) => {
                before_remote_call(&ctx, &input.simulate).await?;
                Action::run(call.as_ref(), ctx).await
            }
        }
    }
}

async fn transfer_in_shop(
    shop: &Shop,
    ctx: &StepContext,
    input: &PayoutInput,
) -> Result<Value, StepError> {
    let output = Transfer {
        transfer_id: short_id("tr", ctx),
        amount: input.amount,
    };
    let call = Call {
        owner: &input.payout_id,
        effect: Effect::Transferred.into(),
        amount: input.amount,
        refusal: "the bank rejected the transfer",
        output: json!(output),
    };
    act(shop, ctx, &input.simulate, call).await
}

async fn notify_merchant(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<PayoutInput>()?);
    let transfer = ctx.output(TRANSFER)?;
    let output = Notice {
        to: input.merchant.clone(),
        transfer_id: transfer.transfer_id,
    };
    let call = Call {
        owner: &input.payout_id,
        effect: Effect::MerchantNotified.into(),
        amount: 0,
        refusal: "the merchant cannot be reached",
        output: json!(output),
    };
    let sent = act(shop, &ctx, &input.simulate, call).await?;
    shop.record_payout_mark(&input.payout_id, &input.merchant, PayoutMark::NotifyEnded)
        .await?;
    Ok(sent)
}

/// `credit_balance`: gives back what `debit_balance` took, found by the action's key (see
/// [`crate::shop::Shop::undo_once`]), so a debit whose outcome is unknown is undone if it
/// happened and voided if not.
fn credit_balance() -> impl Compensation {
    move |ctx: StepContext| async move {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<PayoutInput>()?);
        compensate(
            shop,
            &ctx,
            &input.simulate,
            "credit_balance",
            &input.payout_id,
            Effect::Debited.into(),
            Effect::Credited.into(),
        )
        .await?;
        // A compensated payout's window closes here instead of at its notice.
        shop.record_payout_mark(&input.payout_id, &input.merchant, PayoutMark::CreditEnded)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with the error in the panic message.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    use saga_dsl::flow::{DeclaredLimit, MaxRunning, PerKey, RateLimiter};
    use saga_dsl::{Phase, StepKind};
    use uuid::Uuid;

    use crate::shop::PayoutLedgerEntry;

    const STAGES: [&str; 3] = ["debit_balance", "send_transfer", "notify_merchant"];

    async fn setup() -> (tempfile::TempDir, Arc<Shop>, SagaDefinition) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let shop = Arc::new(Shop::open(&url).await.unwrap());
        let def = payout(shop.clone()).unwrap();
        (dir, shop, def)
    }

    fn ctx(
        def: &SagaDefinition,
        saga: Uuid,
        index: usize,
        phase: Phase,
        attempt: u32,
        input: &Value,
        outputs: &BTreeMap<String, Value>,
    ) -> StepContext {
        StepContext::new(
            saga,
            index,
            STAGES[index],
            phase,
            attempt,
            Arc::new(input.clone()),
            Arc::new(outputs.clone()),
        )
        .with_state(def.state().cloned())
    }

    async fn run_action(
        def: &SagaDefinition,
        saga: Uuid,
        index: usize,
        attempt: u32,
        input: &Value,
        outputs: &BTreeMap<String, Value>,
    ) -> Result<Value, StepError> {
        let c = ctx(def, saga, index, Phase::Action, attempt, input, outputs);
        def.steps()[index]
            .call()
            .expect("payout's steps all call")
            .action()
            .run(c)
            .await
    }

    async fn run_credit(
        def: &SagaDefinition,
        saga: Uuid,
        attempt: u32,
        input: &Value,
    ) -> Result<(), StepError> {
        let c = ctx(
            def,
            saga,
            0,
            Phase::Compensation,
            attempt,
            input,
            &BTreeMap::new(),
        );
        let comp = def.steps()[0].call().unwrap().compensation().unwrap();
        comp.run(c).await
    }

    #[tokio::test]
    async fn definition_stages_kinds_and_input() {
        let (_dir, _shop, def) = setup().await;
        assert_eq!((def.name(), def.version()), ("payout", 1));
        let names: Vec<_> = def.steps().iter().map(|s| s.name()).collect();
        assert_eq!(names, STAGES);
        let kinds: Vec<_> = def.steps().iter().map(|s| s.kind()).collect();
        assert_eq!(
            kinds,
            [
                StepKind::Compensatable,
                StepKind::Pivot,
                StepKind::Retriable
            ]
        );
        let limiters: Vec<_> = def
            .steps()
            .iter()
            .map(|s| s.call().unwrap().rate_limiter())
            .collect();
        assert_eq!(limiters, [None, Some("bank"), None]);
        for step in def.steps() {
            assert_eq!(
                step.call().unwrap().attempt_timeout(),
                Duration::from_secs(10)
            );
        }
        let undone: Vec<_> = def
            .steps()
            .iter()
            .map(|s| s.call().unwrap().compensation().is_some())
            .collect();
        assert_eq!(undone, [true, false, false], "only the debit is undone");

        let good = json!({"payout_id": "p1", "merchant": "m1", "amount": 5});
        assert!(def.check_input(&good).is_ok());
        assert!(def
            .check_input(&json!({"payout_id": "p1", "amount": 5}))
            .is_err());
        assert!(def
            .check_input(&json!({"payout_id": "p1", "merchant": "m1", "amount": "5"}))
            .is_err());
        let sim = json!({"payout_id": "p1", "merchant": "m1", "amount": 5,
                         "simulate": {"fail_step": "send_transfer",
                                      "transient_failures": {"notify_merchant": 2}}});
        assert!(def.check_input(&sim).is_ok());
        let typo = json!({"payout_id": "p1", "merchant": "m1", "amount": 5,
                          "simulate": {"fail_stepp": "send_transfer"}});
        assert!(def.check_input(&typo).is_err());
    }

    #[tokio::test]
    async fn definition_declares_its_limits() {
        let (_dir, shop, def) = setup().await;
        let flow = def.flow();
        assert_eq!(
            flow.max_running,
            Some(MaxRunning {
                name: "payout_running".into(),
                limit: 50
            })
        );
        let per_key = PerKey {
            name: "payout_per_merchant".into(),
            key: "merchant".into(),
            limit: 1,
        };
        assert_eq!(flow.per_key, Some(per_key.clone()));
        let bank = RateLimiter {
            name: "bank".into(),
            rate: "20/s".parse().unwrap(),
            burst: 5,
        };
        assert_eq!(flow.rate_limiters, std::slice::from_ref(&bank));
        assert_eq!(
            per_key.key_of(&json!({"payout_id": "p1", "merchant": "acme", "amount": 5})),
            Some("acme".to_owned())
        );

        // The application's registry hands all three to the orchestrator.
        let limits = crate::registry(shop).unwrap().limits().unwrap();
        let ours: Vec<_> = limits
            .into_iter()
            .filter(|l| ["bank", "payout_per_merchant", "payout_running"].contains(&l.name()))
            .collect();
        assert_eq!(
            ours,
            [
                DeclaredLimit::Rate(bank),
                DeclaredLimit::PerKey {
                    saga: "payout".into(),
                    limit: per_key,
                },
                DeclaredLimit::MaxRunning {
                    saga: "payout".into(),
                    limit: MaxRunning {
                        name: "payout_running".into(),
                        limit: 50,
                    },
                },
            ]
        );
    }

    #[tokio::test]
    async fn actions_apply_once_per_key_and_the_bank_counts_every_call() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"payout_id": "p1", "merchant": "acme", "amount": 4200});
        let mut outputs = BTreeMap::new();
        for (index, name) in STAGES.iter().enumerate() {
            let first = run_action(&def, saga, index, 1, &input, &outputs)
                .await
                .unwrap();
            let again = run_action(&def, saga, index, 2, &input, &outputs)
                .await
                .unwrap();
            assert_eq!(first, again, "{name}: a retry returns the first output");
            outputs.insert((*name).to_owned(), first);
        }
        let transfer: Transfer = serde_json::from_value(outputs["send_transfer"].clone()).unwrap();
        assert_eq!(transfer.amount, 4200);
        let notice: Notice = serde_json::from_value(outputs["notify_merchant"].clone()).unwrap();
        assert_eq!(notice.to, "acme");
        assert_eq!(notice.transfer_id, transfer.transfer_id);
        assert_eq!(
            shop.payout_ledger_for("p1").await.unwrap(),
            PayoutLedgerEntry {
                debited: 1,
                transferred: 1,
                notified: 1,
                credited: 0,
            }
        );

        // Both calls reached the bank, though it moved the money once.
        let timings = shop.payout_timings().await.unwrap();
        let calls: Vec<_> = timings
            .bank_calls
            .iter()
            .map(|c| (c.payout_id.as_str(), c.merchant.as_str(), c.attempt))
            .collect();
        assert_eq!(calls, [("p1", "acme", 1), ("p1", "acme", 2)]);
        assert!(timings.bank_calls[0].at <= timings.bank_calls[1].at);
        let times = &timings.payouts["p1"];
        assert_eq!(times.merchant, "acme");
        let (start, end) = (
            times.debit_started_at.unwrap(),
            times.notify_ended_at.unwrap(),
        );
        assert!(start <= timings.bank_calls[0].at && timings.bank_calls[1].at <= end);
        assert_eq!(times.credit_ended_at, None);
    }

    #[tokio::test]
    async fn a_refused_transfer_is_credited_back_once() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"payout_id": "p2", "merchant": "acme", "amount": 700,
                           "simulate": {"fail_step": "send_transfer",
                                        "compensation_failures": {"credit_balance": 1}}});
        let none = BTreeMap::new();
        run_action(&def, saga, 0, 1, &input, &none).await.unwrap();
        let err = run_action(&def, saga, 1, 1, &input, &none)
            .await
            .unwrap_err();
        assert_eq!(err, StepError::permanent("the bank rejected the transfer"));

        let err = run_credit(&def, saga, 1, &input).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        run_credit(&def, saga, 2, &input).await.unwrap();
        run_credit(&def, saga, 3, &input).await.unwrap();
        assert_eq!(
            shop.payout_ledger_for("p2").await.unwrap(),
            PayoutLedgerEntry {
                debited: 1,
                credited: 1,
                ..PayoutLedgerEntry::default()
            }
        );
        let timings = shop.payout_timings().await.unwrap();
        assert_eq!(timings.bank_calls.len(), 1, "the refusal was a call too");
        let times = &timings.payouts["p2"];
        assert!(times.debit_started_at.unwrap() <= times.credit_ended_at.unwrap());
        assert_eq!(times.notify_ended_at, None);
    }

    #[tokio::test]
    async fn a_credit_before_its_debit_voids_it() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"payout_id": "p3", "merchant": "acme", "amount": 10});
        run_credit(&def, saga, 1, &input).await.unwrap();
        // A debit arriving after its compensation must not take the money.
        let late = run_action(&def, saga, 0, 1, &input, &BTreeMap::new())
            .await
            .unwrap_err();
        assert!(!late.is_retryable(), "{late}");
        assert_eq!(
            shop.payout_ledger_for("p3").await.unwrap(),
            PayoutLedgerEntry::default()
        );
    }

    #[tokio::test]
    async fn transient_failures_count_as_bank_calls() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"payout_id": "p4", "merchant": "acme", "amount": 10,
                           "simulate": {"transient_failures": {"send_transfer": 2}}});
        let none = BTreeMap::new();
        for attempt in 1..=2 {
            let err = run_action(&def, saga, 1, attempt, &input, &none)
                .await
                .unwrap_err();
            assert!(err.is_retryable(), "{err}");
        }
        run_action(&def, saga, 1, 3, &input, &none).await.unwrap();
        assert_eq!(shop.payout_ledger_for("p4").await.unwrap().transferred, 1);
        let attempts: Vec<u32> = shop
            .payout_timings()
            .await
            .unwrap()
            .bank_calls
            .iter()
            .map(|c| c.attempt)
            .collect();
        assert_eq!(attempts, [1, 2, 3]);
    }
}
