//! The participants of the example sagas — inventory, payments, riders, airlines, hotels,
//! merchants' balances, a bank — as *idempotent consumers* in a store of their own.
//!
//! Every effect a participant performs is recorded in the same transaction as the idempotency key
//! that asked for it, through the library's idempotent consumer
//! ([`orchestrator::consumer::IdempotentConsumer`], table `saga_processed_messages`), so a call
//! made again with the same key — a retry after a lost reply, or the orchestrator resuming after
//! a crash — changes nothing and answers what the first call answered. The `ledger` table counts what really happened: it is the bank
//! statement that "charged exactly once" and "every reservation released" are checked against.
//!
//! The store is deliberately separate from the orchestrator's database: a real payment provider
//! does not share a transaction with its caller, and the examples must not cheat by doing so.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
#[cfg(feature = "postgres")]
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
#[cfg(feature = "postgres")]
use sqlx::Postgres;
use sqlx::{Row, Sqlite};

use orchestrator::consumer::{ConsumerError, IdempotentConsumer};

/// Why a participant call or a ledger query failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShopError {
    /// The URL is neither `sqlite:…` nor `postgres://…`.
    #[error("unsupported shop database URL {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// The URL names PostgreSQL, which this build leaves out.
    #[error("the shop database {0:?} is PostgreSQL: build example-sagas with --features postgres")]
    NotBuilt(String),
    /// The database failed (connection lost, busy past the timeout, …); usually transient.
    #[error("shop database: {0}")]
    Database(sqlx::Error),
    /// A stored result is not valid JSON: the store was tampered with.
    #[error("stored result is not JSON: {0}")]
    Json(serde_json::Error),
    /// The store holds an effect name this program does not know.
    #[error("unknown effect {0:?} in the shop store")]
    UnknownEffect(String),
    /// An idempotency key was used before for a different effect: a bug in the caller, since keys
    /// are per (saga, step, phase).
    #[error("idempotency key {key} was used for {stored}, now for {requested}")]
    KeyReused {
        /// The key.
        key: String,
        /// The effect recorded with it first.
        stored: Label,
        /// The effect asked for now.
        requested: Label,
    },
}

// Not `#[from]`: sqlx repeats its message in its `source()`, which would print every cause twice
// in an error chain; the message already carries it.
impl From<sqlx::Error> for ShopError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

impl ShopError {
    /// Whether the same call may succeed if made again (database trouble) or not (data errors).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Database(_))
    }
}

impl From<ShopError> for saga_dsl::StepError {
    /// Database trouble is retryable; inconsistent data is not, since retrying cannot fix it.
    fn from(e: ShopError) -> Self {
        if e.is_transient() {
            Self::retryable(e.to_string())
        } else {
            Self::permanent(e.to_string())
        }
    }
}

/// One kind of effect a participant can have, as stored with its key and in `ledger.effect`
/// (snake_case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Inventory: stock reserved for an order.
    Reserved,
    /// Inventory: a reservation released.
    Released,
    /// Payments: a card charged.
    Charged,
    /// Payments: a charge refunded.
    Refunded,
    /// Riders: a rider assigned to an order.
    RiderAssigned,
    /// Riders: a rider unassigned.
    RiderUnassigned,
    /// Airline: a flight booked.
    FlightBooked,
    /// Airline: a flight booking cancelled.
    FlightCancelled,
    /// Hotel: a room booked.
    HotelBooked,
    /// Hotel: a room booking cancelled.
    HotelCancelled,
    /// Car rental: a car rented.
    CarRented,
    /// Car rental: a rental returned (cancelled).
    CarReturned,
    /// Travel agency: the trip charged and confirmed (the pivot; never undone).
    TripCharged,
    /// Travel agency: the itinerary sent to the traveller.
    ItinerarySent,
    /// Warehouse: an order shipped (`fulfil_order`'s pivot; never undone).
    Shipped,
    /// Mail: the customer told.
    Notified,
    /// Balances: a merchant's balance debited for a payout.
    Debited,
    /// Balances: a payout's debit credited back.
    Credited,
    /// Bank: a payout's money transferred (`payout`'s pivot; never undone).
    Transferred,
    /// Mail: the merchant told of a payout; kept apart from [`Effect::Notified`] so that a
    /// payout is never read as a fulfilment.
    MerchantNotified,
}

