//! The control loop: one task owns the runtime's state — each model's lifecycle, pause,
//! leases, failures, holds and figures, the turns, the awaited GPU release — and decides
//! every change with [`step::step`] (`step.rs`, `step/*.rs`). This module is the loop's
//! handle ([`Control`]) and its guards; `shell.rs` is the task.
//!
//! Callers post a [`Command`] and wait for their answer over a oneshot: a [`Turn`] (a guard
//! that posts [`Command::Done`] when dropped, so a caller that goes away — even between the
//! grant and its first poll — gives its turn back), busy, a move performed or refused, a
//! lease, a grant. Nobody waits on shared fields. A lifecycle move carries the caller's slot
//! work ([`Apply`]), which the loop performs only if it decides the move.
//!
//! What the loop owns, it publishes to the model's slot (where rows, admission and
//! housekeeping read it) before it answers, so what a caller was told is what every later
//! reader sees. An explicit unload
//! is announced with [`Control::unload_decided`] before it waits for its turn; from then on
//! no lease of the model is granted until its guard ends it.
//!
//! Pins are the one count admission changes without a round trip: a request that triggers
//! an auto-load increments its model's pin count ([`Pin`], kept in the model's entry)
//! before it asks for the load, so an eviction planned afterwards sees it; the last pin to
//! go posts [`Command::Unpinned`], and the loop reads the count itself when it takes a pin
//! command, so no wake-up is lost.
//!
//! Models join and leave at run time (a config reload): [`Control::add`] gives a new model
//! the next id; [`Control::retire`] makes one that left unloadable. Ids are never reused.

#[cfg(test)]
mod exhaust_tests;
#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod grant_tests;
#[cfg(test)]
mod idle_tests;
#[cfg(test)]
mod lane_tests;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod life_tests;
#[cfg(test)]
mod quarantine_tests;
#[cfg(test)]
mod retire_tests;

mod shell;
pub(crate) mod step;
#[cfg(test)]
mod step_tests;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod whole_tests;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use tokio::sync::{mpsc, oneshot};

pub(crate) use step::{
    ALL_GPUS, Change, Command, GpuRelease, GrantAsk, IdleAction, IdleDue, IdleSeen, LaneInfo,
    Lanes, LeaseCommand, LeaseRefusal, LoadFailed, ModelId, Moved, ReleaseAnswer, Rules, Stay,
    TurnKind,
};

use crate::entry::{ModelEntry, Slot};
use crate::events::Events;
use crate::grant::{Grant, Refusal};
use crate::lease::Lease;
use crate::quarantine::Refused;

/// How the loop answers a waiter.
pub(crate) enum Waiter {
    /// A turn, or busy.
    Turn(oneshot::Sender<Result<Turn, Busy>>),
    /// A lease operation's answer.
    Lease(oneshot::Sender<Result<Lease, LeaseRefusal>>),
    /// Whether a load may start.
    MayLoad(oneshot::Sender<Result<(), Refused>>),
    /// That every command posted before has been taken.
    Flush(oneshot::Sender<()>),
    /// A grant's plan, or its refusal.
    Grant(oneshot::Sender<Result<Grant, Refusal>>),
    /// A lifecycle move, decided and performed, or refused.
    Move(oneshot::Sender<Result<Moved, Stay>>),
    /// Whether a GPU load waits for a release.
    Release(oneshot::Sender<ReleaseAnswer>),
    /// How long a model has been idle and what for, if past a timeout.
    Idle(oneshot::Sender<Option<IdleDue>>),
    /// Whether a model left the config.
    Retire(oneshot::Sender<bool>),
}

/// What a decided lifecycle move does to the model's slot: run by the loop under the slot
/// lock, before it publishes the lifecycle the move leads to (so the phase it sets fits).
pub(crate) struct Apply(Box<dyn FnOnce(&mut Slot) + Send>);

impl Apply {
    pub(crate) fn new(apply: impl FnOnce(&mut Slot) + Send + 'static) -> Self {
        Self(Box::new(apply))
    }
}

impl std::fmt::Debug for Apply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Apply")
    }
}

/// A value handed between a task and the [`Apply`] of its move: what the move takes in
/// (left with the task when the move is refused) or gives back.
pub(crate) struct Handoff<T>(Arc<Mutex<Option<T>>>);

impl<T> Handoff<T> {
    /// Holding `value`, or nothing.
    pub(crate) fn new(value: Option<T>) -> Self {
        Self(Arc::new(Mutex::new(value)))
    }

