//! The control loop's state and its one decision function, [`step`]: pure and synchronous,
//! no runtime, no clock (the time comes in with each command), so its rules are tested as
//! tables and its invariants by random command sequences (`control/*_tests.rs`).
//!
//! What it decides, and where each rule lives:
//!
//! - **a model's admin turn** (here): one admin operation (load, reload, unload, weight
//!   update, pause, continue, weights check, idle unload) at a time per model, in the order
//!   asked; an operation that waited `admin_wait` is answered busy, and one that must not
//!   wait (the idle unload) is answered busy at once when the turn is taken;
//! - **the load lanes and a model's runtimes** (here and `lanes.rs`): creating runtimes
//!   takes a lane and the model's runtimes; destroying them takes the model's runtimes
//!   only. One holder of a model's runtimes at a time; creations run at once only on
//!   disjoint places; a destruction waiting goes before a creation of the same model; a
//!   creation whose model's runtimes are busy lets the creations behind it go first;
//! - **the requests pinning a model** (here): an unload waits until no request that
//!   triggered the model's load still waits for admission. The loop reads the pin count
//!   when it takes the command; the last pin to go posts [`Command::Unpinned`];
//! - **the lifecycle, the pause and the sleep** (`life.rs`): every state change, along the transition
//!   table, with the holds, the runtimes' generation and the pause;
//! - **leases** (`lease.rs`): reserved before their load, granted after it, never while an
//!   explicit unload of the model is decided, dropped when they expire or an unload
//!   revokes them;
//! - **quarantine** (`quarantine.rs`): failures recorded, loads on demand refused while a
//!   model is quarantined, explicit loads lifting it; and **never twice for nothing**
//!   (`exhaust.rs`): a load that failed after evicting everything is not retried by
//!   evicting again, nor loaded on demand, until room may have been made;
//! - **the grant** (`grant.rs`): room for new runtimes, with the loop's holds;
//! - **the idle rule** (`idle.rs`) and **the awaited GPU release** (`release.rs`); measured
//!   figures are recorded here.
//!
//! Every waiter is answered exactly once.

mod exhaust;
mod grant;
mod idle;
mod lanes;
mod lease;
mod life;
mod quarantine;
mod release;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::num::NonZeroU32;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use grant::GrantAsk;
pub(crate) use idle::{IdleAction, IdleDue, IdleSeen};
pub(crate) use lanes::{LaneInfo, Lanes};
pub(crate) use lease::{LeaseCommand, LeaseRefusal};
pub(crate) use life::{Change, LoadFailed, Moved, Stay};
pub(crate) use release::{ALL_GPUS, GpuRelease, ReleaseAnswer};

use crate::grant::{Grant, Refusal};
use crate::lease::{Held, Lease, LeaseChange};
use hangar_lifecycle::ModelState;

use crate::quarantine::{FailureLog, FailureView, QuarantineInfo, Refused};
use crate::vram::{Figure, ObservedVram};

/// The rules' settings.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// How long an admin operation waits for another on the same model.
    pub(crate) admin_wait: Duration,
    /// Live leases one model may have.
    pub(crate) max_leases: NonZeroU32,
    /// When a model that keeps failing is quarantined.
    pub(crate) quarantine: hangar_config::QuarantinePolicy,
    /// How many models of each type may be loaded at once.
    pub(crate) limits: hangar_config::MaxLoadedModels,
    /// Each model's places and type, for the load lanes (`lanes.rs`); a model not listed
    /// takes every place.
    pub(crate) lanes: Vec<LaneInfo>,
}

/// A model, by its position in config order.
pub(crate) type ModelId = usize;

/// What a granted turn holds (and what its end gives back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnKind {
    /// The model's admin turn.
    Admin,
    /// The load lane and the model's runtimes, to create runtimes.
    Create,
    /// The model's runtimes, to destroy runtimes.
    Destroy,
    /// No request pins the model: nothing is held, nothing to give back.
    Unpinned,
}

impl<W, P> Command<W, P> {
    /// The model the command names, if it names one.
    fn model(&self) -> Option<ModelId> {
        match self {
            Self::Admin { model, .. }
            | Self::Create { model, .. }
            | Self::Destroy { model, .. }
            | Self::Done { model, .. }
            | Self::AwaitUnpinned { model, .. }
            | Self::Unpinned { model, .. }
            | Self::Lease { model, .. }
            | Self::UnloadDecided { model }
            | Self::UnloadEnded { model, .. }
            | Self::MayLoad { model, .. }
            | Self::Grant { model, .. }
            | Self::Replacing { model }
            | Self::Replaced { model }
            | Self::Move { model, .. }
            | Self::Measured { model, .. }
            | Self::Idle { model, .. }
            | Self::Retire { model, .. }
            | Self::TornDown { model, .. } => Some(*model),
            Self::Flush { .. }
            | Self::Released { .. }
            | Self::AwaitRelease { .. }
            | Self::Add { .. }
            | Self::Tick => None,
        }
    }
}