impl Effect {
    /// Every effect, in declaration order.
    pub const ALL: [Self; 20] = [
        Self::Reserved,
        Self::Released,
        Self::Charged,
        Self::Refunded,
        Self::RiderAssigned,
        Self::RiderUnassigned,
        Self::FlightBooked,
        Self::FlightCancelled,
        Self::HotelBooked,
        Self::HotelCancelled,
        Self::CarRented,
        Self::CarReturned,
        Self::TripCharged,
        Self::ItinerarySent,
        Self::Shipped,
        Self::Notified,
        Self::Debited,
        Self::Credited,
        Self::Transferred,
        Self::MerchantNotified,
    ];

    /// The snake_case name stored in the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Released => "released",
            Self::Charged => "charged",
            Self::Refunded => "refunded",
            Self::RiderAssigned => "rider_assigned",
            Self::RiderUnassigned => "rider_unassigned",
            Self::FlightBooked => "flight_booked",
            Self::FlightCancelled => "flight_cancelled",
            Self::HotelBooked => "hotel_booked",
            Self::HotelCancelled => "hotel_cancelled",
            Self::CarRented => "car_rented",
            Self::CarReturned => "car_returned",
            Self::TripCharged => "trip_charged",
            Self::ItinerarySent => "itinerary_sent",
            Self::Shipped => "shipped",
            Self::Notified => "notified",
            Self::Debited => "debited",
            Self::Credited => "credited",
            Self::Transferred => "transferred",
            Self::MerchantNotified => "merchant_notified",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Effect {
    type Err = ShopError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| ShopError::UnknownEffect(s.to_owned()))
    }
}

/// An effect as the ledger and the processed keys record it: its kind, and for an effect on one
/// item of an order, the item (`reserved:sku-1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    /// What happened.
    pub effect: Effect,
    /// To which item, if it is about one.
    pub item: Option<String>,
}

impl Label {
    /// `effect` on the item `item`.
    pub fn item(effect: Effect, item: &str) -> Self {
        Self {
            effect,
            item: Some(item.to_owned()),
        }
    }

    /// Whether it belongs to a `fulfil_order` (an effect on an item, shipping, notifying).
    pub fn is_fulfilment(&self) -> bool {
        self.item.is_some() || matches!(self.effect, Effect::Shipped | Effect::Notified)
    }
}

impl From<Effect> for Label {
    fn from(effect: Effect) -> Self {
        Self { effect, item: None }
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.item {
            Some(item) => write!(f, "{}:{item}", self.effect),
            None => write!(f, "{}", self.effect),
        }
    }
}

impl FromStr for Label {
    type Err = ShopError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some((effect, item)) => Ok(Self::item(effect.parse()?, item)),
            None => Ok(s.parse::<Effect>()?.into()),
        }
    }
}

/// How many times each `place_order` effect really happened for one order.
///
/// All six counters are always present (0 when none), so the JSON of [`Shop::ledger`] is
/// `{"<order_id>": {"reserved": n, "released": n, "charged": n, "refunded": n,
/// "rider_assigned": n, "rider_unassigned": n}}`. A compensated order nets to zero:
/// `reserved == released`, `charged == refunded`, `rider_assigned == rider_unassigned`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// Stock reservations.
    pub reserved: u64,
    /// Reservations released.
    pub released: u64,
    /// Charges.
    pub charged: u64,
    /// Refunds.
    pub refunded: u64,
    /// Riders assigned.
    pub rider_assigned: u64,
    /// Riders unassigned.
    pub rider_unassigned: u64,
}

impl LedgerEntry {
    /// Adds `n` to the counter of `effect`; `false` if it is not a `place_order` effect.
    fn add(&mut self, effect: Effect, n: u64) -> bool {
        let counter = match effect {
            Effect::Reserved => &mut self.reserved,
            Effect::Released => &mut self.released,
            Effect::Charged => &mut self.charged,
            Effect::Refunded => &mut self.refunded,
            Effect::RiderAssigned => &mut self.rider_assigned,
            Effect::RiderUnassigned => &mut self.rider_unassigned,
            _ => return false,
        };
        *counter += n;
        true
    }
}

/// How many times each `book_trip` effect really happened for one trip; the trip counterpart of
/// [`LedgerEntry`], kept apart so that the `place_order` ledger keeps its exact six-field shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TripLedgerEntry {
    /// Flights booked.
    pub flight_booked: u64,
    /// Flight bookings cancelled.
    pub flight_cancelled: u64,
    /// Hotel rooms booked.
    pub hotel_booked: u64,
    /// Hotel bookings cancelled.
    pub hotel_cancelled: u64,
    /// Cars rented.
    pub car_rented: u64,
    /// Car rentals returned.
    pub car_returned: u64,
    /// Trips charged (the pivot).
    pub trip_charged: u64,
    /// Itineraries sent.
    pub itinerary_sent: u64,
}