    /// Takes what it holds.
    pub(crate) fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Puts `value` in.
    pub(crate) fn put(&self, value: T) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(value);
    }
}

impl<T> Clone for Handoff<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

/// The answer to an admin operation that got no turn.
#[derive(Debug)]
pub(crate) struct Busy;

/// The handle to the control loop. Cheap to clone; the loop ends when the last handle (and
/// the last turn and pin) is gone.
#[derive(Clone)]
pub(crate) struct Control {
    tx: mpsc::UnboundedSender<Command<Waiter, Apply>>,
    shared: Arc<Shared>,
}

struct Shared {
    /// Every model the loop knows, by id (the ids of models that left the config stay
    /// taken); grows by [`Control::add`].
    entries: Entries,
    /// The loop's receiver, settings and sink until it starts (at the first call in a
    /// runtime).
    pending: Mutex<Option<shell::Start>>,
    started: OnceLock<()>,
}

impl Control {
    /// A loop for `entries` (by position) deciding by `rules`, journaling to `events`.
    pub(crate) fn new(entries: &[Arc<ModelEntry>], events: Arc<Events>, rules: Rules) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let models = entries.len();
        let entries: Entries = Arc::new(RwLock::new(entries.to_vec()));
        let sink = shell::Sink { entries: Arc::clone(&entries), events };
        let pending = Mutex::new(Some(shell::Start { rx, rules, sink, models }));
        Self { tx, shared: Arc::new(Shared { entries, pending, started: OnceLock::new() }) }
    }

    /// The id the next model added will take.
    pub(crate) fn next_id(&self) -> ModelId {
        read(&self.shared.entries).len()
    }

    /// Adds `entry` (made with [`Control::next_id`] as its position, the caller adding one
    /// model at a time) for a model that joins the config, with its `lanes` and the
    /// `figures` measured before. Adds are taken in id order, before any command about the
    /// model.
    pub(crate) fn add(
        &self,
        entry: Arc<ModelEntry>,
        lanes: LaneInfo,
        figures: crate::vram::ObservedVram,
    ) {
        let mut entries = self.shared.entries.write().unwrap_or_else(PoisonError::into_inner);
        debug_assert_eq!(entry.position, entries.len(), "an entry added out of order");
        entries.push(entry);
        // Posted under the lock: the loop learns of ids in the order they were given.
        self.post(Command::Add { lanes, figures });
    }

    /// Every model the loop knows, by id (those that left the config too).
    pub(crate) fn entries(&self) -> Vec<Arc<ModelEntry>> {
        read(&self.shared.entries).clone()
    }

    /// `model` leaves the config: no load of it starts from now on. With `down_only`,
    /// only if nothing of it runs or is about to (see [`Command::Retire`]); the answer
    /// says whether it left.
    pub(crate) async fn retire(&self, model: ModelId, down_only: bool) -> bool {
        let command = |waiter| Command::Retire { model, down_only, waiter };
        self.request(Waiter::Retire, command).await.unwrap_or(!down_only)
    }

    /// Starts the loop task, once (from async code, in a Tokio runtime).
    fn start(&self) {
        self.shared.started.get_or_init(|| {
            let taken = self.shared.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(start) = taken {
                tokio::spawn(shell::run(start, self.tx.downgrade()));
            }
        });
    }

    /// Posts `command` (never blocks; a command posted after the loop ended is moot).
    pub(crate) fn post(&self, command: Command<Waiter, Apply>) {
        let _ = self.tx.send(command);
    }

    /// Posts the command `command` builds around a fresh waiter (`wrap` makes it of the
    /// right kind) and waits for the answer; `None` when the loop ended unanswered (only
    /// when the manager is gone).
    async fn request<T>(
        &self,
        wrap: impl FnOnce(oneshot::Sender<T>) -> Waiter,
        command: impl FnOnce(Waiter) -> Command<Waiter, Apply>,
    ) -> Option<T> {
        self.start();
        let (waiter, answer) = oneshot::channel();
        self.post(command(wrap(waiter)));
        answer.await.ok()
    }

    async fn ask(
        &self,
        command: impl FnOnce(Waiter) -> Command<Waiter, Apply>,
    ) -> Result<Turn, Busy> {
        self.request(Waiter::Turn, command).await.unwrap_or(Err(Busy))
    }

    /// Asks for a lease operation on `model`; a loop that ended answers `Ended`.
    pub(crate) async fn lease(
        &self,
        model: ModelId,
        command: impl FnOnce(Waiter) -> LeaseCommand<Waiter>,
    ) -> Result<Lease, LeaseRefusal> {
        let command = |waiter| Command::Lease { model, command: command(waiter) };
        self.request(Waiter::Lease, command).await.unwrap_or(Err(LeaseRefusal::Ended))
    }

    /// Waits until the loop has taken every command posted before (and published what
    /// they changed).
    pub(crate) async fn flush(&self) {
        self.request(Waiter::Flush, |waiter| Command::Flush { waiter }).await;
    }

    /// Whether `model` may load now: an `explicit` load lifts its quarantine; one on
    /// demand is refused while it is quarantined. A loop that ended lets it load.
    pub(crate) async fn may_load(&self, model: ModelId, explicit: bool) -> Result<(), Refused> {
        let wall_ms = crate::journal::unix_ms(std::time::SystemTime::now());
        let command = |waiter| Command::MayLoad { model, explicit, wall_ms, waiter };
        self.request(Waiter::MayLoad, command).await.unwrap_or(Ok(()))
    }

    /// Moves `model`'s lifecycle by `change`, with `apply` done to its slot if the loop
    /// decides the move (see `step/life.rs`); answers once the move is performed and
    /// published. The move runs to its end in the loop even if this caller goes away.
    pub(crate) async fn change(
        &self,
        model: ModelId,
        change: Change,
        apply: Apply,
    ) -> Result<Moved, Stay> {
        let command = |waiter| moving(model, change, apply, waiter);
        self.request(Waiter::Move, command).await.unwrap_or(Err(Stay::Stale))
    }

    /// Like [`Control::change`], without waiting for the answer.
    pub(crate) fn post_change(&self, model: ModelId, change: Change, apply: Apply) {
        let (waiter, _) = oneshot::channel();
        self.post(moving(model, change, apply, Waiter::Move(waiter)));
    }

    /// An unload of a GPU model expects, on each GPU it names, `held` MiB back from its
    /// `used_before`.
    pub(crate) fn released(&self, releases: Vec<GpuRelease>) {
        self.post(Command::Released { releases });
    }

    /// `model`'s runtimes, torn down after a crash, should give back `releases` (empty:
    /// nothing); GPU loads waited for this.
    pub(crate) fn torn_down(&self, model: ModelId, releases: Vec<GpuRelease>) {
        self.post(Command::TornDown { model, releases });
    }

    /// How long `model` has been idle and what for, if past a timeout with nothing keeping
    /// it (`seen`: what housekeeping saw of it).
    pub(crate) async fn idle(&self, model: ModelId, seen: IdleSeen) -> Option<IdleDue> {
        let command = |waiter| Command::Idle { model, seen, waiter };
        self.request(Waiter::Idle, command).await.flatten()
    }

    /// Records what a load of `model` was measured to take, and waits until it is
    /// published.
    pub(crate) async fn measured(&self, model: ModelId, figures: Vec<crate::vram::Figure>) {
        self.post(Command::Measured { model, figures });
        self.flush().await;
    }

    /// Whether a GPU load `on` some GPUs (empty: any) waits for a release, given each
    /// GPU's `used` memory (`None`: not read yet). A loop that ended lets it go.
    pub(crate) async fn await_release(
        &self,
        on: &[u32],
        used: Option<Vec<(u32, u64)>>,
    ) -> ReleaseAnswer {
        let on = on.to_vec();
        let command = |waiter| Command::AwaitRelease { on, used, waiter };
        self.request(Waiter::Release, command).await.unwrap_or(ReleaseAnswer::Go { settled: true })
    }

    /// Asks the grant for room for new runtimes of `model` (see `step/grant.rs`). A loop
    /// that ended grants nothing to evict.
    pub(crate) async fn grant(&self, model: ModelId, ask: GrantAsk) -> Result<Grant, Refusal> {
        let command = |waiter| Command::Grant { model, ask, waiter };
        self.request(Waiter::Grant, command).await.unwrap_or_else(|| Ok(Grant::default()))
    }

    /// Holds `model` while its runtimes are replaced (a reload, a weight update), until
    /// the guard is dropped; returns once the hold is published (a caller that goes away
    /// meanwhile gives it back).
    pub(crate) async fn replacing(&self, model: ModelId) -> Replacing {
        self.post(Command::Replacing { model });
        let guard = Replacing { control: self.clone(), model };
        self.flush().await;
        guard
    }

    /// Announces an explicit unload of `model`: no lease is granted until the returned
    /// guard ends it (dropped: without revoking the model's leases).
    pub(crate) fn unload_decided(&self, model: ModelId) -> Decided {
        self.post(Command::UnloadDecided { model });
        Decided { control: self.clone(), model, revoke: false }
    }

    /// Waits for `model`'s admin turn (at most the admin wait).
    pub(crate) async fn admin(&self, model: ModelId) -> Result<Turn, Busy> {
        self.ask(|waiter| Command::Admin { model, waiter, wait: true }).await
    }

    /// `model`'s admin turn if nothing holds it now.
    pub(crate) async fn admin_now(&self, model: ModelId) -> Result<Turn, Busy> {
        self.ask(|waiter| Command::Admin { model, waiter, wait: false }).await
    }

    /// Waits for the load lane and `model`'s runtimes, to create runtimes.
    pub(crate) async fn create(&self, model: ModelId) -> Turn {
        let turn = self.ask(|waiter| Command::Create { model, waiter }).await;
        turn.unwrap_or_else(|Busy| Turn::none(model))
    }

    /// Waits for `model`'s runtimes, to destroy runtimes.
    pub(crate) async fn destroy(&self, model: ModelId) -> Turn {
        let turn = self.ask(|waiter| Command::Destroy { model, waiter }).await;
        turn.unwrap_or_else(|Busy| Turn::none(model))
    }

    /// Waits until no request pins `model`.
    pub(crate) async fn unpinned(&self, model: ModelId) {
        let _ = self.ask(|waiter| Command::AwaitUnpinned { model, pins: 0, waiter }).await;
    }

    /// Pins `entry`'s model until the returned guard is dropped.
    pub(crate) fn pin(&self, entry: &Arc<ModelEntry>) -> Pin {
        entry.pins.fetch_add(1, Ordering::SeqCst);
        Pin { control: self.clone(), entry: Arc::clone(entry) }
    }
}