impl Rules {
    /// Rules for tests: admin waits of `admin_wait`, `max_leases` a model, the default
    /// quarantine policy.
    #[cfg(test)]
    pub(crate) fn of(admin_wait: Duration, max_leases: u32) -> Self {
        let max_leases = NonZeroU32::new(max_leases).expect("at least one lease");
        Self {
            admin_wait,
            max_leases,
            quarantine: Default::default(),
            limits: Default::default(),
            lanes: Vec::new(),
        }
    }
}

/// A change asked of the loop; `W` answers the one who asked, `P` is what a lifecycle move
/// does to the model's slot (opaque here).
#[derive(Debug, Clone)]
pub(crate) enum Command<W, P = ()> {
    /// An admin operation asks for the model's turn; with `wait` false it is answered busy
    /// at once when the turn is taken.
    Admin { model: ModelId, waiter: W, wait: bool },
    /// A creation asks for the lane and the model's runtimes.
    Create { model: ModelId, waiter: W },
    /// A destruction asks for the model's runtimes.
    Destroy { model: ModelId, waiter: W },
    /// A granted turn ended (its holder finished, went away, or was never reached).
    Done { model: ModelId, turn: TurnKind },
    /// Waits until no request pins the model; `pins` as the loop read them.
    AwaitUnpinned { model: ModelId, pins: u32, waiter: W },
    /// A pin went; `pins` as the loop read them.
    Unpinned { model: ModelId, pins: u32 },
    /// A lease operation.
    Lease { model: ModelId, command: LeaseCommand<W> },
    /// An explicit unload of the model is decided: no lease is granted until it ends.
    UnloadDecided { model: ModelId },
    /// An explicit unload decided earlier ended; with `revoke`, the model's leases go.
    UnloadEnded { model: ModelId, revoke: bool },
    /// May the model load now? An `explicit` load lifts its quarantine; one on demand is
    /// refused while it is quarantined.
    MayLoad { model: ModelId, explicit: bool, wall_ms: u64, waiter: W },
    /// Answered at once: every command posted before it has been taken.
    Flush { waiter: W },
    /// An unload of a GPU model expects, on each GPU it names, `held` MiB back from its
    /// `used_before` (`release.rs`).
    Released { releases: Vec<GpuRelease> },
    /// The model's runtimes, torn down after a crash, should give back `releases` (empty:
    /// nothing to wait for); see `release.rs`.
    TornDown { model: ModelId, releases: Vec<GpuRelease> },
    /// A load of the model was measured: these figures replace the ones of the same replica
    /// count, method and override.
    Measured { model: ModelId, figures: Vec<Figure> },
    /// A load on the GPUs `on` (empty: any) asks whether to wait for a release there, with
    /// each GPU's used memory and their sum under [`ALL_GPUS`] (`None`: not read yet).
    AwaitRelease { on: Vec<u32>, used: Option<Vec<(u32, u64)>>, waiter: W },
    /// Move the model's lifecycle (`life.rs`); `apply` is performed if the move is decided,
    /// `wall_ms` dates a failure it records.
    Move { model: ModelId, change: Change, wall_ms: u64, apply: P, waiter: W },
    /// Room for new runtimes of the model: the evictions to make, or a refusal.
    Grant { model: ModelId, ask: GrantAsk, waiter: W },
    /// A reload or weight update begins replacing the model's runtimes: it is held.
    Replacing { model: ModelId },
    /// One that began ends.
    Replaced { model: ModelId },
    /// Is the model idle past its timeout? `seen`: what housekeeping saw of it.
    Idle { model: ModelId, seen: IdleSeen, waiter: W },
    /// A model joins (a config reload): it takes the next id, nothing held, with `lanes`
    /// and the `figures` measured before (the state file).
    Add { lanes: LaneInfo, figures: ObservedVram },
    /// The model leaves the config (removed, or replaced by a changed definition): from now
    /// on no load of it may start ([`Command::MayLoad`] answers
    /// [`Refused::Removed`]). With `down_only`, only if nothing of it runs or is about to:
    /// unloaded or failed, no admin operation, no runtimes being created or destroyed. The
    /// answer says whether it left.
    Retire { model: ModelId, down_only: bool, waiter: W },
    /// Time passed: admin waits past their deadline are answered busy, leases past theirs
    /// are dropped.
    Tick,
}

