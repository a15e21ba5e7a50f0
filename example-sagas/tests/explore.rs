//! Every crash point of `fulfil_order` and `payout`, completing and compensating: the engine is
//! stopped just before and just after each write to its step log, as a kill -9 would stop it,
//! resumed on the same log until the saga ends, and the shop's ledger is checked each time.
//! The shop is a SQLite database of its own, as in production, opened afresh for every run.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use example_sagas::shop::{PayoutLedgerEntry, Shop};
use orchestrator::SagaStatus;
use saga_dsl::Registry;
use saga_test::{explore, Attempt, Report};
use serde_json::{json, Value};

/// The participants of one run: the shop, with a runtime of its own that outlives the kit's
/// process lifetimes (each a runtime the kit drops at a crash), as another service would.
struct ShopWorld {
    shop: Arc<Shop>,
    rt: tokio::runtime::Runtime,
    // Held for its lifetime: the shop's database file.
    _dir: tempfile::TempDir,
}

impl ShopWorld {
    /// A new shop on a new temporary file, and the example sagas working against it.
    fn open() -> (Registry, Self) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let shop = Arc::new(rt.block_on(Shop::open(&url)).unwrap());
        let registry = example_sagas::registry(shop.clone()).unwrap();
        let world = Self {
            shop,
            rt,
            _dir: dir,
        };
        (registry, world)
    }

    /// Reads the shop from a check, which runs outside any runtime.
    fn read<T, F: Future<Output = Result<T, example_sagas::shop::ShopError>>>(
        &self,
        read: impl FnOnce(Arc<Shop>) -> F,
    ) -> T {
        self.rt.block_on(read(self.shop.clone())).unwrap()
    }

    fn fulfilment(&self, order: &str) -> BTreeMap<String, u64> {
        self.read(|shop| async move { shop.fulfilment_ledger_for(order).await })
    }

    fn payout(&self, payout: &str) -> PayoutLedgerEntry {
        self.read(|shop| async move { shop.payout_ledger_for(payout).await })
    }
}

impl Drop for ShopWorld {
    fn drop(&mut self) {
        // Closed in its own runtime, so its connections end cleanly before the runtime does.
        self.rt.block_on(self.shop.close());
    }
}

/// An order of three items, which needs no approval unless `extra` says so.
fn order(id: &str, extra: Value) -> Value {
    let mut input = json!({
        "order_id": id, "user": "ada", "amount": 4200,
        "items": [{"sku": "sku-1", "qty": 1}, {"sku": "sku-2", "qty": 2}, {"sku": "sku-3", "qty": 1}],
    });
    for (k, v) in extra.as_object().unwrap() {
        input[k] = v.clone();
    }
    input
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect()
}

/// Every crash point was explored: one run without a crash, then two per write.
fn explored(name: &str, report: &Report) {
    eprintln!("{name}: {report:?}");
    assert_eq!(report.runs, 1 + 2 * report.writes, "{report:?}");
}

#[test]
fn fulfil_order_completes_with_each_effect_once_after_a_crash_at_any_write() {
    let report = explore(ShopWorld::open)
        .start("fulfil_order", order("f-1", json!({})))
        .check(|ended, world| {
            assert_eq!(ended.status(), SagaStatus::Completed, "{:?}", ended.saga);
            assert_eq!(
                world.fulfilment("f-1"),
                counts(&[
                    ("reserved:sku-1", 1),
                    ("reserved:sku-2", 1),
                    ("reserved:sku-3", 1),
                    ("charged", 1),
                    ("shipped", 1),
                    ("notified", 1),
                ]),
                "each item reserved once, charged exactly once, shipped and told once"
            );
            // The customer is told the tracking number of the one shipment.
            let tracking = &ended.step_output("ship").unwrap()["tracking"];
            assert_eq!(
                &ended.step_output("notify_customer").unwrap()["tracking"],
                tracking
            );
        })
        .run();
    explored("fulfil_order completing", &report);
}