impl TripLedgerEntry {
    /// Adds `n` to the counter of `effect`; `false` if it is not a `book_trip` effect.
    fn add(&mut self, effect: Effect, n: u64) -> bool {
        let counter = match effect {
            Effect::FlightBooked => &mut self.flight_booked,
            Effect::FlightCancelled => &mut self.flight_cancelled,
            Effect::HotelBooked => &mut self.hotel_booked,
            Effect::HotelCancelled => &mut self.hotel_cancelled,
            Effect::CarRented => &mut self.car_rented,
            Effect::CarReturned => &mut self.car_returned,
            Effect::TripCharged => &mut self.trip_charged,
            Effect::ItinerarySent => &mut self.itinerary_sent,
            _ => return false,
        };
        *counter += n;
        true
    }
}

/// How many times each `payout` effect really happened for one payout: `{"debited": n,
/// "credited": n, "transferred": n, "notified": n}`, all four always present. A compensated
/// payout nets to zero (`debited == credited`, nothing transferred); a completed one shows
/// each of `debited`, `transferred` and `notified` once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayoutLedgerEntry {
    /// Balances debited.
    pub debited: u64,
    /// Debits credited back.
    pub credited: u64,
    /// Transfers sent (the pivot).
    pub transferred: u64,
    /// Merchants told.
    pub notified: u64,
}

impl PayoutLedgerEntry {
    /// Adds `n` to the counter of `effect`; `false` if it is not a `payout` effect.
    fn add(&mut self, effect: Effect, n: u64) -> bool {
        let counter = match effect {
            Effect::Debited => &mut self.debited,
            Effect::Credited => &mut self.credited,
            Effect::Transferred => &mut self.transferred,
            Effect::MerchantNotified => &mut self.notified,
            _ => return false,
        };
        *counter += n;
        true
    }
}

/// The result stored under an action's key when its compensation ran first (the action's
/// outcome was unknown and it had not happened): a late or retried action then finds the key
/// taken and does nothing. See [`is_voided`].
const VOIDED_BY: &str = "voided_by_compensation";

/// Whether a result returned by [`Shop::apply_once`] means the action was voided by its
/// compensation before it could happen, so nothing was done.
pub fn is_voided(result: &Value) -> bool {
    result.get(VOIDED_BY).is_some()
}

/// The SQL of one backend. Both dialects share the statements; only placeholders, the
/// auto-increment column and the way a write transaction begins differ.
struct Dialect {
    /// SQLite takes its write lock up front (`BEGIN IMMEDIATE`) so two writers never deadlock
    /// upgrading read locks; Postgres locks rows as it goes.
    begin: &'static str,
    create: &'static [&'static str],
    insert_ledger: &'static str,
    select_amount: &'static str,
    counts_all: &'static str,
    counts_for: &'static str,
    /// The payout participants' own notes.
    timings: &'static timings::TimingSql,
}

const SQLITE: Dialect = Dialect {
    begin: "BEGIN IMMEDIATE",
    create: &[
        "CREATE TABLE IF NOT EXISTS ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, \
         order_id TEXT NOT NULL, effect TEXT NOT NULL, key TEXT NOT NULL, amount BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS ledger_order_id ON ledger (order_id)",
        "CREATE INDEX IF NOT EXISTS ledger_key ON ledger (key)",
    ],
    insert_ledger: "INSERT INTO ledger (order_id, effect, key, amount) VALUES (?1, ?2, ?3, ?4)",
    select_amount: "SELECT amount FROM ledger WHERE key = ?1",
    counts_all: "SELECT order_id, effect, COUNT(*) AS n FROM ledger GROUP BY order_id, effect",
    counts_for: "SELECT order_id, effect, COUNT(*) AS n FROM ledger WHERE order_id = ?1 \
                 GROUP BY order_id, effect",
    timings: &timings::SQLITE_TIMINGS,
};