/// What the loop does after a step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Effect<W, P = ()> {
    /// The waiter's turn: it holds `turn` on `model` until it posts [`Command::Done`].
    Grant { model: ModelId, turn: TurnKind, waiter: W },
    /// The waiter's admin operation gets no turn: another operation holds the model.
    Busy { model: ModelId, waiter: W },
    /// The answer to a lease operation.
    Lease { model: ModelId, waiter: W, answer: Result<Lease, LeaseRefusal> },
    /// The model's leases changed: these are all of them now (published before any
    /// answer of the same step).
    Leases { model: ModelId, held: Vec<Held> },
    /// A lease changed (for the journal).
    LeaseChanged { model: ModelId, change: LeaseChange, lease: Lease },
    /// The answer to [`Command::Flush`].
    Flushed { waiter: W },
    /// The answer to [`Command::Idle`]: how long the model has been idle, if past its
    /// timeout with nothing keeping it.
    Idle { model: ModelId, waiter: W, answer: Option<IdleDue> },
    /// The answer to [`Command::AwaitRelease`].
    Release { waiter: W, answer: ReleaseAnswer },
    /// The model's measured figures now (published).
    Figures { model: ModelId, vram: ObservedVram },
    /// A move decided: perform `apply`, publish the lifecycle, journal it, then answer.
    Moved { model: ModelId, moved: Moved, apply: P, waiter: W },
    /// A move refused: nothing changed.
    Stays { model: ModelId, waiter: W, why: Stay },
    /// The answer to [`Command::Grant`]: the plan to execute, or why not.
    Granted { model: ModelId, waiter: W, answer: Result<Grant, Refusal> },
    /// Operations replacing the model's runtimes now (published).
    Replacing { model: ModelId, count: u32 },
    /// The answer to [`Command::Retire`]: whether the model left.
    Retired { model: ModelId, waiter: W, retired: bool },
    /// The answer to [`Command::MayLoad`].
    MayLoad { model: ModelId, waiter: W, answer: Result<(), Refused> },
    /// The model's failures changed: what readers see of them now.
    Failures { model: ModelId, view: FailureView },
    /// A failure began a quarantine (for the journal).
    Quarantined { model: ModelId, quarantine: QuarantineInfo },
    /// An explicit load lifted the model's quarantine (for the journal).
    QuarantineLifted { model: ModelId },
}

/// Everything the loop owns.
#[derive(Debug)]
pub(crate) struct State<W> {
    models: Vec<Model<W>>,
    /// The models whose creations hold a lane (`lanes.rs`), in the order granted.
    lane: Vec<ModelId>,
    /// Creations waiting for the lane, in the order asked.
    creations: VecDeque<(ModelId, W)>,
    /// The deadline of every admin wait queued, in the order queued (so earliest first,
    /// as every wait is equally long); some may have been granted since. A step costs
    /// the same whatever the number of models.
    deadlines: VecDeque<(Instant, ModelId)>,
    rules: Rules,
    /// The memory the last unloads should give back, by GPU, where it has not shown yet.
    release: release::Releases,
    /// The teardowns after a crash not done yet.
    tearing: release::Teardowns,
    /// How many times room may have been made (`exhaust.rs`).
    frees: u64,
    /// Leases taken so far (numbers their ids).
    next_lease: u64,
    /// When a model's lease may expire, earliest first; a renewal leaves its old deadline
    /// here, which then expires nothing.
    lease_deadlines: BinaryHeap<Reverse<(Instant, ModelId)>>,
}

#[derive(Debug)]
struct Model<W> {
    admin: bool,
    /// Admin operations waiting, with their deadline.
    admin_queue: VecDeque<(Instant, W)>,
    runtimes: Option<TurnKind>,
    destroys: VecDeque<W>,
    pin_waiters: Vec<W>,
    leases: lease::Book,
    failures: FailureLog,
    /// Reloads and weight updates replacing its runtimes.
    replacing: u32,
    life: life::Life,
    /// What its loads were measured to take.
    figures: ObservedVram,
    /// It left the config: no load of it starts again.
    retired: bool,
    /// The count of frees when its last load failed after evicting everything, and that
    /// load's error (`exhaust.rs`).
    exhausted: Option<(u64, String)>,
}

impl<W> Model<W> {
    fn new() -> Self {
        Self {
            admin: false,
            admin_queue: VecDeque::new(),
            runtimes: None,
            destroys: VecDeque::new(),
            pin_waiters: Vec::new(),
            leases: lease::Book::default(),
            failures: FailureLog::default(),
            replacing: 0,
            life: life::Life::default(),
            figures: ObservedVram::default(),
            retired: false,
            exhausted: None,
        }
    }
}