/// Every model the loop knows, by id.
type Entries = Arc<RwLock<Vec<Arc<ModelEntry>>>>;

/// Reads `entries` (a poisoned lock still holds whole entries: they are only pushed).
fn read(entries: &Entries) -> std::sync::RwLockReadGuard<'_, Vec<Arc<ModelEntry>>> {
    entries.read().unwrap_or_else(PoisonError::into_inner)
}

/// The move of `model` by `change`, dated now (for a failure it records).
fn moving(model: ModelId, change: Change, apply: Apply, waiter: Waiter) -> Command<Waiter, Apply> {
    let wall_ms = crate::journal::unix_ms(std::time::SystemTime::now());
    Command::Move { model, change, wall_ms, apply, waiter }
}

/// A granted turn; dropping it gives it back.
#[must_use = "the turn is given back when this is dropped"]
pub(crate) struct Turn {
    /// Where its end is posted; `None` for an answer that holds nothing (no request pins
    /// the model, or the loop is gone).
    tx: Option<mpsc::UnboundedSender<Command<Waiter, Apply>>>,
    model: ModelId,
    kind: TurnKind,
}

impl Turn {
    /// A turn that holds nothing.
    fn none(model: ModelId) -> Self {
        Self { tx: None, model, kind: TurnKind::Unpinned }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Command::Done { model: self.model, turn: self.kind });
        }
    }
}

/// An explicit unload decided ([`Control::unload_decided`]); ends when dropped.
pub(crate) struct Decided {
    control: Control,
    model: ModelId,
    revoke: bool,
}

impl Decided {
    /// Ends the unload; with `revoke`, the model's leases go.
    pub(crate) fn end(mut self, revoke: bool) {
        self.revoke = revoke;
    }
}

impl Drop for Decided {
    fn drop(&mut self) {
        self.control.post(Command::UnloadEnded { model: self.model, revoke: self.revoke });
    }
}

/// A model held while its runtimes are replaced ([`Control::replacing`]).
pub(crate) struct Replacing {
    control: Control,
    model: ModelId,
}

impl Drop for Replacing {
    fn drop(&mut self) {
        self.control.post(Command::Replaced { model: self.model });
    }
}

/// A request pinning its model ([`Control::pin`]).
pub(crate) struct Pin {
    control: Control,
    entry: Arc<ModelEntry>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        if self.entry.pins.fetch_sub(1, Ordering::SeqCst) == 1 {
            let model = self.entry.position;
            self.control.post(Command::Unpinned { model, pins: 0 });
        }
    }
}
