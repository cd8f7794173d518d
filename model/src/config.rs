//! What a check explores: how many workers, how many of each fault, which gateway
//! and token store, the look-up policy, the assumptions the guarantees rest on
//! (each a switch), and at most one mutant of the code's guards.

use payment_worker::payment::decisions::GatewayLookup;

/// Which gateway the workers charge through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GatewayKind {
    /// The charges API: one POST under the command's key, the key joins repeats.
    Charges,
    /// Stripe: a PaymentIntent created and confirmed under per-attempt keys.
    Stripe,
}

/// Where the tokens live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// Redis: fast, and may lose every token at once.
    Redis,
    /// Postgres: the token is settled inside the payment's own transaction.
    Postgres,
}

/// A guard of the code, removed in the model: each must make a property fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mutant {
    /// No fence check before COMMIT (`transact`'s extend / `confirm_in`).
    NoFenceCheck,
    /// No look-up before charging when the fence is above 1 or the previous holder
    /// is a stranger (`charge_history`, `evidence_after`).
    NoTakeoverLookup,
    /// Restore without checking the owner (the token store's `restore`).
    RestoreAnyOwner,
    /// No row in `unresolved_charges` when a delivery ends with its charge unknown.
    NoUnresolvedFlag,
    /// No lease check before the Stripe create and confirm (`LeaseCheck`).
    NoStripeLeaseCheck,
}

/// The assumptions the guarantees rest on (docs/CONTRACT.md, "What the guarantees
/// assume"). `true` is the assumption held; `false` lets the model break it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assumptions {
    /// The gateway keeps an idempotency key at least as long as a token lives.
    pub key_retention: bool,
    /// A committed Postgres transaction is never lost.
    pub postgres_durability: bool,
    /// A lease runs at least half its length after it was asked for or renewed: the
    /// holder's clock and the store's agree within that bound.
    /// It also bounds a pause between the fence check and COMMIT to that half.
    pub lease_clock: bool,
    /// The retry budget outlasts a lease (plus two gateway timeouts): a delivery
    /// that meets another holder's lease waits it out within its budget.
    pub retry_outlasts_lease: bool,
    /// A delivery superseded by a rebalance (its partition revoked, a later
    /// delivery of the record under way) starts no attempt. The code stops its
    /// retries (a drain lets the running attempt finish, then no other) but still
    /// runs the first attempt of a command already admitted.
    pub superseded_start_nothing: bool,
}

impl Default for Assumptions {
    fn default() -> Self {
        Self {
            key_retention: true,
            postgres_durability: true,
            lease_clock: true,
            retry_outlasts_lease: true,
            superseded_start_nothing: true,
        }
    }
}

/// One bounded system to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Workers running the processor.
    pub workers: usize,
    /// Attempts a delivery makes before it is dead-lettered.
    pub attempts: u8,
    /// Worker crashes (a crash rolls back its transaction and loses its state).
    pub crashes: u8,
    /// Lease expiries (at any moment the clock bound allows).
    pub expiries: u8,
    /// Zombies: a worker paused past its lease (its session dropped), then resumed.
    pub zombies: u8,
    /// Losses of every token (Redis only).
    pub wipes: u8,
    /// Gateway faults: timeouts, 5xx after charging, failed look-ups, unreachable.
    pub faults: u8,
    /// Kafka redeliveries of a record already being processed (a rebalance).
    pub redeliveries: u8,
    /// Replays of the partition from offset 0.
    pub replays: u8,
    /// `dlq redrive` of the dead letter.
    pub redrives: u8,
    pub gateway: GatewayKind,
    pub store: StoreKind,
    pub lookup: GatewayLookup,
    pub assumptions: Assumptions,
    pub mutant: Option<Mutant>,
    /// The gateway charges every POST anew, key or not (its look-up still finds a
    /// charge by key): what `--gateway-lookup always` is for, and what the look-up
    /// on a takeover (fence > 1, a stranger predecessor) guards against.
    pub gateway_ignores_keys: bool,
}

impl Config {
    /// The configuration CI checks: small enough for well under a minute.
    pub fn ci(gateway: GatewayKind, store: StoreKind) -> Self {
        Self {
            workers: 2,
            attempts: 2,
            crashes: 1,
            expiries: 2,
            zombies: 1,
            wipes: 1,
            faults: 2,
            redeliveries: 1,
            replays: 1,
            redrives: 1,
            gateway,
            store,
            lookup: GatewayLookup::Uncertain,
            assumptions: Assumptions::default(),
            mutant: None,
            gateway_ignores_keys: false,
        }
    }

    pub fn mutated(&self, mutant: Mutant) -> bool {
        self.mutant == Some(mutant)
    }
}