impl<W> State<W> {
    /// `models` models, nothing held, no lease, no failure.
    pub(crate) fn new(models: usize, rules: Rules) -> Self {
        Self {
            models: (0..models).map(|_| Model::new()).collect(),
            lane: Vec::new(),
            creations: VecDeque::new(),
            deadlines: VecDeque::new(),
            rules,
            release: Default::default(),
            tearing: Default::default(),
            frees: 0,
            next_lease: 0,
            lease_deadlines: BinaryHeap::new(),
        }
    }

    /// Starts `model` with the figures measured before (the state file).
    pub(crate) fn restore_figures(&mut self, model: ModelId, figures: ObservedVram) {
        if let Some(m) = self.models.get_mut(model) {
            m.figures = figures;
        }
    }

    /// When the next admin wait or lease may run out, if any (a wait granted or a lease
    /// renewed meanwhile makes it a `Tick` that changes nothing).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let admin = self.deadlines.front().map(|(at, _)| *at);
        let lease = self.lease_deadlines.peek().map(|Reverse((at, _))| *at);
        admin.into_iter().chain(lease).min()
    }

    /// `model`'s state as the loop decided it.
    #[cfg(test)]
    pub(crate) fn lifecycle(&self, model: ModelId) -> hangar_lifecycle::ModelState {
        self.models[model].life.state()
    }

    /// How deeply `model`'s runtimes sleep, as the loop decided it.
    #[cfg(test)]
    pub(crate) fn asleep(&self, model: ModelId) -> Option<hangar_backend::SleepLevel> {
        self.models[model].life.asleep()
    }

    /// Whether the loop holds `model` at `now` (a live or reserved lease, a replacement).
    #[cfg(test)]
    pub(crate) fn held(&self, model: ModelId, now: Instant) -> bool {
        grant::held(self, model, now)
    }

    /// `model`'s leases, reserved or granted.
    #[cfg(test)]
    pub(crate) fn leases(&self, model: ModelId) -> &[Held] {
        self.models[model].leases.held()
    }

    /// The models whose creations hold a lane.
    #[cfg(test)]
    pub(crate) fn lane(&self) -> &[ModelId] {
        &self.lane
    }

    /// Who holds `model`'s runtimes.
    #[cfg(test)]
    pub(crate) fn runtimes(&self, model: ModelId) -> Option<TurnKind> {
        self.models[model].runtimes
    }

    /// Whether `model`'s admin turn is held.
    #[cfg(test)]
    pub(crate) fn admin_held(&self, model: ModelId) -> bool {
        self.models[model].admin
    }

    /// Waiters not answered yet: admin, creation, destruction and pin waits.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.creations.len()
            + self
                .models
                .iter()
                .map(|m| m.admin_queue.len() + m.destroys.len() + m.pin_waiters.len())
                .sum::<usize>()
    }
}