#[cfg(feature = "postgres")]
const POSTGRES: Dialect = Dialect {
    begin: "BEGIN",
    create: &[
        // Several processes may open the store at once, and concurrent CREATE TABLE IF NOT
        // EXISTS can still collide in the Postgres catalog: serialise them on an advisory lock.
        "SELECT pg_advisory_xact_lock(7420151)",
        "CREATE TABLE IF NOT EXISTS ledger (id BIGSERIAL PRIMARY KEY, \
         order_id TEXT NOT NULL, effect TEXT NOT NULL, key TEXT NOT NULL, amount BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS ledger_order_id ON ledger (order_id)",
        "CREATE INDEX IF NOT EXISTS ledger_key ON ledger (key)",
    ],
    insert_ledger: "INSERT INTO ledger (order_id, effect, key, amount) VALUES ($1, $2, $3, $4)",
    select_amount: "SELECT amount FROM ledger WHERE key = $1",
    counts_all: "SELECT order_id, effect, COUNT(*) AS n FROM ledger GROUP BY order_id, effect",
    counts_for: "SELECT order_id, effect, COUNT(*) AS n FROM ledger WHERE order_id = $1 \
                 GROUP BY order_id, effect",
    timings: &timings::POSTGRES_TIMINGS,
};

/// The participants' keys, on one backend: the library's consumer over the shop's pool.
#[derive(Debug, Clone)]
enum Pool {
    Sqlite(IdempotentConsumer<Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(IdempotentConsumer<Postgres>),
}

/// The consumer name of the shop's keys in `saga_processed_messages`.
const CONSUMER: &str = "shop";

/// What is stored with a key: the effect it was used for (a key is for one effect only) and
/// the answer given.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Recorded {
    effect: String,
    result: Value,
}

impl Recorded {
    /// The answer, after checking the key was used for `effect`.
    fn for_effect(self, key: &str, effect: Label) -> Result<Value, ShopError> {
        let stored: Label = self.effect.parse()?;
        if stored != effect {
            return Err(ShopError::KeyReused {
                key: key.to_owned(),
                stored,
                requested: effect,
            });
        }
        Ok(self.result)
    }
}

impl From<ConsumerError<ShopError>> for ShopError {
    fn from(e: ConsumerError<ShopError>) -> Self {
        match e {
            ConsumerError::Database(e) => Self::Database(e),
            ConsumerError::Work(e) => e,
            ConsumerError::StoredResult { cause, .. } => Self::Json(cause),
        }
    }
}

/// Runs `$body` once per backend with `$pool` bound to the concrete pool and `$sql` to its
/// [`Dialect`]: the statements are the same, only the types differ, and a macro keeps one copy of
/// the logic without sqlx's heavy generic bounds.
macro_rules! on_backend {
    ($shop:expr, |$consumer:ident, $pool:ident, $sql:ident| $body:expr) => {
        match &$shop.pool {
            Pool::Sqlite($consumer) => {
                let $pool = $consumer.pool();
                let $sql = &SQLITE;
                $body
            }
            #[cfg(feature = "postgres")]
            Pool::Postgres($consumer) => {
                let $pool = $consumer.pool();
                let $sql = &POSTGRES;
                $body
            }
        }
    };
}

mod timings;
pub use timings::{now_ms, BankCall, PayoutMark, PayoutTimes, PayoutTimings};

/// The participants' store: a SQLite file or a Postgres database, never the orchestrator's.
///
/// Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Shop {
    pool: Pool,
}