#[test]
fn fulfil_order_retried_completes_with_each_effect_once_in_two_orders_of_the_branches() {
    // A branch and the charge fail retryably first, so the crash points fall among retries
    // too; each seed has the branches' results arrive in another order.
    let trouble = json!({"reserve_items/sku-2": 2, "charge_payment": 1});
    let report = explore(ShopWorld::open)
        .start(
            "fulfil_order",
            order("f-3", json!({"simulate": {"transient_failures": trouble}})),
        )
        .seeds(0..2)
        .check(|ended, world| {
            assert_eq!(ended.status(), SagaStatus::Completed, "{:?}", ended.saga);
            assert_eq!(
                world.fulfilment("f-3"),
                counts(&[
                    ("reserved:sku-1", 1),
                    ("reserved:sku-2", 1),
                    ("reserved:sku-3", 1),
                    ("charged", 1),
                    ("shipped", 1),
                    ("notified", 1),
                ]),
                "retries and crashes repeat calls, never effects"
            );
            assert!(ended.attempts_of("charge_payment", "action").count() >= 2);
        })
        .run();
    eprintln!("fulfil_order retried: {report:?}");
    assert_eq!(report.seeds, 2);
    // Not a fixed count of writes: the example's retry policy draws its jitter outside the
    // seed, so two runs of one seed may group their writes differently.
    assert_eq!(report.runs, 2 + 2 * report.writes, "{report:?}");
}

#[test]
fn fulfil_order_refused_nets_to_zero_after_a_crash_at_any_write() {
    let report = explore(ShopWorld::open)
        .start(
            "fulfil_order",
            order("f-2", json!({"needs_approval": true})),
        )
        .signal("approval", json!({"approved": false, "by": "grace"}))
        .check(|ended, world| {
            assert_eq!(ended.status(), SagaStatus::Compensated, "{:?}", ended.saga);
            assert_eq!(
                world.fulfilment("f-2"),
                counts(&[
                    ("reserved:sku-1", 1),
                    ("released:sku-1", 1),
                    ("reserved:sku-2", 1),
                    ("released:sku-2", 1),
                    ("reserved:sku-3", 1),
                    ("released:sku-3", 1),
                    ("charged", 1),
                    ("refunded", 1),
                ]),
                "every reservation released and the charge refunded, once each; nothing shipped"
            );
        })
        .run();
    explored("fulfil_order compensating", &report);
}

#[test]
fn payout_completes_with_each_effect_once_after_a_crash_at_any_write() {
    let report = explore(ShopWorld::open)
        .start(
            "payout",
            json!({"payout_id": "p-1", "merchant": "acme", "amount": 4200}),
        )
        .check(|ended, world| {
            assert_eq!(ended.status(), SagaStatus::Completed, "{:?}", ended.saga);
            assert_eq!(
                world.payout("p-1"),
                PayoutLedgerEntry {
                    debited: 1,
                    credited: 0,
                    transferred: 1,
                    notified: 1,
                },
                "debited, transferred and told exactly once"
            );
            // The merchant is told of the one transfer made.
            let transfer = &ended.step_output("send_transfer").unwrap()["transfer_id"];
            assert_eq!(
                &ended.step_output("notify_merchant").unwrap()["transfer_id"],
                transfer
            );
        })
        .run();
    explored("payout completing", &report);
}

#[test]
fn payout_refused_by_the_bank_nets_to_zero_after_a_crash_at_any_write() {
    let report = explore(ShopWorld::open)
        .start(
            "payout",
            json!({"payout_id": "p-2", "merchant": "acme", "amount": 4200}),
        )
        // The bank refuses the transfer; a crash may cut the first call short, and the call
        // made again is refused too.
        .script("send_transfer", [Attempt::Permanent; 2])
        .check(|ended, world| {
            assert_eq!(ended.status(), SagaStatus::Compensated, "{:?}", ended.saga);
            assert_eq!(
                world.payout("p-2"),
                PayoutLedgerEntry {
                    debited: 1,
                    credited: 1,
                    transferred: 0,
                    notified: 0,
                },
                "the debit credited back once; nothing transferred"
            );
        })
        .run();
    explored("payout compensating", &report);
}