/// Decides what `command` changes and what the loop does about it. A command naming a model
/// that does not exist changes nothing.
pub(crate) fn step<W, P>(
    state: &mut State<W>,
    command: Command<W, P>,
    now: Instant,
) -> Vec<Effect<W, P>> {
    let mut effects = Vec::new();
    if command.model().is_some_and(|model| model >= state.models.len()) {
        return effects;
    }
    match command {
        Command::Admin { model, waiter, wait } => {
            let m = &mut state.models[model];
            if !m.admin {
                m.admin = true;
                effects.push(Effect::Grant { model, turn: TurnKind::Admin, waiter });
            } else if wait {
                let deadline = now + state.rules.admin_wait;
                m.admin_queue.push_back((deadline, waiter));
                state.deadlines.push_back((deadline, model));
            } else {
                effects.push(Effect::Busy { model, waiter });
            }
        }
        Command::Create { model, waiter } => {
            state.creations.push_back((model, waiter));
            lanes::open(state, &mut effects);
        }
        Command::Destroy { model, waiter } => {
            state.models[model].destroys.push_back(waiter);
            free_runtimes(state, model, &mut effects);
        }
        Command::Done { model, turn } => match turn {
            TurnKind::Admin => {
                let m = &mut state.models[model];
                m.admin = false;
                expire(m, model, now, &mut effects);
                if let Some((_, waiter)) = m.admin_queue.pop_front() {
                    m.admin = true;
                    effects.push(Effect::Grant { model, turn: TurnKind::Admin, waiter });
                }
            }
            TurnKind::Create | TurnKind::Destroy => {
                if state.models[model].runtimes != Some(turn) {
                    return effects;
                }
                state.models[model].runtimes = None;
                // Only a lane's holder creates: its end frees its lane.
                if turn == TurnKind::Create {
                    state.lane.retain(|&m| m != model);
                }
                free_runtimes(state, model, &mut effects);
                lanes::open(state, &mut effects);
            }
            TurnKind::Unpinned => {}
        },
        Command::AwaitUnpinned { model, pins, waiter } => {
            if pins == 0 {
                effects.push(Effect::Grant { model, turn: TurnKind::Unpinned, waiter });
            } else {
                state.models[model].pin_waiters.push(waiter);
            }
        }
        Command::Unpinned { model, pins } => {
            if pins == 0 {
                for waiter in state.models[model].pin_waiters.drain(..) {
                    effects.push(Effect::Grant { model, turn: TurnKind::Unpinned, waiter });
                }
            }
        }
        Command::Lease { model, command } => {
            lease::lease(state, model, command, now, &mut effects);
        }
        Command::UnloadDecided { model } => lease::unload_decided(state, model),
        Command::UnloadEnded { model, revoke } => {
            lease::unload_ended(state, model, revoke, &mut effects);
        }
        Command::Flush { waiter } => effects.push(Effect::Flushed { waiter }),
        Command::Measured { model, figures } => {
            let vram = &mut state.models[model].figures;
            for figure in figures {
                vram.record(figure);
            }
            effects.push(Effect::Figures { model, vram: vram.clone() });
        }
        Command::Idle { model, seen, waiter } => {
            idle::idle(state, model, &seen, waiter, now, &mut effects);
        }
        Command::Released { releases } => release::released(state, releases, now),
        Command::TornDown { model, releases } => {
            release::torn_down(state, model, releases, now);
        }
        Command::AwaitRelease { on, used, waiter } => {
            let asked = (on.as_slice(), used.as_deref());
            release::await_release(state, asked, waiter, now, &mut effects);
        }
        Command::Grant { model, ask, waiter } => {
            grant::grant(state, model, ask, waiter, now, &mut effects);
        }
        Command::Move { model, change, wall_ms, apply, waiter } => {
            life::change(state, model, (change, wall_ms, apply, waiter), now, &mut effects);
        }
        Command::Replacing { model } => grant::replacing(state, model, true, &mut effects),
        Command::Replaced { model } => grant::replacing(state, model, false, &mut effects),
        Command::MayLoad { model, explicit, wall_ms, waiter } => {
            quarantine::may_load(state, model, (explicit, wall_ms), waiter, now, &mut effects);
        }
        Command::Add { lanes, figures } => {
            // Rules given for fewer models (tests) leave the rest every place.
            state.rules.lanes.resize(state.models.len(), LaneInfo::default());
            state.rules.lanes.push(lanes);
            state.models.push(Model { figures, ..Model::new() });
            exhaust::freed(state);
        }
        Command::Retire { model, down_only, waiter } => {
            let down = {
                let m = &state.models[model];
                let life = m.life.state();
                !m.admin
                    && m.runtimes.is_none()
                    && !state.creations.iter().any(|(c, _)| *c == model)
                    && matches!(life, ModelState::Unloaded | ModelState::Failed)
            };
            let retired = !down_only || down;
            state.models[model].retired |= retired;
            if retired {
                exhaust::freed(state);
            }
            effects.push(Effect::Retired { model, waiter, retired });
        }
        Command::Tick => {
            while let Some(&(at, model)) = state.deadlines.front()
                && at <= now
            {
                state.deadlines.pop_front();
                expire(&mut state.models[model], model, now, &mut effects);
            }
            lease::expire(state, now, &mut effects);
        }
    }
    effects
}

/// Answers busy every admin wait of `m` whose deadline has come.
fn expire<W, P>(m: &mut Model<W>, model: ModelId, now: Instant, effects: &mut Vec<Effect<W, P>>) {
    // Deadlines are in the order asked: the expired ones are at the front.
    while m.admin_queue.front().is_some_and(|(at, _)| *at <= now) {
        if let Some((_, waiter)) = m.admin_queue.pop_front() {
            effects.push(Effect::Busy { model, waiter });
        }
    }
}

/// Gives `model`'s free runtimes to its first waiting destruction.
fn free_runtimes<W, P>(state: &mut State<W>, model: ModelId, effects: &mut Vec<Effect<W, P>>) {
    let m = &mut state.models[model];
    if m.runtimes.is_none()
        && let Some(waiter) = m.destroys.pop_front()
    {
        m.runtimes = Some(TurnKind::Destroy);
        effects.push(Effect::Grant { model, turn: TurnKind::Destroy, waiter });
    }
}