impl Shop {
    /// Opens the store at `url` and creates its tables if missing.
    ///
    /// - `sqlite://PATH` (or `sqlite:PATH`): the file is created if missing and opened in WAL mode
    ///   with `synchronous=FULL`, so an acknowledged effect survives power loss, and with a busy
    ///   timeout, so concurrent writers wait instead of failing.
    /// - `postgres://…` or `postgresql://…`: any number of processes may share the database.
    pub async fn open(url: &str) -> Result<Shop, ShopError> {
        let pool = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(10));
            // Every connection to `:memory:` is its own database: keep one.
            let max = if url.contains(":memory:") { 1 } else { 4 };
            Pool::Sqlite(IdempotentConsumer::new(
                SqlitePoolOptions::new()
                    .max_connections(max)
                    .connect_with(options)
                    .await?,
                CONSUMER,
            ))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(not(feature = "postgres"))]
            return Err(ShopError::NotBuilt(url.to_owned()));
            #[cfg(feature = "postgres")]
            Pool::Postgres(IdempotentConsumer::new(
                PgPoolOptions::new().max_connections(8).connect(url).await?,
                CONSUMER,
            ))
        } else {
            return Err(ShopError::UnsupportedUrl(url.to_owned()));
        };
        let shop = Shop { pool };
        shop.create_tables().await?;
        Ok(shop)
    }

    async fn create_tables(&self) -> Result<(), ShopError> {
        on_backend!(self, |consumer, pool, sql| {
            let mut tx = pool.begin_with(sql.begin).await?;
            for statement in sql.create.iter().chain(sql.timings.create) {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            consumer.migrate().await?;
        });
        Ok(())
    }

    /// Performs `effect` for `order_id` at most once per idempotency `key`.
    ///
    /// In one transaction: records `key` in `processed_messages`; if it is new, appends the ledger
    /// row (`amount` is money in the smallest unit for charges, 0 where meaningless) and returns
    /// `result`; if the key was seen before, appends nothing and returns the result stored the
    /// first time — so a retried call is a no-op that answers like the first one. When the key
    /// was voided by a compensation that ran first, the stored marker is returned; test it with
    /// [`is_voided`].
    pub async fn apply_once(
        &self,
        key: &str,
        effect: impl Into<Label>,
        order_id: &str,
        amount: i64,
        result: Value,
    ) -> Result<Value, ShopError> {
        let effect: Label = effect.into();
        let label = effect.to_string();
        // Owned: the work may outlive any borrow (see `WorkFuture`).
        let (order_id, ledger_key) = (order_id.to_owned(), key.to_owned());
        let recorded = on_backend!(self, |consumer, _pool, sql| {
            consumer
                .process(key, move |conn| {
                    Box::pin(async move {
                        sqlx::query(sql.insert_ledger)
                            .bind(&order_id)
                            .bind(&label)
                            .bind(&ledger_key)
                            .bind(amount)
                            .execute(&mut *conn)
                            .await?;
                        Ok::<_, ShopError>(Recorded {
                            effect: label,
                            result,
                        })
                    })
                })
                .await?
        });
        recorded.into_inner().for_effect(key, effect)
    }

    /// Undoes, at most once per compensation `key`, what the action with `action_key` did.
    ///
    /// Works whether or not the action's outcome is known. In one transaction: records `key`; if
    /// it was seen before, returns what was decided then. Otherwise it tries to claim
    /// `action_key` for `action_effect` with a "voided" marker:
    /// - the claim succeeds: the action never happened, so there is nothing to undo and no
    ///   ledger row; a late or retried action will now find its key taken and do nothing;
    /// - the key is taken: the action happened, so the `undo` effect is appended to the ledger
    ///   with the action's own amount (a refund returns exactly what was charged).
    ///
    /// Returns whether something was undone. Either way the ledger nets to zero.
    pub async fn undo_once(
        &self,
        key: &str,
        action_key: &str,
        action_effect: impl Into<Label>,
        undo: impl Into<Label>,
        order_id: &str,
    ) -> Result<bool, ShopError> {
        let (action_effect, undo): (Label, Label) = (action_effect.into(), undo.into());
        let (action_label, undo_label) = (action_effect.to_string(), undo.to_string());
        let (order_id, undo_key, action_key) =
            (order_id.to_owned(), key.to_owned(), action_key.to_owned());
        let recorded = on_backend!(self, |consumer, _pool, sql| {
            let keys = consumer.clone();
            consumer
                .process(key, move |conn| {
                    Box::pin(async move {
                        let voided = Recorded {
                            effect: action_label,
                            result: serde_json::json!({ VOIDED_BY: undo_key }),
                        };
                        let taken = keys
                            .record::<Recorded, _, ShopError>(conn, &action_key, Some(&voided))
                            .await?;
                        let undone = taken.is_some();
                        if undone {
                            // The action's own ledger row tells what to give back; a voided
                            // action has none.
                            let amount: i64 = sqlx::query(sql.select_amount)
                                .bind(&action_key)
                                .fetch_optional(&mut *conn)
                                .await?
                                .map(|row| row.try_get("amount"))
                                .transpose()?
                                .unwrap_or(0);
                            sqlx::query(sql.insert_ledger)
                                .bind(&order_id)
                                .bind(&undo_label)
                                .bind(&undo_key)
                                .bind(amount)
                                .execute(&mut *conn)
                                .await?;
                        }
                        Ok::<_, ShopError>(Recorded {
                            effect: undo_label,
                            result: serde_json::json!({ "undone": undone }),
                        })
                    })
                })
                .await?
        });
        let result = recorded.into_inner().for_effect(key, undo)?;
        Ok(result.get("undone").and_then(Value::as_bool) == Some(true))
    }

    /// Counts ledger rows per (order id, effect), for every order or one.
    async fn counts(&self, order_id: Option<&str>) -> Result<Vec<(String, Label, u64)>, ShopError> {
        let rows = on_backend!(self, |_consumer, pool, sql| {
            let mut out = Vec::new();
            let rows = match order_id {
                Some(id) => sqlx::query(sql.counts_for).bind(id).fetch_all(pool).await?,
                None => sqlx::query(sql.counts_all).fetch_all(pool).await?,
            };
            for row in rows {
                let n: i64 = row.try_get("n")?;
                out.push((
                    row.try_get::<String, _>("order_id")?,
                    row.try_get::<String, _>("effect")?,
                    n,
                ));
            }
            out
        });
        rows.into_iter()
            .map(|(order, effect, n)| Ok((order, effect.parse()?, u64::try_from(n).unwrap_or(0))))
            .collect()
    }

    /// Per order id, how many times each `place_order` effect really happened. Orders with no
    /// `place_order` effect (trips) and `fulfil_order` orders are left out.
    pub async fn ledger(&self) -> Result<BTreeMap<String, LedgerEntry>, ShopError> {
        let counts = self.counts(None).await?;
        let fulfilments: std::collections::BTreeSet<&str> = counts
            .iter()
            .filter(|(_, label, _)| label.is_fulfilment())
            .map(|(order, _, _)| order.as_str())
            .collect();
        let mut out: BTreeMap<String, LedgerEntry> = BTreeMap::new();
        for (order, label, n) in &counts {
            if fulfilments.contains(order.as_str()) || label.item.is_some() {
                continue;
            }
            let mut entry = out.get(order).copied().unwrap_or_default();
            if entry.add(label.effect, *n) {
                out.insert(order.clone(), entry);
            }
        }
        Ok(out)
    }

    /// The `place_order` counters of one order; all zero if it never did anything.
    pub async fn ledger_for(&self, order_id: &str) -> Result<LedgerEntry, ShopError> {
        let mut entry = LedgerEntry::default();
        for (_, label, n) in self.counts(Some(order_id)).await? {
            if label.item.is_none() {
                entry.add(label.effect, n);
            }
        }
        Ok(entry)
    }

    /// Per `fulfil_order` order id, how many times each of its effects really happened, by
    /// ledger key: `reserved:<sku>`, `released:<sku>`, `charged`, `refunded`, `shipped`,
    /// `notified` (only those that happened).
    pub async fn fulfilment_ledger(
        &self,
    ) -> Result<BTreeMap<String, BTreeMap<String, u64>>, ShopError> {
        let counts = self.counts(None).await?;
        let fulfilments: std::collections::BTreeSet<String> = counts
            .iter()
            .filter(|(_, label, _)| label.is_fulfilment())
            .map(|(order, _, _)| order.clone())
            .collect();
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (order, label, n) in counts {
            if fulfilments.contains(&order) {
                *out.entry(order)
                    .or_default()
                    .entry(label.to_string())
                    .or_default() += n;
            }
        }
        Ok(out)
    }

    /// The `fulfil_order` counters of one order, by ledger key (see
    /// [`Shop::fulfilment_ledger`]); empty if it never did anything.
    pub async fn fulfilment_ledger_for(
        &self,
        order_id: &str,
    ) -> Result<BTreeMap<String, u64>, ShopError> {
        let mut out = BTreeMap::new();
        for (_, label, n) in self.counts(Some(order_id)).await? {
            *out.entry(label.to_string()).or_default() += n;
        }
        Ok(out)
    }

    /// Per trip id, how many times each `book_trip` effect really happened.
    pub async fn trip_ledger(&self) -> Result<BTreeMap<String, TripLedgerEntry>, ShopError> {
        let mut out: BTreeMap<String, TripLedgerEntry> = BTreeMap::new();
        for (trip, label, n) in self.counts(None).await? {
            let mut entry = out.get(&trip).copied().unwrap_or_default();
            if label.item.is_none() && entry.add(label.effect, n) {
                out.insert(trip, entry);
            }
        }
        Ok(out)
    }

    /// The `book_trip` counters of one trip; all zero if it never did anything.
    pub async fn trip_ledger_for(&self, trip_id: &str) -> Result<TripLedgerEntry, ShopError> {
        let mut entry = TripLedgerEntry::default();
        for (_, label, n) in self.counts(Some(trip_id)).await? {
            if label.item.is_none() {
                entry.add(label.effect, n);
            }
        }
        Ok(entry)
    }

    /// Per payout id, how many times each `payout` effect really happened.
    pub async fn payout_ledger(&self) -> Result<BTreeMap<String, PayoutLedgerEntry>, ShopError> {
        let mut out: BTreeMap<String, PayoutLedgerEntry> = BTreeMap::new();
        for (payout, label, n) in self.counts(None).await? {
            let mut entry = out.get(&payout).copied().unwrap_or_default();
            if label.item.is_none() && entry.add(label.effect, n) {
                out.insert(payout, entry);
            }
        }
        Ok(out)
    }

    /// The `payout` counters of one payout; all zero if it never did anything.
    pub async fn payout_ledger_for(&self, payout_id: &str) -> Result<PayoutLedgerEntry, ShopError> {
        let mut entry = PayoutLedgerEntry::default();
        for (_, label, n) in self.counts(Some(payout_id)).await? {
            if label.item.is_none() {
                entry.add(label.effect, n);
            }
        }
        Ok(entry)
    }

    /// Closes the pool, waiting for connections to finish (a clean WAL checkpoint on SQLite).
    pub async fn close(&self) {
        match &self.pool {
            Pool::Sqlite(consumer) => consumer.pool().close().await,
            #[cfg(feature = "postgres")]
            Pool::Postgres(consumer) => consumer.pool().close().await,
        }
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with the error in the panic message.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) async fn temp_shop() -> (tempfile::TempDir, Shop) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let shop = Shop::open(&url).await.unwrap();
        (dir, shop)
    }

    #[tokio::test]
    async fn apply_once_is_idempotent() {
        let (_dir, shop) = temp_shop().await;
        let first = shop
            .apply_once("k1", Effect::Charged, "o1", 500, json!({"charge_id": "a"}))
            .await
            .unwrap();
        let second = shop
            .apply_once("k1", Effect::Charged, "o1", 500, json!({"charge_id": "b"}))
            .await
            .unwrap();
        assert_eq!(first, json!({"charge_id": "a"}));
        assert_eq!(
            second, first,
            "a retry answers what the first call answered"
        );
        assert_eq!(shop.ledger_for("o1").await.unwrap().charged, 1);
        // The same key for another effect is a caller bug, reported rather than hidden.
        let err = shop
            .apply_once("k1", Effect::Refunded, "o1", 500, json!(null))
            .await
            .unwrap_err();
        assert!(matches!(err, ShopError::KeyReused { .. }), "{err}");
    }

    #[tokio::test]
    async fn ledger_json_shape() {
        let (_dir, shop) = temp_shop().await;
        shop.apply_once("a", Effect::Reserved, "o1", 0, json!(1))
            .await
            .unwrap();
        shop.apply_once("b", Effect::Charged, "o1", 700, json!(2))
            .await
            .unwrap();
        shop.apply_once("c", Effect::FlightBooked, "t1", 0, json!(3))
            .await
            .unwrap();
        let ledger = serde_json::to_value(shop.ledger().await.unwrap()).unwrap();
        assert_eq!(
            ledger,
            json!({"o1": {"reserved": 1, "released": 0, "charged": 1, "refunded": 0,
                          "rider_assigned": 0, "rider_unassigned": 0}})
        );
        let trips = shop.trip_ledger().await.unwrap();
        assert_eq!(trips.len(), 1);
        assert_eq!(trips["t1"].flight_booked, 1);
        assert_eq!(
            shop.ledger_for("nobody").await.unwrap(),
            LedgerEntry::default()
        );
    }

    #[tokio::test]
    async fn payouts_have_a_ledger_of_their_own() {
        let (_dir, shop) = temp_shop().await;
        shop.apply_once("d", Effect::Debited, "p1", 900, json!(1))
            .await
            .unwrap();
        shop.apply_once("t", Effect::Transferred, "p1", 900, json!(2))
            .await
            .unwrap();
        shop.apply_once("n", Effect::MerchantNotified, "p1", 0, json!(3))
            .await
            .unwrap();
        shop.apply_once("s", Effect::Shipped, "f1", 0, json!(4))
            .await
            .unwrap();
        let payouts = serde_json::to_value(shop.payout_ledger().await.unwrap()).unwrap();
        assert_eq!(
            payouts,
            json!({"p1": {"debited": 1, "credited": 0, "transferred": 1, "notified": 1}})
        );
        // Nor is a payout an order or a fulfilment.
        assert!(shop.ledger().await.unwrap().is_empty());
        let fulfilments = shop.fulfilment_ledger().await.unwrap();
        assert_eq!(fulfilments.keys().collect::<Vec<_>>(), ["f1"]);
        assert!(shop.trip_ledger().await.unwrap().is_empty());
        assert_eq!(
            shop.payout_ledger_for("nobody").await.unwrap(),
            PayoutLedgerEntry::default()
        );
    }

    #[tokio::test]
    async fn timings_keep_every_call_and_each_payouts_window() {
        let (_dir, shop) = temp_shop().await;
        let first = shop.record_bank_call("p1", "m1", 1).await.unwrap();
        let again = shop.record_bank_call("p1", "m1", 1).await.unwrap();
        shop.record_bank_call("p2", "m2", 1).await.unwrap();
        let started = shop
            .record_payout_mark("p1", "m1", PayoutMark::DebitStarted)
            .await
            .unwrap();
        shop.record_payout_mark("p1", "m1", PayoutMark::DebitStarted)
            .await
            .unwrap();
        shop.record_payout_mark("p1", "m1", PayoutMark::NotifyEnded)
            .await
            .unwrap();
        let ended = shop
            .record_payout_mark("p1", "m1", PayoutMark::NotifyEnded)
            .await
            .unwrap();
        let timings = shop.payout_timings().await.unwrap();
        assert_eq!(timings.bank_calls.len(), 3, "duplicates are calls too");
        assert_eq!(
            (timings.bank_calls[0].at, timings.bank_calls[1].at),
            (first, again)
        );
        assert_eq!(
            timings.payouts["p1"],
            PayoutTimes {
                merchant: "m1".into(),
                debit_started_at: Some(started),
                notify_ended_at: Some(ended),
                credit_ended_at: None,
            },
            "the first start and the last end"
        );
        assert!(!timings.payouts.contains_key("p2"), "p2 never started");
        let value = serde_json::to_value(&timings).unwrap();
        assert_eq!(
            value["bank_calls"][2],
            json!({"payout_id": "p2", "merchant": "m2", "at": timings.bank_calls[2].at,
                   "attempt": 1})
        );
    }

    #[tokio::test]
    async fn undo_after_the_action_refunds_its_amount_once() {
        let (_dir, shop) = temp_shop().await;
        shop.apply_once("act", Effect::Charged, "o1", 1250, json!({}))
            .await
            .unwrap();
        for _ in 0..2 {
            let undone = shop
                .undo_once("comp", "act", Effect::Charged, Effect::Refunded, "o1")
                .await
                .unwrap();
            assert!(undone);
        }
        let entry = shop.ledger_for("o1").await.unwrap();
        assert_eq!((entry.charged, entry.refunded), (1, 1));
    }

    #[tokio::test]
    async fn undo_before_the_action_voids_it() {
        let (_dir, shop) = temp_shop().await;
        let undone = shop
            .undo_once("comp", "act", Effect::Reserved, Effect::Released, "o1")
            .await
            .unwrap();
        assert!(!undone, "nothing to undo");
        // A late action finds its key taken by the compensation and does nothing.
        let late = shop
            .apply_once(
                "act",
                Effect::Reserved,
                "o1",
                0,
                json!({"reservation_id": "r"}),
            )
            .await
            .unwrap();
        assert!(is_voided(&late), "{late}");
        assert_eq!(shop.ledger_for("o1").await.unwrap(), LedgerEntry::default());
        assert!(shop.ledger().await.unwrap().is_empty());
        // The compensation's retry keeps its first decision.
        let again = shop
            .undo_once("comp", "act", Effect::Reserved, Effect::Released, "o1")
            .await
            .unwrap();
        assert!(!again);
    }

    #[tokio::test]
    async fn rejects_unknown_urls_and_reopens() {
        assert!(matches!(
            Shop::open("mysql://x").await,
            Err(ShopError::UnsupportedUrl(_))
        ));
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let shop = Shop::open(&url).await.unwrap();
        shop.apply_once("k", Effect::Reserved, "o", 0, json!(null))
            .await
            .unwrap();
        shop.close().await;
        let again = Shop::open(&url).await.unwrap();
        assert_eq!(again.ledger_for("o").await.unwrap().reserved, 1);
        assert_eq!(
            "rider_assigned".parse::<Effect>().unwrap(),
            Effect::RiderAssigned
        );
    }
}
